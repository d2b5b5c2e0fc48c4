"""What `ckpt.step(n)` costs a training loop, with the any-loop change watch (issue 40) and without.

The watch takes every state tensor's version counter at each step boundary so that a save
from the watchdog can prove the state is still that step's (spotrun/torch/watch.py). This
bench times `ckpt.step(n)` (no save due) in one process, side by side: the Checkpointer as
shipped (candidate) and the same Checkpointer with its watch removed (peer: what the step
cost before), on a ResNet-18-sized state (62 parameter tensors, 60 BatchNorm buffers, SGD
momentum), and prints each median and the ratio.

    .venv/bin/python bench/step_overhead.py [--steps 400] [--blocks 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time


def main() -> None:
    """Time ck.step with and without the watch, interleaved, and print the medians."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--blocks", type=int, default=20, help="conv+BN blocks (3 tensors + 3 buffers each)")
    args = p.parse_args()
    import torch
    from torch import nn

    from spotrun.store.file import FileStore
    from spotrun.torch import Checkpointer, RuntimeOptions

    torch.manual_seed(0)
    torch.set_num_threads(1)
    layers: list[nn.Module] = []
    for _ in range(args.blocks):
        layers += [nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Flatten(), nn.Linear(8 * 4 * 4, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(4, 8, 4, 4), torch.randint(10, (4,))
    results = {}
    with tempfile.TemporaryDirectory() as d:
        quiet = RuntimeOptions(env={}, install_signal=False)
        cks = {"candidate": Checkpointer(model=model, optimizer=opt, store=FileStore(f"{d}/a"),
                                         runtime=quiet, interval_s=1e9),
               "peer": Checkpointer(model=model, optimizer=opt, store=FileStore(f"{d}/b"),
                                    runtime=quiet, interval_s=1e9)}
        cks["peer"].watch = None
        times: dict[str, list[float]] = {k: [] for k in cks}
        for n in range(1, args.steps + 1):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            order = list(cks.items())
            for name, ck in (order if n % 2 else order[::-1]):   # same state; who goes first alternates
                t0 = time.perf_counter()
                ck.step(n)
                times[name].append(time.perf_counter() - t0)
        for ck in cks.values():
            ck.close()
        tensors = sum(1 for _ in model.parameters()) + sum(1 for _ in model.buffers())
        for name, ts in times.items():
            results[name] = statistics.median(ts[20:]) * 1e6
    print(f"state: {tensors} model tensors + {len(opt.state)} momentum buffers")
    print(f"ckpt.step median: candidate (with watch) {results['candidate']:.0f} us, "
          f"peer (without) {results['peer']:.0f} us, ratio {results['candidate'] / results['peer']:.2f}")


if __name__ == "__main__":
    main()
