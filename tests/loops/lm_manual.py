"""Word-level language model (pytorch/examples word_language_model), ported to spotrun.

The example's shape, shrunk to a CPU run of seconds: a corpus batchified into columns,
an RNN language model (`LM_RNN=LSTM` or `GRU`) with dropout, truncated back-propagation
through time with the hidden state detached and carried from batch to batch, **no
optimizer**: gradient clipping and `p.data.add_(p.grad, alpha=-lr)`, the learning rate
divided by 4 when validation loss does not improve, validation in `eval()` + `no_grad()`
over a longer held-out stream, the best model written to `model.pt`, and the running loss
logged every few batches (to `log.csv`). What the loop carries goes in `extras`, the data
position comes from the step counter (docs/checkpointing.md). Sizes from `LM_*` variables.

    python tests/loops/lm_manual.py
"""

from __future__ import annotations

import math
import os

import torch
from torch import nn

from digest import report
from points import point
from spotrun.jobfiles import persist
from spotrun.torch import Checkpointer

EPOCHS = int(os.environ.get("LM_EPOCHS", "3"))
BATCH, EVAL_BATCH = 4, 4
BPTT = int(os.environ.get("LM_BPTT", "8"))
TRAIN_TOKENS = int(os.environ.get("LM_TRAIN_TOKENS", "320"))
VAL_TOKENS = int(os.environ.get("LM_VAL_TOKENS", "640"))
VOCAB, EMB, HIDDEN = 32, 16, 24
CLIP, LOG_INTERVAL = 0.25, 3
SAVE_EVERY = int(os.environ.get("LM_SAVE_EVERY", "7"))
RNN = os.environ.get("LM_RNN", "LSTM")


class RNNModel(nn.Module):
    """Encoder, recurrent module, decoder (the example's RNNModel)."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.2)
        self.encoder = nn.Embedding(VOCAB, EMB)
        self.rnn = {"LSTM": nn.LSTM, "GRU": nn.GRU}[RNN](EMB, HIDDEN, 2, dropout=0.2)
        self.decoder = nn.Linear(HIDDEN, VOCAB)

    def forward(self, x, hidden):
        out, hidden = self.rnn(self.drop(self.encoder(x)), hidden)
        return self.decoder(self.drop(out)).view(-1, VOCAB), hidden

    def init_hidden(self, bsz: int):
        """Zeros of the right shape (a pair for an LSTM)."""
        z = torch.zeros(2, bsz, HIDDEN)
        return (z, z.clone()) if RNN == "LSTM" else z


def batchify(data: torch.Tensor, bsz: int) -> torch.Tensor:
    """Columns of a token stream: (tokens per column, bsz)."""
    nbatch = data.size(0) // bsz
    return data.narrow(0, 0, nbatch * bsz).view(bsz, -1).t().contiguous()


def get_batch(source: torch.Tensor, i: int):
    """Inputs and next-token targets of the chunk starting at row i."""
    seq_len = min(BPTT, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


def repackage_hidden(h):
    """Cut the graph at the chunk boundary (truncated BPTT)."""
    return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage_hidden(v) for v in h)


def main() -> None:
    """Train for EPOCHS with the manual SGD update; print the final state's digests."""
    torch.manual_seed(1111)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    job_dir = os.environ.get("SPOTRUN_JOB_DIR", ".")
    g = torch.Generator().manual_seed(7)
    # A corpus with some structure: a random walk over the vocabulary.
    walk = torch.randint(-2, 3, (TRAIN_TOKENS + VAL_TOKENS,), generator=g).cumsum(0) % VOCAB
    train_data = batchify(walk[:TRAIN_TOKENS], BATCH)
    val_data = batchify(walk[TRAIN_TOKENS:], EVAL_BATCH)
    starts = list(range(0, train_data.size(0) - 1, BPTT))
    total_steps = EPOCHS * len(starts)

    model = RNNModel()
    criterion = nn.CrossEntropyLoss()
    persist("model.pt", "log.csv")
    state = {"hidden": model.init_hidden(BATCH), "lr": 4.0, "best_val": None,
             "total_loss": 0.0}
    ckpt = Checkpointer(model=model, optimizer=None, extras=state, every_steps=SAVE_EVERY,
                        total_steps=total_steps)
    step = ckpt.restore()
    print(f"resumed-at: {step}", flush=True)

    def evaluate() -> float:
        model.eval()
        total = 0.0
        hidden = model.init_hidden(EVAL_BATCH)
        with torch.no_grad():
            for i in range(0, val_data.size(0) - 1, BPTT):
                point("validation", step)
                data, targets = get_batch(val_data, i)
                output, hidden = model(data, hidden)
                hidden = repackage_hidden(hidden)
                total += len(data) * criterion(output, targets).item()
        model.train()
        return total / (len(val_data) - 1)

    model.train()
    while True:
        if step > 0 and step % len(starts) == 0:   # the end of an epoch, before the next step
            val_loss = evaluate()
            epoch = step // len(starts)
            print(f"| end of epoch {epoch} | valid loss {val_loss:5.2f} | "
                  f"valid ppl {math.exp(val_loss):8.2f}", flush=True)
            if state["best_val"] is None or val_loss < state["best_val"]:
                point("best", step)
                with open(os.path.join(job_dir, "model.pt"), "wb") as f:
                    torch.save(model.state_dict(), f)
                state["best_val"] = val_loss
            else:
                state["lr"] /= 4.0
        if step >= total_steps:
            break
        batch = step % len(starts)
        if batch == 0:
            state["hidden"] = model.init_hidden(BATCH)
        point("data", step)
        data, targets = get_batch(train_data, starts[batch])
        hidden = repackage_hidden(state["hidden"])
        model.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        point("train", step)
        nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-state["lr"])
        state["hidden"] = hidden.detach() if isinstance(hidden, torch.Tensor) else \
            tuple(h.detach() for h in hidden)
        state["total_loss"] += loss.item()
        step += 1
        if (batch + 1) % LOG_INTERVAL == 0:
            point("log", step)
            cur_loss = state["total_loss"] / LOG_INTERVAL
            with open(os.path.join(job_dir, "log.csv"), "a") as f:
                f.write(f"{step // len(starts)},{batch + 1},{state['lr']:.6f},{cur_loss:.6f}\n")
            state["total_loss"] = 0.0
        if ckpt.step(step):
            point("save", step)
    ckpt.finish(step)
    ckpt.close()
    report(model=model, lr=state["lr"], best_val=state["best_val"])


if __name__ == "__main__":
    main()
