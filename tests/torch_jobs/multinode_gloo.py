"""A multi-node torchrun job on gloo (CPU): the worked example of docs/job-spec.md "Multi-node".

A tiny MLP under DistributedDataParallel, trained with AdamW on data drawn from
(seed, step, rank) alone, with no dropout: a run resumed from any checkpoint ends
with the same bytes in every parameter as an uninterrupted run of the same world
size. Global rank 0 prints `final-params-sha256: <hex>` and writes it to
`final-params.sha256` in the working directory (or --out).

    torchrun --nnodes=$SPOTRUN_NNODES --nproc-per-node=$SPOTRUN_GPUS --rdzv-backend=c10d \\
        --rdzv-endpoint=$SPOTRUN_RDZV_ENDPOINT --rdzv-id=$SPOTRUN_RDZV_ID \\
        multinode_gloo.py --steps 40

Test hooks: --hold-at N stops every rank at step N inside `ckpt.safe()` (an
evaluation that lasts as long as the test wants), each rank leaving HOLD_DIR/held-<rank>
(holding the world size), until HOLD_DIR/release exists; --hold-also M[,K] holds again at
M with HOLD_DIR/held-M-<rank> and HOLD_DIR/release-M.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import threading
from datetime import timedelta
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Sizes and test hooks."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=int(os.environ.get("SPOTRUN_TOTAL_STEPS") or 40))
    p.add_argument("--every", type=int, default=5, help="checkpoint every N steps")
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--sharded", action="store_true", help="torch.distributed.checkpoint layout")
    p.add_argument("--timeout-s", type=float, default=60.0, help="gloo collective timeout")
    p.add_argument("--out", default=None, help="folder for final-params.sha256 (default: cwd)")
    p.add_argument("--hold-at", type=int, default=0)
    p.add_argument("--hold-also", default="", help="more steps to hold at, comma-separated")
    p.add_argument("--hold-dir", default=None)
    return p.parse_args(argv)


def params_sha256(module) -> str:
    """SHA256 over every parameter's bytes, in order."""
    h = hashlib.sha256()
    for p in module.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    """Train, checkpointing through spotrun.torch; print the final parameters' SHA256."""
    args = parse_args(argv)
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from spotrun.torch import Checkpointer, SaveOptions

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
    opt = torch.optim.AdamW(model.parameters(), lr=0.02)
    ckpt = Checkpointer(model=model, optimizer=opt, every_steps=args.every,
                        save=SaveOptions(sharded=args.sharded))
    step = ckpt.restore()
    print(f"rank {rank}/{world} node {os.environ.get('SPOTRUN_NODE_RANK', '?')} "
          f"start step {step}", flush=True)

    def batch(step: int):
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 101 + rank)
        x = torch.randn(16, 8, generator=g)
        return x, x.sum(dim=1, keepdim=True).sin()

    def evaluate() -> float:
        with torch.no_grad():
            x, y = batch(10_000_000)
            return float(((model.module(x) - y) ** 2).mean())

    pause = threading.Event()

    def hold(marker: Path, release: Path) -> None:
        ckpt.wait()   # the last checkpoint is whole before the test acts
        with ckpt.safe():
            evaluate()
            marker.write_text(f"{world}\n")
            while not release.exists():
                evaluate()
                pause.wait(0.02)

    also = {int(h) for h in args.hold_also.split(",") if h.strip()}
    while step < args.steps:
        release = Path(args.hold_dir or ".", "release")
        if args.hold_at and step == args.hold_at and not release.exists():
            hold(Path(args.hold_dir, f"held-{rank}"), release)
        elif step in also and not Path(args.hold_dir, f"release-{step}").exists():
            hold(Path(args.hold_dir, f"held-{step}-{rank}"), Path(args.hold_dir, f"release-{step}"))
        x, y = batch(step)
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        ckpt.step(step)
    ckpt.finish(step)
    if rank == 0:
        sha = params_sha256(model.module)
        print(f"final-params-sha256: {sha}", flush=True)
        Path(args.out or ".", "final-params.sha256").write_text(sha + "\n")
    ckpt.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
