"""DCGAN (pytorch/examples dcgan), ported to spotrun: two networks, two Adam optimizers.

The example's shape, shrunk to a CPU run of seconds: a generator of transposed
convolutions and a discriminator of convolutions, both with BatchNorm, trained
alternately with BCE (discriminator on real and fake, then generator); Adam for each
(lr 2e-4, betas 0.5 / 0.999). The generator (`model=`, `optimizer=`) is the Checkpointer's
model; the discriminator, its optimizer and the data loader go in `extras` as stateful
objects ("anything with state_dict / load_state_dict is restored in place",
docs/checkpointing.md; the guide says nothing about a second optimizer). As in the
example, the sample pass on fixed noise runs the generator in train mode (no `eval()`,
BatchNorm statistics move). Samples and each epoch's `netG_epoch_N.pth` /
`netD_epoch_N.pth` are written at the step boundary they belong to, `log.csv` gets a row per
step; all are persisted. Sizes from `GAN_*` variables.

    python tests/loops/gan.py
"""

from __future__ import annotations

import os

import torch
from torch import nn
from torch.utils.data import Dataset

from digest import report
from points import point
from spotrun.jobfiles import persist
from spotrun.torch import Checkpointer, ResumableDataLoader

EPOCHS = int(os.environ.get("GAN_EPOCHS", "3"))
N_IMAGES = int(os.environ.get("GAN_IMAGES", "64"))
BATCH = 8
SAMPLE_EVERY = int(os.environ.get("GAN_SAMPLE_EVERY", "5"))
SAVE_EVERY = int(os.environ.get("GAN_SAVE_EVERY", "6"))
NZ, NGF, NDF, SIZE = 8, 8, 8, 16


class Blobs(Dataset):
    """Grey images of a bright square at a random place (fixed per item)."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(3)
        self.images = torch.full((n, 1, SIZE, SIZE), -1.0)
        for i, (y, x) in enumerate(torch.randint(0, SIZE - 6, (n, 2), generator=g).tolist()):
            self.images[i, :, y:y + 6, x:x + 6] = 1.0

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        point("data")
        return self.images[i], 0


def weights_init(m: nn.Module) -> None:
    """The example's initialisation: N(0, 0.02) convolutions, N(1, 0.02) BatchNorm scales."""
    if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
        nn.init.normal_(m.weight, 0.0, 0.02)
    elif isinstance(m, nn.BatchNorm2d):
        nn.init.normal_(m.weight, 1.0, 0.02)
        nn.init.zeros_(m.bias)


def generator() -> nn.Module:
    """nz x 1 x 1 -> 1 x 16 x 16."""
    return nn.Sequential(
        nn.ConvTranspose2d(NZ, NGF * 2, 4, 1, 0, bias=False), nn.BatchNorm2d(NGF * 2), nn.ReLU(True),
        nn.ConvTranspose2d(NGF * 2, NGF, 4, 2, 1, bias=False), nn.BatchNorm2d(NGF), nn.ReLU(True),
        nn.ConvTranspose2d(NGF, 1, 4, 2, 1, bias=False), nn.Tanh())


def discriminator() -> nn.Module:
    """1 x 16 x 16 -> a probability."""
    return nn.Sequential(
        nn.Conv2d(1, NDF, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
        nn.Conv2d(NDF, NDF * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(NDF * 2),
        nn.LeakyReLU(0.2, inplace=True),
        nn.Conv2d(NDF * 2, 1, 4, 1, 0, bias=False), nn.Sigmoid())


def main() -> None:
    """Train the pair; print the final state's digests."""
    torch.manual_seed(999)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    job_dir = os.environ.get("SPOTRUN_JOB_DIR", ".")
    os.makedirs(os.path.join(job_dir, "samples"), exist_ok=True)
    dataloader = ResumableDataLoader(Blobs(N_IMAGES), batch_size=BATCH, shuffle=True)
    steps_per_epoch = len(dataloader)
    total_steps = EPOCHS * steps_per_epoch

    netG, netD = generator(), discriminator()
    netG.apply(weights_init)
    netD.apply(weights_init)
    criterion = nn.BCELoss()
    fixed_noise = torch.randn(16, NZ, 1, 1)
    optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))

    persist("log.csv", "samples", "netG_epoch_*.pth", "netD_epoch_*.pth")
    ckpt = Checkpointer(model=netG, optimizer=optimizerG,
                        extras={"netD": netD, "optimizerD": optimizerD, "dataloader": dataloader},
                        every_steps=SAVE_EVERY, total_steps=total_steps)
    step = ckpt.restore()
    print(f"resumed-at: {step}", flush=True)

    def boundary() -> None:
        # Work that belongs to the boundary after `step`: a resume there does it again.
        if step > 0 and step % SAMPLE_EVERY == 0:
            chunks = []
            for i in range(0, len(fixed_noise), 4):   # train mode, as the example samples
                point("validation", step)
                chunks.append(netG(fixed_noise[i:i + 4]).detach())
            torch.save(torch.cat(chunks), os.path.join(job_dir, "samples", f"fake_step_{step:04d}.pt"))
        if step > 0 and step % steps_per_epoch == 0:
            epoch = step // steps_per_epoch
            point("best", step)
            torch.save(netG.state_dict(), os.path.join(job_dir, f"netG_epoch_{epoch}.pth"))
            torch.save(netD.state_dict(), os.path.join(job_dir, f"netD_epoch_{epoch}.pth"))

    boundary()
    while step < total_steps:
        for real, _ in dataloader:
            # (1) Update D: maximize log(D(x)) + log(1 - D(G(z)))
            netD.zero_grad()
            label = torch.full((real.size(0),), 1.0)
            output = netD(real).view(-1)
            errD_real = criterion(output, label)
            errD_real.backward()
            D_x = output.mean().item()
            noise = torch.randn(real.size(0), NZ, 1, 1)
            fake = netG(noise)
            label.fill_(0.0)
            output = netD(fake.detach()).view(-1)
            errD_fake = criterion(output, label)
            errD_fake.backward()
            D_G_z1 = output.mean().item()
            errD = errD_real + errD_fake
            optimizerD.step()
            point("train", step)
            # (2) Update G: maximize log(D(G(z)))
            netG.zero_grad()
            label.fill_(1.0)
            output = netD(fake).view(-1)
            errG = criterion(output, label)
            errG.backward()
            D_G_z2 = output.mean().item()
            optimizerG.step()
            step += 1
            point("log", step)
            epoch, i = divmod(step - 1, steps_per_epoch)   # from the step, not enumerate()
            with open(os.path.join(job_dir, "log.csv"), "a") as f:
                f.write(f"{epoch},{i},{errD.item():.6f},{errG.item():.6f},"
                        f"{D_x:.6f},{D_G_z1:.6f},{D_G_z2:.6f}\n")
            if ckpt.step(step):
                point("save", step)
            boundary()
            if step >= total_steps:
                break
    ckpt.finish(step)
    ckpt.close()
    report(netG=netG, netD=netD, optimizerG=optimizerG, optimizerD=optimizerD)


if __name__ == "__main__":
    main()
