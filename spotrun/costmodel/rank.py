"""rank_candidates: every (type, zone, market) the job may use, by expected $ per unit of progress."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable

from spotrun.catalog import Catalog, InstanceType
from spotrun.costmodel.history import HistorySource, JobStats, PoolStats
from spotrun.costmodel.memory import checkpoint_gb, memory_reason
from spotrun.costmodel.model import expected, progress_fraction, recommended_interval_s
from spotrun.costmodel.prices import PriceSource, safe_price
from spotrun.costmodel.priors import Priors, priors_from_catalog
from spotrun.costmodel.speed import ScalingCurve, default_scaling, instance_speed
from spotrun.spec import JobSpec
from spotrun.states import Market, MarketPolicy

MIN_PROGRESS_FRACTION = 0.01   # below this a pool reclaims faster than the job can progress

JSON_KEYS = ("instance_type", "zone", "market", "price_usd_per_hour", "speedup",
             "progress_fraction", "usd_per_reference_hour", "expected_hours", "expected_usd",
             "expected_preemptions")


@dataclass(frozen=True)
class Candidate:
    """One pool the job could run in, with the model's figures."""

    instance_type: str
    zone: str
    market: Market
    price_usd_per_hour: float
    speedup: float                 # throughput over the reference instance (1.0 = same)
    progress_fraction: float       # share of billed time that becomes kept progress
    usd_per_reference_hour: float  # price / (speedup x progress_fraction)
    expected_hours: float | None   # for the remaining work; None without `work`
    expected_usd: float | None
    expected_preemptions: float | None
    checkpoint_interval_s: float   # recommended (Young/Daly) or the spec's fixed interval
    gpus: int = 1                  # GPUs the job uses there (SPOTRUN_GPUS)
    mtbf_h: float | None = None    # modelled hours between reclaims (None: on-demand)
    restart_s: float = 0.0
    checkpoint_cost_s: float = 0.0
    speed_source: str = "catalog"  # catalog | measured
    misses_deadline: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The JSON row of `spotrun plan --json` (exactly the issue's keys)."""
        def r(x: float | None, n: int) -> float | None:
            return None if x is None else (x if math.isinf(x) else round(x, n))
        return {"instance_type": self.instance_type, "zone": self.zone,
                "market": self.market.value,
                "price_usd_per_hour": r(self.price_usd_per_hour, 4),
                "speedup": r(self.speedup, 4), "progress_fraction": r(self.progress_fraction, 4),
                "usd_per_reference_hour": r(self.usd_per_reference_hour, 4),
                "expected_hours": r(self.expected_hours, 2), "expected_usd": r(self.expected_usd, 2),
                "expected_preemptions": r(self.expected_preemptions, 2)}


@dataclass(frozen=True)
class Infeasible:
    """A type the job cannot use, and why."""

    instance_type: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        """{instance_type, reason}."""
        return {"instance_type": self.instance_type, "reason": self.reason}


@dataclass(frozen=True)
class Plan:
    """Candidates in rank order (best first), the on-demand reference, and what cannot run."""

    candidates: list[Candidate]
    infeasible: list[Infeasible]
    reference: Candidate | None
    reference_instance: str
    work_reference_hours: float | None = None   # remaining work in reference-hours
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """`spotrun plan --json`."""
        return {"reference": self.reference.to_dict() if self.reference else None,
                "candidates": [c.to_dict() for c in self.candidates],
                "infeasible": [i.to_dict() for i in self.infeasible]}


def rank_candidates(spec: JobSpec, *, catalog: Catalog, zones: Iterable[str], prices: PriceSource,
                    history: HistorySource, region: str, now: datetime,
                    job_id: str | None = None, steps_done: int = 0,
                    scaling: ScalingCurve | None = None, priors: Priors | None = None) -> Plan:
    """Rank every pool the spec allows by modelled $ per reference-hour of progress."""
    priors = priors or priors_from_catalog(catalog)
    scaling = scaling or _spec_scaling(spec) or default_scaling(catalog)
    zone_list = list(spec.resources.zones) or list(zones)
    nodes = spec.resources.nodes
    job = history.job_stats(job_id) if job_id else JobStats()
    pools = history.pool_stats(now, priors.recency_half_life_h)
    per_type_restart = _restart_by_type(pools)

    infeasible: list[Infeasible] = []
    feasible: list[InstanceType] = []
    for name in (spec.resources.instance_types or catalog.names()):
        t = catalog.get(name)
        why = _type_reason(t, spec, nodes)
        if why:
            infeasible.append(Infeasible(name, why))
        else:
            feasible.append(t)

    def speed_of(t: InstanceType) -> float:
        return instance_speed(catalog, t, precision=spec.model.precision,
                              sharding=spec.model.sharding, scaling=scaling)

    ref_name = spec.work.reference_instance or str(catalog.meta.get("reference_instance", "")) \
        or catalog.names()[0]
    ref_type = catalog.get(ref_name)
    speedups, sps_ref = _speedups(catalog, feasible + [ref_type], speed_of(ref_type), speed_of,
                                  job, ref_name)
    work_h = _work_reference_hours(spec, steps_done, sps_ref)
    hours_left = _hours_left(spec, now)

    markets = {MarketPolicy.SPOT: [Market.SPOT], MarketPolicy.ON_DEMAND: [Market.ON_DEMAND],
               MarketPolicy.AUTO: [Market.SPOT, Market.ON_DEMAND]}[spec.policy.market]
    cap = spec.policy.max_price_usd_per_hour
    out: list[Candidate] = []
    od_rows: dict[str, Candidate] = {}
    for t in feasible + ([ref_type] if ref_type not in feasible else []):
        is_candidate = t in feasible
        ckpt_s = _checkpoint_cost_s(spec, t, nodes, job, priors)
        speed_src = "measured" if t.name in job.steps_per_s else "catalog"
        reasons: list[str] = []
        od_price = safe_price(prices.on_demand_price, t.name)
        for z in zone_list:
            for market in (Market.SPOT, Market.ON_DEMAND):
                if market is Market.SPOT and (not is_candidate or market not in markets):
                    continue
                price = od_price if market is Market.ON_DEMAND \
                    else safe_price(prices.spot_price, t.name, z)
                if price is None:
                    if market in markets:
                        reasons.append(f"no {market.value} price")
                    continue
                c = _candidate(t, z, market, price, speedups[t.name], ckpt_s, spec, priors,
                               pools.get((t.name, z)), per_type_restart.get(t.name), work_h,
                               nodes, speed_src, hours_left)
                if market is Market.ON_DEMAND:
                    od_rows.setdefault(t.name, c)
                    if not is_candidate or market not in markets:
                        continue
                if c.progress_fraction < MIN_PROGRESS_FRACTION:
                    reasons.append(f"{z} reclaims every {c.mtbf_h:.2f} h: no progress expected")
                    continue
                if cap is not None and price > cap:
                    reasons.append(f"price {price:.3f} above policy.max_price_usd_per_hour {cap:g}")
                    continue
                out.append(c)
        if is_candidate and not any(c.instance_type == t.name for c in out):
            why = "; ".join(dict.fromkeys(reasons)) or "no zone to run in"
            infeasible.append(Infeasible(t.name, why))

    out.sort(key=_rank_key)
    reference = _reference(od_rows, ref_name, {t.name for t in feasible})
    notes = [] if ref_name in {t.name for t in feasible} else [
        f"reference {ref_name} cannot run this job; it is the speed unit only"]
    return Plan(candidates=out, infeasible=infeasible, reference=reference,
                reference_instance=ref_name, work_reference_hours=work_h, notes=notes)


def _rank_key(c: Candidate) -> tuple[Any, ...]:
    # Cheapest progress first; among equals the faster one; a deadline miss goes last.
    return (c.misses_deadline, c.usd_per_reference_hour, -(c.speedup * c.progress_fraction),
            c.instance_type, c.zone, c.market.value)


def _reference(od_rows: dict[str, Candidate], ref_name: str, feasible: set[str]) -> Candidate | None:
    """The reference on-demand row: the reference type if it can run the job, else the best."""
    if ref_name in od_rows and ref_name in feasible:
        return od_rows[ref_name]
    usable = [c for n, c in od_rows.items() if n in feasible]
    return min(usable, key=_rank_key) if usable else None


def _type_reason(t: InstanceType, spec: JobSpec, nodes: int) -> str | None:
    if t.gpus < spec.resources.gpus:
        return f"has {t.gpus} GPU(s); the job needs at least {spec.resources.gpus} (resources.gpus)"
    return memory_reason(t, spec, t.gpus * nodes)


def _candidate(t: InstanceType, zone: str, market: Market, price: float, speedup: float,
               ckpt_s: float, spec: JobSpec, priors: Priors, obs: PoolStats | None,
               type_restart: tuple[float, int] | None, work_h: float | None, nodes: int,
               speed_src: str, hours_left: float | None) -> Candidate:
    restart_s = _restart_s(obs, type_restart, priors)
    if market is Market.SPOT:
        prior = priors.zone(zone)
        n = obs.reclaims if obs else 0.0
        h = obs.run_hours if obs else 0.0
        # The zone prior counts as one pseudo-reclaim in its mean stretch (a Gamma prior):
        # weak, so the pool's own record takes over after a few reclaims.
        mtbf_h: float | None = (h + prior.mtbf_h) / (n + 1.0)
        caught = obs.notices_caught if obs else 0.0
        notice = (caught + 2.0 * priors.notice_caught) / (n + 2.0)
    else:
        mtbf_h, notice = None, 1.0
    if spec.checkpoint.interval_minutes is not None:
        interval_s = spec.checkpoint.interval_minutes * 60.0
    else:
        interval_s = recommended_interval_s(ckpt_s, mtbf_h, min_s=priors.interval_min_s,
                                            max_s=priors.interval_max_s)
    frac = progress_fraction(mtbf_h=mtbf_h, restart_s=restart_s, checkpoint_cost_s=ckpt_s,
                             interval_s=interval_s, notice_caught=notice)
    e = expected(work_reference_hours=work_h, price_usd_per_hour=price, speedup=speedup,
                 fraction=frac, mtbf_h=mtbf_h, restart_s=restart_s)
    misses = hours_left is not None and e.hours is not None and e.hours > hours_left
    return Candidate(instance_type=t.name, zone=zone, market=market, price_usd_per_hour=price,
                     speedup=speedup, progress_fraction=frac,
                     usd_per_reference_hour=e.usd_per_reference_hour, expected_hours=e.hours,
                     expected_usd=e.usd, expected_preemptions=e.preemptions,
                     checkpoint_interval_s=interval_s, gpus=t.gpus * nodes, mtbf_h=mtbf_h,
                     restart_s=restart_s, checkpoint_cost_s=ckpt_s, speed_source=speed_src,
                     misses_deadline=misses)


def _restart_s(obs: PoolStats | None, type_restart: tuple[float, int] | None,
               priors: Priors) -> float:
    # Mean of what this pool (else this type anywhere) showed, the prior counting as one sample.
    if obs and obs.restarts:
        total, n = obs.restart_s_total, obs.restarts
    elif type_restart:
        total, n = type_restart
    else:
        total, n = 0.0, 0
    return (total + priors.restart_s) / (n + 1)


def _restart_by_type(pools: dict[tuple[str, str], PoolStats]) -> dict[str, tuple[float, int]]:
    out: dict[str, tuple[float, int]] = {}
    for (t, _z), st in pools.items():
        tot, n = out.get(t, (0.0, 0))
        out[t] = (tot + st.restart_s_total, n + st.restarts)
    return {t: v for t, v in out.items() if v[1]}


def _checkpoint_cost_s(spec: JobSpec, t: InstanceType, nodes: int, job: JobStats,
                       priors: Priors) -> float:
    if job.checkpoint_save_s is not None:
        return job.checkpoint_save_s
    gb = checkpoint_gb(spec, t.gpus * nodes)
    if gb is None:
        return priors.checkpoint_min_s
    return max(priors.checkpoint_min_s, gb * priors.checkpoint_s_per_gb)


def _speedups(catalog: Catalog, types: list[InstanceType], ref_speed: float, speed_of: Any,
              job: JobStats, ref_name: str) -> tuple[dict[str, float], float | None]:
    """Speedup over the reference per type; measured steps/s replace the catalog prior.

    The job's steps/s on the reference is measured there, or inferred from each measured type
    through its catalog speed (geometric mean): so two measured types also fix their ratio.
    """
    prior = {t.name: speed_of(t) / ref_speed for t in types}
    sps = {n: v for n, v in job.steps_per_s.items() if n in catalog}
    if not sps:
        return prior, None
    if ref_name in sps:
        sps_ref = sps[ref_name]
    else:
        logs = [math.log(v / (speed_of(catalog.get(n)) / ref_speed)) for n, v in sps.items()]
        sps_ref = math.exp(sum(logs) / len(logs))
    out = dict(prior)
    for n, v in sps.items():
        out[n] = v / sps_ref
    return out, sps_ref


def _work_reference_hours(spec: JobSpec, steps_done: int, sps_ref: float | None) -> float | None:
    """Remaining work in hours on the reference at full progress; None without `work`."""
    total = spec.work.total_steps
    if total is not None and sps_ref:
        return max(total - steps_done, 0) / sps_ref / 3600.0
    if spec.work.reference_hours is not None:
        left = 1.0 if not total else max(total - steps_done, 0) / total
        return spec.work.reference_hours * left
    return None


def _hours_left(spec: JobSpec, now: datetime) -> float | None:
    if not spec.policy.deadline:
        return None
    deadline = datetime.fromisoformat(spec.policy.deadline)
    return (deadline - now).total_seconds() / 3600.0


def _spec_scaling(spec: JobSpec) -> ScalingCurve | None:
    raw = getattr(spec.work, "scaling", None)
    return ScalingCurve.from_mapping(dict(raw)) if raw else None
