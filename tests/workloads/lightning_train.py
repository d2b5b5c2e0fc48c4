"""A tiny LightningModule trained with spotrun's callback (test workload); data made here.

WORKLOAD_GATE_STEP / WORKLOAD_TRAIN_GATE_STEP ('N' or 'A:N', as in hf_train.py) hold a
validation after step N, or training after step N, until the notice has come; after the
emergency save the job waits for its reclaim.
"""
import argparse
import hashlib
import os
import time
from pathlib import Path

import lightning.pytorch as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from spotrun.integrations.lightning import ResumableDataLoader, SpotrunCallback, ckpt_path

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
a = p.parse_args()


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
        opt = torch.optim.Adam(self.parameters(), lr=1e-2)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 5, 0.9)}


def gate(name):
    raw = os.environ.get(name) or "0"
    attempt, _, step = raw.rpartition(":")
    return 0 if attempt and attempt != os.environ.get("SPOTRUN_ATTEMPT") else int(step)


class Gate(L.Callback):
    def __init__(self, spot):
        self.spot, self.held = spot, False
        self.eval_gate, self.train_gate = gate("WORKLOAD_GATE_STEP"), gate("WORKLOAD_TRAIN_GATE_STEP")

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
        if self.held and self.spot.emergency_steps:   # the job would go on until the reclaim
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
L.seed_everything(0)
g = torch.Generator().manual_seed(1)
x, xv = torch.randn(96, 8, generator=g), torch.randn(48, 8, generator=g)
y, yv = x.sum(1, keepdim=True), xv.sum(1, keepdim=True)
model = Tiny()
spot = SpotrunCallback()
trainer = L.Trainer(max_steps=a.steps, accelerator="cpu", devices=1, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, val_check_interval=10,
                    check_val_every_n_epoch=None, num_sanity_val_steps=2,
                    callbacks=[spot, Gate(spot)])
start = ckpt_path()
print(f"start {start or 'fresh'}", flush=True)
trainer.fit(model, ResumableDataLoader(TensorDataset(x, y), batch_size=8, shuffle=True, seed=0),
            DataLoader(TensorDataset(xv, yv), batch_size=4), ckpt_path=start)
h = hashlib.sha256()
for k, v in sorted(model.state_dict().items()):
    h.update(k.encode())
    h.update(v.detach().contiguous().numpy().tobytes())
print("emergency", spot.emergency_steps, flush=True)
print(f"final-params-sha256: {h.hexdigest()}", flush=True)
