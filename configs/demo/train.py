"""The demo job: a small real PyTorch MLP, trained deterministically on CPU with spotrun checkpoints.

Data come from a fixed seed (no downloads). Every source of randomness a real
job has is used on purpose (shuffled sampler, dropout = torch RNG, noise =
numpy RNG, random scaling = python RNG), so an exact resume after a reclaim
is a real test: the final line, `final-params-sha256: <hex>`, is the same
whether or not the run was interrupted.

    python configs/demo/train.py --steps 2000            # ~50 s on one core
    SPOTRUN_CHECKPOINT_URI=file:///tmp/ck python configs/demo/train.py --steps 50 --hidden 32
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from spotrun.torch import Checkpointer, RuntimeOptions, SaveOptions, StatefulSampler


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Sizes, steps and checkpoint knobs; tests use tiny sizes."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=int(os.environ.get("SPOTRUN_TOTAL_STEPS") or 2000))
    p.add_argument("--hidden", type=int, default=512, help="width of the hidden layers")
    p.add_argument("--layers", type=int, default=3, help="number of hidden layers")
    p.add_argument("--inputs", type=int, default=64)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--samples", type=int, default=8192, help="size of the synthetic data set")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--checkpoint-uri", default=None,
                   help="default: $SPOTRUN_CHECKPOINT_URI, else ./checkpoints")
    p.add_argument("--checkpoint-every-steps", type=int, default=None)
    p.add_argument("--progress-interval-s", type=float, default=1.0)
    p.add_argument("--sync-save", action="store_true", help="persist in the training thread")
    p.add_argument("--metrics", default=None,
                   help="append a 'step,loss' row to this CSV every --metrics-every steps (an "
                        "append-only log: spotrun persists it with each checkpoint)")
    p.add_argument("--metrics-every", type=int, default=10)
    p.add_argument("--min-step-s", type=float, default=0.0,
                   help="wall seconds a step takes at least (the demo: a fast machine still "
                        "trains long enough to meet its reclaims)")
    return p.parse_args(argv)


def make_data(args: argparse.Namespace) -> TensorDataset:
    """A synthetic classification set from a fixed teacher network."""
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.samples, args.inputs, generator=g)
    teacher = torch.randn(args.inputs, args.classes, generator=g)
    y = (x @ teacher + 0.5 * torch.randn(args.samples, args.classes, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


def make_model(args: argparse.Namespace) -> nn.Module:
    """An MLP with LayerNorm and dropout (so the torch RNG matters)."""
    layers: list[nn.Module] = []
    width = args.inputs
    for _ in range(args.layers):
        layers += [nn.Linear(width, args.hidden), nn.LayerNorm(args.hidden), nn.GELU(),
                   nn.Dropout(0.1)]
        width = args.hidden
    layers.append(nn.Linear(width, args.classes))
    return nn.Sequential(*layers)


def batches(loader: DataLoader):
    """Endless batches; the sampler moves to the next epoch by itself."""
    while True:
        yield from loader


def params_sha256(model: nn.Module) -> str:
    """SHA256 over every parameter and buffer, in state-dict order."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def append_metrics(path: Path, step: int, loss: float) -> None:
    """One row of the metrics log, appended (the header with the first row)."""
    new = not path.exists()
    with open(path, "a") as f:
        if new:
            f.write("step,loss\n")
        f.write(f"{step},{loss:.6f}\n")


def main(argv: list[str] | None = None) -> int:
    """Train, checkpointing through spotrun; print the final parameters' SHA256."""
    args = parse_args(argv)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    data = make_data(args)
    sampler = StatefulSampler(len(data), seed=args.seed)
    # Its own generator: every new DataLoader iterator draws a seed, and drawing it
    # from the global RNG would shift dropout after a mid-epoch resume.
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler, drop_last=True,
                        generator=torch.Generator().manual_seed(args.seed))
    model = make_model(args)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.steps)

    uri = (args.checkpoint_uri or os.environ.get("SPOTRUN_CHECKPOINT_URI")
           or (Path.cwd() / "checkpoints").as_uri())
    ckpt = Checkpointer(model=model, optimizer=opt, scheduler=sched, extras={"sampler": sampler},
                        uri=uri, total_steps=args.steps, every_steps=args.checkpoint_every_steps,
                        save=SaveOptions(async_save=not args.sync_save),
                        runtime=RuntimeOptions(progress_interval_s=args.progress_interval_s))
    start = ckpt.restore()
    print(f"start step {start}/{args.steps} (checkpoints: {uri})", flush=True)

    loss_fn = nn.CrossEntropyLoss()
    it = batches(loader)
    model.train()
    for step in range(start, args.steps):
        began = time.monotonic()
        x, y = next(it)
        x = x + torch.from_numpy(np.random.normal(0.0, 0.05, size=x.shape).astype(np.float32))
        x = x * (0.9 + 0.2 * random.random())
        loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if args.metrics and (step + 1) % args.metrics_every == 0:
            append_metrics(Path(args.metrics), step + 1, loss.item())
        if (step + 1) % args.log_every == 0:
            print(f"step {step + 1}/{args.steps} loss {loss.item():.4f} "
                  f"lr {sched.get_last_lr()[0]:.2e}", flush=True)
        ckpt.step(step + 1)
        rest = args.min_step_s - (time.monotonic() - began)
        if rest > 0:
            time.sleep(rest)   # the demo's floor on step time; no effect on the numbers
    ckpt.finish(args.steps)
    ckpt.close()
    print(f"final-params-sha256: {params_sha256(model)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
