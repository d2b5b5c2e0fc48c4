"""A plain loop with carried state, ported to spotrun (the porting guide's example, runnable).

A tiny GRU language model trained with truncated back-propagation on a
synthetic token stream: the hidden state is carried from batch to batch, the
learning rate follows a manual schedule halved when validation does not
improve, and validation runs every `--val-every` steps. Everything the loop
carries between steps is in `extras`; the data position is derived from the
step counter. Prints `final-params-sha256: <hex>` at the end.

    python tests/torch_jobs/carried_state.py --steps 60
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Sizes and test hooks."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--val-every", type=int, default=20)
    p.add_argument("--val-batches", type=int, default=8)
    p.add_argument("--seq", type=int, default=16, help="tokens per truncated-BPTT chunk")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--chunks", type=int, default=25, help="chunks per epoch")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--hold-dir", default=None,
                   help="test hook: at validation of --hold-at, mark it and keep validating "
                        "until HOLD_DIR/release exists (a validation longer than any window)")
    p.add_argument("--hold-at", type=int, default=20)
    p.add_argument("--wait-file", default=None,
                   help="test hook: print 'ready' and wait for this file before importing torch")
    return p.parse_args(argv)


def _wait_for(path: Path) -> None:
    pause = threading.Event()
    while not path.exists():
        pause.wait(0.01)


def main(argv: list[str] | None = None) -> int:
    """Train with spotrun checkpoints; print the final parameters' SHA256."""
    args = parse_args(argv)
    if args.wait_file:
        print("ready", flush=True)
        _wait_for(Path(args.wait_file))
    import hashlib

    import torch
    from torch import nn

    from spotrun.torch import Checkpointer

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    vocab, hidden = 16, 32
    g = torch.Generator().manual_seed(args.seed)
    stream = torch.randint(0, vocab, (args.batch, args.chunks * args.seq + 1), generator=g)
    val = torch.randint(0, vocab, (args.val_batches, args.batch, args.seq + 1), generator=g)

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(vocab, 16)
            self.drop = nn.Dropout(0.1)
            self.rnn = nn.GRU(16, hidden, batch_first=True)
            self.out = nn.Linear(hidden, vocab)

        def forward(self, x, h):
            y, h = self.rnn(self.drop(self.emb(x)), h)
            return self.out(y), h

    model = LM()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loss_fn = nn.CrossEntropyLoss()
    # Everything carried from one step to the next, so a resume continues it exactly.
    extras = {"hidden": torch.zeros(1, args.batch, hidden), "lr": 0.5,
              "best_val": float("inf"), "bad_vals": 0}
    ckpt = Checkpointer(model=model, optimizer=opt, extras=extras, interval_s=1e9)
    step = ckpt.restore()
    print(f"start step {step}", flush=True)

    def validate() -> float:
        model.eval()
        total = 0.0
        with torch.no_grad():
            for b in range(args.val_batches):
                x, y = val[b, :, :-1], val[b, :, 1:]
                logits, _ = model(x, None)
                total += loss_fn(logits.reshape(-1, vocab), y.reshape(-1)).item()
        model.train()
        return total / args.val_batches

    def hold(step: int) -> None:
        # Test hook: stay in evaluation (real forward passes) until released.
        Path(args.hold_dir, f"validating-{step}").write_text("")
        model.eval()
        with torch.no_grad():
            while not Path(args.hold_dir, "release").exists():
                model(val[0, :, :-1], None)
        model.train()

    model.train()
    while step < args.steps:
        # Validation belongs to the boundary *before* the next step: a resume at
        # this step runs it again, so decisions made from it are made again.
        if step > 0 and step % args.val_every == 0:
            v = validate()
            if args.hold_dir and step == args.hold_at:
                hold(step)
            if v < extras["best_val"]:
                extras["best_val"], extras["bad_vals"] = v, 0
            else:
                extras["bad_vals"] += 1
                extras["lr"] *= 0.5
            print(f"step {step} val {v:.4f} lr {extras['lr']:.4f}", flush=True)
        chunk = step % args.chunks           # data position: from the step counter alone
        if chunk == 0:
            extras["hidden"] = torch.zeros(1, args.batch, hidden)
        x = stream[:, chunk * args.seq:(chunk + 1) * args.seq]
        y = stream[:, chunk * args.seq + 1:(chunk + 1) * args.seq + 1]
        for group in opt.param_groups:       # the manual schedule
            group["lr"] = extras["lr"] * (1.0 - 0.5 * step / args.steps)
        logits, h = model(x, extras["hidden"])
        loss = loss_fn(logits.reshape(-1, vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        extras["hidden"] = h.detach()        # rebind, never modify in place
        step += 1
        ckpt.step(step)
    ckpt.finish(step)
    ckpt.close()
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    print(f"final-params-sha256: {h.hexdigest()}", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
