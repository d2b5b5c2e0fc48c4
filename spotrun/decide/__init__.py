"""The one decision: where and how a job runs (type, zone, market, GPUs, interval).

`decide` is called by `spotrun plan`, `spotrun submit --dry-run`, the daemon's scheduler
and its deadline placer; `refusal` turns a decision that can never launch into exit 2.
"""

from spotrun.decide.core import (MAX_CANDIDATES, Placement, decide, hours_left, launch_order,
                                 wait_reason)
from spotrun.decide.market import MarketSnapshot, catalog_snapshot, provider_snapshot
from spotrun.decide.rank import Candidate, Ranking, Rejection, checkpoint_interval_s, rank
from spotrun.decide.refusal import refusal

__all__ = ["MAX_CANDIDATES", "Candidate", "MarketSnapshot", "Placement", "Ranking", "Rejection",
           "catalog_snapshot", "checkpoint_interval_s", "decide", "hours_left", "launch_order",
           "provider_snapshot", "rank", "refusal", "wait_reason"]
