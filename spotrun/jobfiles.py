"""`spotrun.jobfiles`, as users import it (`from spotrun.jobfiles import persist`): the job's
persisted files, spotrun.checkpoints.jobfiles, under its public name. One module under two
names, so what is set on either is set on both."""

import sys

from spotrun.checkpoints import jobfiles

sys.modules[__name__] = jobfiles
