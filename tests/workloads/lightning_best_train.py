"""lightning_best_plain.py with spotrun added as docs/integrations.md says (test workload).

The same script plus ResumableDataLoader (DataLoader's arguments), SpotrunCallback and
ckpt_path(); prints the same result lines. WORKLOAD_GATE_STEP / WORKLOAD_TRAIN_GATE_STEP
('N' or 'A:N': only in attempt A) hold the validation after step N, or training after step N,
until the notice has come; after the emergency save a gated attempt waits for its reclaim
(./waiting-for-reclaim holds the step), wherever the notice found it.
WORKLOAD_NOTICE_AT ('train:N', or 'val:N[:B]' for the validation's batch B) gives the
process the notice itself after that step or batch and exits at once after the emergency
save, without any flush (the kill, in one process).
"""
import argparse
import hashlib
import os
import time
from pathlib import Path

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, Dataset

from spotrun.integrations.lightning import ResumableDataLoader, SpotrunCallback, ckpt_path

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=36)
a = p.parse_args()


class Points(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 8, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        x = self.x[i]
        return x, x.sum(0, keepdim=True)


class Net(L.LightningModule):
    def __init__(self, lr=0.06):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),
                                       torch.nn.Dropout(0.2), torch.nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.8)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def gate(name):
    raw = os.environ.get(name) or "0"
    attempt, _, step = raw.rpartition(":")
    return 0 if attempt and attempt != os.environ.get("SPOTRUN_ATTEMPT") else int(step)


class Gate(L.Callback):
    """Holds the run at a chosen point until the notice has come, then until the kill."""

    def __init__(self, spot):
        self.spot, self.waiting = spot, False
        self.eval_gate = gate("WORKLOAD_GATE_STEP")
        self.train_gate = gate("WORKLOAD_TRAIN_GATE_STEP")
        where, _, rest = (os.environ.get("WORKLOAD_NOTICE_AT") or ":0").partition(":")
        step, _, batch = rest.partition(":")
        self.notice_at, self.notice_batch = (where, int(step)), int(batch or 0)

    def _hold(self, step, marker):
        if self.spot.emergency_steps:
            return
        self.spot.progress.step(step, force=True)
        Path(marker).write_text(str(step))
        deadline = time.monotonic() + 60
        while not self.spot.notice.pending and time.monotonic() < deadline:
            time.sleep(0.01)

    def _after_save(self):
        if self.spot.emergency_steps and self.notice_at[1]:
            print("exiting after the emergency save", self.spot.emergency_steps, flush=True)
            os._exit(0)
        # The job would go on until the reclaim; a gated one waits for it instead, also when
        # the notice came before the gate held it: the daemon's test interrupts as soon as
        # the gate's step is reported, and under load the notice can overtake the hold.
        if (self.eval_gate or self.train_gate) and self.spot.emergency_steps:
            if not self.waiting:
                self.waiting = True
                Path("waiting-for-reclaim").write_text(str(self.spot.emergency_steps[-1][0]))
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                time.sleep(0.05)

    def on_train_batch_start(self, trainer, *args, **kw):
        self._after_save()

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx,
                                dataloader_idx=0):
        self._after_save()
        if trainer.sanity_checking:
            return
        if self.eval_gate and trainer.global_step == self.eval_gate:
            self._hold(trainer.global_step, "gate-eval")
        if (self.notice_at == ("val", trainer.global_step) and batch_idx == self.notice_batch
                and not self.spot.emergency_steps):
            self.spot.notice.set()

    def on_train_batch_end(self, trainer, *args, **kw):
        self._after_save()
        if self.train_gate and trainer.global_step == self.train_gate:
            self._hold(trainer.global_step, "gate-train")
        if self.notice_at == ("train", trainer.global_step) and not self.spot.emergency_steps:
            self.spot.notice.set()


def sha_of(state):
    h = hashlib.sha256()
    for k, v in sorted(state.items()):
        h.update(k.encode())
        h.update(v.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


torch.set_num_threads(1)
L.seed_everything(0, workers=True)
train = ResumableDataLoader(Points(96, 1), batch_size=8, shuffle=True, num_workers=2)
val = DataLoader(Points(48, 2), batch_size=8, num_workers=2)
model = Net()
checkpoint_callback = ModelCheckpoint(monitor="val_loss", save_top_k=2)
spot = SpotrunCallback()
trainer = L.Trainer(max_steps=a.steps, accelerator="cpu", devices=1, logger=CSVLogger("."),
                    log_every_n_steps=2, val_check_interval=6, enable_progress_bar=False,
                    enable_model_summary=False,
                    callbacks=[checkpoint_callback, LearningRateMonitor(logging_interval="step"),
                               spot, Gate(spot)])
start = ckpt_path()
print(f"start {start or 'fresh'}", flush=True)
trainer.fit(model, train, val, ckpt_path=start)
print("emergency", spot.emergency_steps, flush=True)
best = torch.load(checkpoint_callback.best_model_path, weights_only=False)["state_dict"]
print(f"final-params-sha256: {sha_of(model.state_dict())}", flush=True)
print(f"best-model-score: {float(checkpoint_callback.best_model_score)!r}", flush=True)
print(f"best-model-name: {Path(checkpoint_callback.best_model_path).name}", flush=True)
print(f"best-model-sha256: {sha_of(best)}", flush=True)
print(f"top-k: {sorted(Path(k).name for k in checkpoint_callback.best_k_models)}", flush=True)
print(f"metrics-csv: {Path(trainer.logger.log_dir) / 'metrics.csv'}", flush=True)
