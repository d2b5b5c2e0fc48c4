"""A LightningModule trained by `L.Trainer`, with spotrun added as docs/integrations.md says.

The shape of a typical Lightning script, tiny: a regression net with BatchNorm and
dropout, Adam with a per-step StepLR, a shuffled train loader with two workers whose
`__getitem__` adds random noise (augmentation with torch's generator; `LIT_AUGMENT=0`
turns it off), validation every few steps, `ModelCheckpoint(monitor="val_loss",
save_top_k=2)`, a CSVLogger and a LearningRateMonitor, all in the job directory.
spotrun: `ResumableDataLoader` for the train loader, `SpotrunCallback()`, `ckpt_path()`.
Prints the final weights, optimizer, scheduler and best model (weights, score, top-k).

    python tests/loops/lightning_loop.py
"""

from __future__ import annotations

import os
from pathlib import Path

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, Dataset

from digest import report
from points import point
from spotrun.integrations.lightning import ResumableDataLoader, SpotrunCallback, ckpt_path

MAX_STEPS = int(os.environ.get("LIT_STEPS", "30"))
AUGMENT = os.environ.get("LIT_AUGMENT", "1") == "1"


class Points(Dataset):
    """Points and the sum of their coordinates; training items get random noise."""

    def __init__(self, n: int, seed: int, train: bool) -> None:
        self.x = torch.randn(n, 8, generator=torch.Generator().manual_seed(seed))
        self.train = train

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        point("data", hold=False)   # the callback saves at its hooks, not during a data stall
        x = self.x[i]
        if self.train and AUGMENT:
            x = x + 0.05 * torch.randn(8)
        return x, x.sum(0, keepdim=True)


class Net(L.LightningModule):
    """MLP with BatchNorm and dropout."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.BatchNorm1d(32),
                                       torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def on_after_backward(self) -> None:
        point("train", self.global_step)

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        point("log", self.global_step, hold=False)

    def on_save_checkpoint(self, checkpoint) -> None:
        point("save", self.global_step, hold=False)

    def validation_step(self, batch, batch_idx):
        point("validation", self.global_step, hold=False)
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main() -> None:
    """Fit, then print the digests of the final and the best state."""
    torch.set_num_threads(1)
    L.seed_everything(42, workers=True)
    job_dir = os.environ.get("SPOTRUN_JOB_DIR", ".")
    train = ResumableDataLoader(Points(96, 1, True), batch_size=8, shuffle=True, num_workers=2)
    val = DataLoader(Points(48, 2, False), batch_size=8)
    model = Net()
    best = ModelCheckpoint(monitor="val_loss", save_top_k=2)
    trainer = L.Trainer(max_steps=MAX_STEPS, accelerator="cpu", devices=1, deterministic=True,
                        logger=CSVLogger(job_dir), log_every_n_steps=2, val_check_interval=6,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[best, LearningRateMonitor(logging_interval="step"),
                                   SpotrunCallback()])
    start = ckpt_path()
    print(f"resumed-at: {torch.load(start, weights_only=False)['global_step'] if start else 0}",
          flush=True)
    trainer.fit(model, train, val, ckpt_path=start)
    best_state = torch.load(best.best_model_path, weights_only=False)["state_dict"]
    report(model=model, optimizer=trainer.optimizers[0],
           scheduler=trainer.lr_scheduler_configs[0].scheduler, best_model=best_state,
           best_score=float(best.best_model_score),
           top_k=sorted(Path(k).name for k in best.best_k_models))


if __name__ == "__main__":
    main()
