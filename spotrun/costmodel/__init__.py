"""The cost model: which pool to bid for, by modelled $ per unit of training progress.

See docs/cost-model.md. The ranking and the pick live in spotrun.decide, which every
caller (plan, dry-run, daemon) goes through.
"""

from spotrun.costmodel.history import (DbHistory, HistorySource, JobStats, NoHistory, PoolStats,
                                       StaticHistory)
from spotrun.costmodel.model import (expected, progress_fraction, recommended_interval_s,
                                     young_daly_interval_s)
from spotrun.costmodel.notice_loss import (GENERIC_NOTICE, NoticePrior, ReclaimRecord, notice_prior_of,
                                      reclaim_loss, usable_notice_chance)
from spotrun.costmodel.price_source import CatalogPrices, PriceSource
from spotrun.costmodel.priors import Priors, ZonePrior, priors_from_catalog, zone_priors_from_trace
from spotrun.costmodel.speed import ScalingCurve, default_scaling

__all__ = ["CatalogPrices", "DbHistory", "GENERIC_NOTICE", "HistorySource", "JobStats",
           "NoHistory", "NoticePrior", "PoolStats", "PriceSource", "Priors", "ReclaimRecord",
           "ScalingCurve", "StaticHistory", "ZonePrior", "default_scaling", "expected",
           "notice_prior_of", "priors_from_catalog", "progress_fraction", "reclaim_loss",
           "recommended_interval_s", "usable_notice_chance", "young_daly_interval_s",
           "zone_priors_from_trace"]
