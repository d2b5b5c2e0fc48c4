"""A Lightning script as its docs write it, without spotrun: the baseline of the job-state tests.

ModelCheckpoint(monitor="val_loss", save_top_k=2), CSVLogger("."), LearningRateMonitor, a
shuffled train loader with num_workers=2 under seed_everything(0, workers=True), a step LR
schedule, dropout, validation every 6 of the epoch's 12 batches (so also at each epoch end).
lightning_best_train.py is this script with spotrun added as docs/integrations.md says;
both print the same result lines. This one imports nothing of spotrun or of the tests.
"""
import argparse
import hashlib
from pathlib import Path

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, Dataset

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


def sha_of(state):
    h = hashlib.sha256()
    for k, v in sorted(state.items()):
        h.update(k.encode())
        h.update(v.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


torch.set_num_threads(1)
L.seed_everything(0, workers=True)
train = DataLoader(Points(96, 1), batch_size=8, shuffle=True, num_workers=2)
val = DataLoader(Points(48, 2), batch_size=8, num_workers=2)
model = Net()
checkpoint_callback = ModelCheckpoint(monitor="val_loss", save_top_k=2)
trainer = L.Trainer(max_steps=a.steps, accelerator="cpu", devices=1, logger=CSVLogger("."),
                    log_every_n_steps=2, val_check_interval=6, enable_progress_bar=False,
                    enable_model_summary=False,
                    callbacks=[checkpoint_callback, LearningRateMonitor(logging_interval="step")])
trainer.fit(model, train, val)
best = torch.load(checkpoint_callback.best_model_path, weights_only=False)["state_dict"]
print(f"final-params-sha256: {sha_of(model.state_dict())}", flush=True)
print(f"best-model-score: {float(checkpoint_callback.best_model_score)!r}", flush=True)
print(f"best-model-name: {Path(checkpoint_callback.best_model_path).name}", flush=True)
print(f"best-model-sha256: {sha_of(best)}", flush=True)
print(f"top-k: {sorted(Path(k).name for k in checkpoint_callback.best_k_models)}", flush=True)
print(f"metrics-csv: {Path(trainer.logger.log_dir) / 'metrics.csv'}", flush=True)
