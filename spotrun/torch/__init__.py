"""spotrun's in-job library: exact-resume, asynchronous, verified checkpoints for PyTorch.

The only spotrun package that imports torch. Integration in three lines:

    ckpt = Checkpointer(model=model, optimizer=opt)
    start = ckpt.restore()
    ...  ckpt.step(step + 1)  # in the loop, after each step

Less common settings go in three option objects (`spotrun.torch.options`):
`Checkpointer(..., save=SaveOptions(...), notice=NoticeOptions(...), runtime=RuntimeOptions(...))`.

The interruption notice is honoured wherever the loop is (`spotrun.torch.notice`);
`NoticeGuard` is the part integrations drive with their own save function.
"""

from spotrun.torch.checkpointer import Checkpointer
from spotrun.torch.interval import young_daly_s
from spotrun.torch.loader import ResumableDataLoader
from spotrun.torch.notice import NoticeGuard
from spotrun.torch.options import NoticeOptions, RuntimeOptions, SaveOptions
from spotrun.torch.sampler import StatefulSampler

__all__ = ["Checkpointer", "NoticeGuard", "NoticeOptions", "ResumableDataLoader", "RuntimeOptions",
           "SaveOptions", "StatefulSampler", "young_daly_s"]
