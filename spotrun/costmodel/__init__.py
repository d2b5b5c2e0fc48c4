"""The cost model: which pool to bid for, by modelled $ per unit of training progress.

See docs/cost-model.md. The daemon calls `rank_candidates` at every launch and relaunch;
`spotrun plan` prints the same Plan.
"""

from spotrun.costmodel.history import (DbHistory, HistorySource, JobStats, NoHistory, PoolStats,
                                       StaticHistory)
from spotrun.costmodel.model import (expected, progress_fraction, recommended_interval_s,
                                     young_daly_interval_s)
from spotrun.costmodel.prices import CatalogPrices, PriceSource
from spotrun.costmodel.priors import Priors, ZonePrior, priors_from_catalog, zone_priors_from_trace
from spotrun.costmodel.rank import Candidate, Infeasible, Plan, rank_candidates
from spotrun.costmodel.speed import ScalingCurve, default_scaling

__all__ = ["Candidate", "CatalogPrices", "DbHistory", "HistorySource", "Infeasible", "JobStats",
           "NoHistory", "Plan", "PoolStats", "PriceSource", "Priors", "ScalingCurve",
           "StaticHistory", "ZonePrior", "default_scaling", "expected", "priors_from_catalog",
           "progress_fraction", "rank_candidates", "recommended_interval_s",
           "young_daly_interval_s", "zone_priors_from_trace"]
