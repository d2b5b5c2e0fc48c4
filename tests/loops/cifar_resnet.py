"""CIFAR-style image classification with a tiny ResNet, ported to spotrun as the guide says.

The shape of the widely used CIFAR-10 training scripts, shrunk to run on a CPU in seconds:
a synthetic image set whose `__getitem__` does the usual random crop (padding + random
offsets) and random horizontal flip with torch's random generator, a shuffled
`ResumableDataLoader` with two workers, a ResNet with BatchNorm, SGD with Nesterov momentum
and weight decay, OneCycleLR stepped per optimizer step, bf16 autocast (on CPU: on CUDA one
would use fp16 with a GradScaler), two micro-batches accumulated per optimizer step, an EMA
of the weights (`AveragedModel`), a validation each epoch (`model.eval()` + `no_grad()`;
`CIFAR_VAL_TRAIN_MODE=1` validates without `eval()`), `best.pt` when validation accuracy
improves and `log.csv` (kind, epoch, step, value) appended per step, both in the job's
directory and persisted with every checkpoint. Sizes come from `CIFAR_*` variables.
`CIFAR_STOCK_LOADER=1` uses torch's own DataLoader (a negative control: no mid-epoch resume).

    python tests/loops/cifar_resnet.py
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import DataLoader, Dataset

from digest import report
from points import point
from spotrun.jobfiles import persist
from spotrun.torch import Checkpointer, ResumableDataLoader

EPOCHS = int(os.environ.get("CIFAR_EPOCHS", "3"))
N_TRAIN = int(os.environ.get("CIFAR_TRAIN", "64"))
N_VAL = int(os.environ.get("CIFAR_VAL", "96"))
MICRO_BATCH = int(os.environ.get("CIFAR_MICRO_BATCH", "8"))
ACCUM = 2                      # micro-batches per optimizer step
SAVE_EVERY = int(os.environ.get("CIFAR_SAVE_EVERY", "5"))
SIZE, PAD, CLASSES = 16, 2, 10
VAL_TRAIN_MODE = os.environ.get("CIFAR_VAL_TRAIN_MODE") == "1"
STOCK_LOADER = os.environ.get("CIFAR_STOCK_LOADER") == "1"


class SyntheticCIFAR(Dataset):
    """Fixed random images and labels; training items are randomly cropped and flipped."""

    def __init__(self, n: int, seed: int, train: bool) -> None:
        g = torch.Generator().manual_seed(seed)
        self.images = torch.rand(n, 3, SIZE, SIZE, generator=g)
        self.labels = torch.randint(0, CLASSES, (n,), generator=g)
        self.train = train

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        point("data")
        img = self.images[i]
        if self.train:   # RandomCrop(32, padding=4) + RandomHorizontalFlip, by hand
            padded = F.pad(img, (PAD, PAD, PAD, PAD))
            dy, dx = torch.randint(0, 2 * PAD + 1, (2,)).tolist()
            img = padded[:, dy:dy + SIZE, dx:dx + SIZE]
            if torch.rand(1).item() < 0.5:
                img = img.flip(2)
        return img, self.labels[i]


class BasicBlock(nn.Module):
    """The ResNet basic block: two 3x3 convolutions with BatchNorm and a shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    """A two-stage ResNet for small images."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.layers = nn.Sequential(BasicBlock(8, 8, 1), BasicBlock(8, 16, 2))
        self.fc = nn.Linear(16, CLASSES)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1).flatten(1))


def main() -> None:
    """Train, validate each epoch, keep the best model; print the final state's digests."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    job_dir = os.environ.get("SPOTRUN_JOB_DIR", ".")
    log_path, best_path = os.path.join(job_dir, "log.csv"), os.path.join(job_dir, "best.pt")

    loader_cls = DataLoader if STOCK_LOADER else ResumableDataLoader
    train_loader = loader_cls(SyntheticCIFAR(N_TRAIN, 1, True), batch_size=MICRO_BATCH,
                              shuffle=True, num_workers=2, drop_last=True)
    val_loader = DataLoader(SyntheticCIFAR(N_VAL, 2, False), batch_size=MICRO_BATCH)
    steps_per_epoch = len(train_loader) // ACCUM
    total_steps = EPOCHS * steps_per_epoch

    model = ResNet()
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True,
                                weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.2, total_steps=total_steps)

    persist("log.csv", "best.pt")
    extras = {"ema": ema, "best_acc": 0.0}
    if not STOCK_LOADER:
        extras["train_loader"] = train_loader
    ckpt = Checkpointer(model=model, optimizer=optimizer, scheduler=scheduler, extras=extras,
                        every_steps=SAVE_EVERY, total_steps=total_steps)
    step = ckpt.restore()
    print(f"resumed-at: {step}", flush=True)

    def validate(epoch: int) -> None:
        if not VAL_TRAIN_MODE:
            model.eval()
        correct = 0
        with torch.no_grad():
            for x, y in val_loader:
                point("validation", step)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    correct += (model(x).argmax(1) == y).sum().item()
        model.train()
        acc = correct / N_VAL
        with open(log_path, "a") as f:
            f.write(f"val,{epoch},{step},{acc:.6f}\n")
        if acc > extras["best_acc"]:
            extras["best_acc"] = acc
            point("best", step)
            torch.save({"model": model.state_dict(), "ema": ema.state_dict(), "epoch": epoch,
                        "acc": acc}, best_path)

    model.train()
    while True:
        # The validation of the epoch that just ended belongs before the next step: a
        # resume at this step runs it again (docs/checkpointing.md).
        if step > 0 and step % steps_per_epoch == 0:
            validate(step // steps_per_epoch - 1)
        if step >= total_steps:
            break
        for i, (x, y) in enumerate(train_loader):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y) / ACCUM
            loss.backward()
            if (i + 1) % ACCUM:
                continue
            point("train", step)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            ema.update_parameters(model)
            step += 1
            point("log", step)
            with open(log_path, "a") as f:   # the row for a step before its checkpoint
                f.write(f"train,{(step - 1) // steps_per_epoch},{step},{loss.item() * ACCUM:.6f}\n")
            if ckpt.step(step):
                point("save", step)
            if step >= total_steps:
                break
    ckpt.finish(step)
    ckpt.close()
    report(model=model, ema=ema, optimizer=optimizer, scheduler=scheduler)


if __name__ == "__main__":
    main()
