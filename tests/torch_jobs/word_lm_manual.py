"""A word-level language model trained the way pytorch/examples' word_language_model does it.

Its shape, kept as that script has it: `batchify` into columns, `get_batch` over truncated
BPTT windows, `repackage_hidden` between windows, an LSTM `RNNModel`, gradient clipping and
**weights updated by hand** (`p.data.add_(p.grad, alpha=-lr)`, no `torch.optim`), the
learning rate divided by 4 when the validation loss does not improve, validation with
`model.eval()` and `torch.no_grad()` after each epoch. Patched only as docs/checkpointing.md
says: a `Checkpointer(model=model, optimizer=None, extras=state)` carrying the hidden state,
the learning rate and the best validation loss, `restore()` and `step(n)`. A synthetic corpus
stands in for wikitext-2 (nothing is downloaded).

Prints `resumed-at: N` after the restore, `trained-steps: N` at each epoch's end,
`validation-batch: K` after each validation batch, `final-params-sha256: <hex>` at the end.

    python tests/torch_jobs/word_lm_manual.py --epochs 2 --val-sleep-s 0.2
"""

from __future__ import annotations

import argparse
import hashlib
import math
import time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The example's flags, at toy sizes; --val-sleep-s makes the validation long."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--emsize", type=int, default=16)
    p.add_argument("--nhid", type=int, default=16)
    p.add_argument("--lr", type=float, default=20.0)
    p.add_argument("--clip", type=float, default=0.25)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--bptt", type=int, default=8)
    p.add_argument("--tokens", type=int, default=1600)
    p.add_argument("--val-sleep-s", type=float, default=0.0, help="sleep per validation batch")
    p.add_argument("--seed", type=int, default=1111)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Train, validating after each epoch; print the final weights' hash."""
    args = parse_args(argv)
    import torch
    from torch import nn

    from spotrun.torch import Checkpointer

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    ntokens = 50
    g = torch.Generator().manual_seed(args.seed)
    corpus = torch.randint(ntokens, (args.tokens,), generator=g)
    train_data, val_data = corpus[: args.tokens * 3 // 4], corpus[args.tokens * 3 // 4:]

    def batchify(data: torch.Tensor, bsz: int) -> torch.Tensor:
        nbatch = data.size(0) // bsz
        return data[: nbatch * bsz].view(bsz, -1).t().contiguous()

    train_data, val_data = batchify(train_data, args.batch_size), batchify(val_data, 2)

    class RNNModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.drop = nn.Dropout(0.2)
            self.encoder = nn.Embedding(ntokens, args.emsize)
            self.rnn = nn.LSTM(args.emsize, args.nhid, 1)
            self.decoder = nn.Linear(args.nhid, ntokens)

        def forward(self, x, hidden):
            emb = self.drop(self.encoder(x))
            output, hidden = self.rnn(emb, hidden)
            return self.decoder(self.drop(output)).view(-1, ntokens), hidden

        def init_hidden(self, bsz: int):
            w = next(self.parameters())
            return (w.new_zeros(1, bsz, args.nhid), w.new_zeros(1, bsz, args.nhid))

    def repackage_hidden(h):
        return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage_hidden(v) for v in h)

    def get_batch(source: torch.Tensor, i: int):
        seq_len = min(args.bptt, len(source) - 1 - i)
        return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)

    model = RNNModel()
    criterion = nn.NLLLoss()
    windows = range(0, train_data.size(0) - 1, args.bptt)
    per_epoch = len(windows)

    def evaluate(data_source: torch.Tensor) -> float:
        model.eval()
        total_loss = 0.0
        hidden = model.init_hidden(2)
        with torch.no_grad():
            for k, i in enumerate(range(0, data_source.size(0) - 1, args.bptt)):
                data, targets = get_batch(data_source, i)
                output, hidden = model(data, hidden)
                hidden = repackage_hidden(hidden)
                total_loss += len(data) * criterion(torch.log_softmax(output, -1), targets).item()
                time.sleep(args.val_sleep_s)   # a real validation set is long
                print(f"validation-batch: {k + 1}", flush=True)
        return total_loss / (len(data_source) - 1)

    state = {"hidden": model.init_hidden(args.batch_size), "lr": args.lr,
             "best_val_loss": float("inf"), "validated": 0}
    total_steps = args.epochs * per_epoch
    ckpt = Checkpointer(model=model, optimizer=None, extras=state, total_steps=total_steps)
    step = ckpt.restore()
    print(f"resumed-at: {step}", flush=True)
    while True:
        epoch, batch = divmod(step, per_epoch)
        # The validation after an epoch, at the top of the next iteration (docs/checkpointing.md:
        # a checkpoint of the epoch's last step comes before it, so a resume runs it again).
        if step > 0 and batch == 0 and state["validated"] < epoch:
            print(f"trained-steps: {step}", flush=True)
            val_loss = evaluate(val_data)
            print(f"epoch {epoch} valid ppl {math.exp(min(val_loss, 50)):.2f}", flush=True)
            if val_loss < state["best_val_loss"]:
                state["best_val_loss"] = val_loss
            else:
                state["lr"] /= 4.0
            state["validated"] = epoch
        if step >= total_steps:
            break
        if batch == 0:
            state["hidden"] = model.init_hidden(args.batch_size)
        model.train()
        for i in list(windows)[batch:]:
            data, targets = get_batch(train_data, i)
            hidden = repackage_hidden(state["hidden"])
            model.zero_grad()
            output, hidden = model(data, hidden)
            loss = criterion(torch.log_softmax(output, -1), targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-state["lr"])
            state["hidden"] = hidden
            step += 1
            ckpt.step(step)
    ckpt.finish(step)
    ckpt.close()
    digest = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        digest.update(name.encode() + t.detach().contiguous().numpy().tobytes())
    print(f"final-params-sha256: {digest.hexdigest()}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
