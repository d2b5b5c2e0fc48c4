"""spotrun's in-job library: exact-resume, asynchronous, verified checkpoints for PyTorch.

The only spotrun package that imports torch. Integration in three lines:

    ckpt = Checkpointer(model=model, optimizer=opt)
    start = ckpt.restore()
    ...  ckpt.step(step + 1)  # in the loop, after each step
"""

from spotrun.torch.checkpointer import Checkpointer, young_daly_s
from spotrun.torch.sampler import StatefulSampler

__all__ = ["Checkpointer", "StatefulSampler", "young_daly_s"]
