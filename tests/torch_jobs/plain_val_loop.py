"""A plain training loop, patched only as docs/checkpointing.md says, with a slow validation after it.

Written the way a user writes a first loop (nothing here knows spotrun's internals):
a small MLP regression with BatchNorm, a shuffled training DataLoader with its own
generator, `Checkpointer(..., every_steps=40)` and `ckpt.step(step + 1)` after each
optimizer step, the training loss logged every 10 steps from a forward after the update
(the model still in train mode, as loops often leave it); then, once training is done,
a validation pass in eval mode that never calls the library (each batch made slow
by a sleep, about 45 s in all by default). Prints `trained-steps: N` when the
training loop ends, `validation-started` when the validation begins,
`validation-batch: K` after each validation batch, and `final-params-sha256: <hex>`
at the very end.

    python tests/torch_jobs/plain_val_loop.py --steps 100 --val-batches 30 --val-sleep-s 1.5
"""

from __future__ import annotations

import argparse
import hashlib
import time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Sizes, and how slow the validation is."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--every-steps", type=int, default=40)
    p.add_argument("--val-batches", type=int, default=30)
    p.add_argument("--val-sleep-s", type=float, default=1.5, help="sleep per validation batch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=10, help="log the training loss every N steps")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Train, validate slowly, save the final state."""
    args = parse_args(argv)
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from spotrun.torch import Checkpointer

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(512, 16, generator=g)
    y = x @ torch.randn(16, 1, generator=g) + 0.1 * torch.randn(512, 1, generator=g)
    train_loader = DataLoader(TensorDataset(x[:384], y[:384]), batch_size=16, shuffle=True,
                              generator=torch.Generator().manual_seed(args.seed))
    val_loader = DataLoader(TensorDataset(x[384:], y[384:]), batch_size=4)

    model = nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.1),
                          nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.MSELoss()

    ckpt = Checkpointer(model=model, optimizer=optimizer, every_steps=args.every_steps,
                        total_steps=args.steps)
    start = ckpt.restore()
    print(f"resumed-at: {start}", flush=True)

    per_epoch = len(train_loader)
    step = start
    model.train()
    while step < args.steps:
        # The data position from the step counter: skip the batches of this epoch already done.
        for i, (xb, yb) in enumerate(train_loader):
            if step // per_epoch * per_epoch + i < step:
                continue
            loss = loss_fn(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            ckpt.step(step + 1)
            step += 1
            if step % args.log_every == 0:
                # The loss after the update, for the log: the model is still in train mode.
                with torch.no_grad():
                    print(f"step {step} train-loss {loss_fn(model(xb), yb).item():.6f}",
                          flush=True)
            if step >= args.steps:
                break
    print(f"trained-steps: {step}", flush=True)

    model.eval()
    print("validation-started", flush=True)
    total, n = 0.0, 0
    with torch.no_grad():
        for i, (xb, yb) in enumerate(val_loader):
            if i >= args.val_batches:
                break
            total += loss_fn(model(xb), yb).item()
            n += 1
            time.sleep(args.val_sleep_s)   # a slow metric, a remote evaluator...
            print(f"validation-batch: {n}", flush=True)
    print(f"val-loss: {total / max(n, 1):.6f}", flush=True)

    ckpt.finish(step)
    ckpt.close()
    digest = hashlib.sha256()
    for name, value in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(value.detach().cpu().contiguous().numpy().tobytes())
    print(f"final-params-sha256: {digest.hexdigest()}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
