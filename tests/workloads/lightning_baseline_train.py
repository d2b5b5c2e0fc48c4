"""A Lightning script as its docs write it, plain or with spotrun added (test workload).

--mode plain: stock DataLoader(shuffle=True, num_workers=2) under seed_everything(42,
workers=True); --mode spotrun: the same with ResumableDataLoader (same arguments),
SpotrunCallback and ckpt_path(), as docs/integrations.md says. --augment adds noise drawn
in the loader's workers (so their seeding counts). Writes the final state_dict to --out.
WORKLOAD_GATE_STEP / WORKLOAD_TRAIN_GATE_STEP ('N' or 'A:N') hold a validation after step
N, or training after step N, until the notice has come (spotrun mode, resume tests).
"""
import argparse
import os
import time
from pathlib import Path

import lightning.pytorch as L
import torch
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["plain", "spotrun"], required=True)
p.add_argument("--steps", type=int, default=24)
p.add_argument("--augment", action="store_true")
p.add_argument("--out", default="final.pt")
a = p.parse_args()


class Points(Dataset):
    def __init__(self, n, seed, noise):
        g = torch.Generator().manual_seed(seed)
        self.x, self.noise = torch.randn(n, 8, generator=g), noise

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        x = self.x[i]
        if self.noise:
            x = x + 0.1 * torch.randn(8)   # drawn in the worker: depends on its seed
        return x, x.sum(0, keepdim=True)


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                       torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def gate(name):
    raw = os.environ.get(name) or "0"
    attempt, _, step = raw.rpartition(":")
    return 0 if attempt and attempt != os.environ.get("SPOTRUN_ATTEMPT") else int(step)


class Gate(L.Callback):
    """Holds the run at a chosen step until the notice has come, then until the kill."""

    def __init__(self, spot):
        self.spot, self.held = spot, False
        self.eval_gate = gate("WORKLOAD_GATE_STEP")
        self.train_gate = gate("WORKLOAD_TRAIN_GATE_STEP")

    def _hold(self, step, marker):
        if self.spot.emergency_steps:
            return
        self.held = True
        self.spot.progress.step(step, force=True)
        Path(marker).write_text(str(step))
        deadline = time.monotonic() + 60
        while not self.spot.notice.pending and time.monotonic() < deadline:
            time.sleep(0.01)

    def _tail(self):
        if self.held and self.spot.emergency_steps:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                time.sleep(0.05)

    def on_validation_batch_end(self, trainer, *args, **kw):
        self._tail()
        if self.eval_gate and not trainer.sanity_checking and trainer.global_step == self.eval_gate:
            self._hold(trainer.global_step, "gate-eval")

    def on_train_batch_end(self, trainer, *args, **kw):
        self._tail()
        if self.train_gate and trainer.global_step == self.train_gate:
            self._hold(trainer.global_step, "gate-train")


torch.set_num_threads(1)
L.seed_everything(42, workers=True)
train_ds, val_ds = Points(96, 1, a.augment), Points(48, 2, False)
callbacks, start = [], None
if a.mode == "spotrun":
    from spotrun.integrations.lightning import ResumableDataLoader, SpotrunCallback, ckpt_path
    spot = SpotrunCallback()
    callbacks = [spot, Gate(spot)]
    start = ckpt_path()
    train = ResumableDataLoader(train_ds, batch_size=8, shuffle=True, num_workers=2)
else:
    train = DataLoader(train_ds, batch_size=8, shuffle=True, num_workers=2)
val = DataLoader(val_ds, batch_size=8, num_workers=2)
model = Tiny()
trainer = L.Trainer(max_steps=a.steps, accelerator="cpu", devices=1, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, val_check_interval=10,
                    check_val_every_n_epoch=None, num_sanity_val_steps=2, callbacks=callbacks)
print(f"start {start or 'fresh'}", flush=True)
trainer.fit(model, train, val, ckpt_path=start)
torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, a.out)
print("done", flush=True)
