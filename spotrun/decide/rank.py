"""rank: every (type, zone, market, GPU count) the job may use, by expected $ per unit of progress.

GPU units: `resources.gpus: N` is the count the job uses on each node. Speed and per-GPU memory
follow the GPUs used; the price is the whole node's. A range lets each type use the count that
gives the cheapest progress there. Every pool not offered carries a Rejection with its reason,
and whether it can never run the job (`never`) or cannot now (`now`: prices, capacity).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from spotrun.catalog import Catalog, InstanceType
from spotrun.costmodel.history import HistorySource, JobStats, PoolStats
from spotrun.costmodel.memory import checkpoint_gb, memory_reason
from spotrun.costmodel.model import expected, progress_fraction, recommended_interval_s
from spotrun.costmodel.notice_loss import (DEFAULT_STEP_S, GENERIC_NOTICE, NoticePrior, reclaim_loss,
                                      usable_notice_chance)
from spotrun.costmodel.priors import Priors, priors_from_catalog
from spotrun.costmodel.speed import ScalingCurve, default_scaling, instance_speed
from spotrun.decide.market import MarketSnapshot
from spotrun.decide.quarantine import quarantine_reason
from spotrun.spec import JobSpec
from spotrun.states import Market, MarketPolicy

MIN_PROGRESS_FRACTION = 0.01   # below this a pool reclaims faster than the job can progress
NO_PROGRESS = "no progress expected"
NEVER, NOW = "never", "now"


@dataclass(frozen=True)
class Candidate:
    """One pool the job could run in, with the model's figures."""

    instance_type: str
    zone: str
    market: Market
    price_usd_per_hour: float      # per node, the whole node
    speedup: float                 # throughput of all nodes over the reference (1.0 = same)
    progress_fraction: float       # share of billed time that becomes kept progress
    usd_per_reference_hour: float  # price x nodes / (speedup x progress_fraction)
    expected_hours: float | None   # for the remaining work; None without `work`
    expected_usd: float | None
    expected_preemptions: float | None
    checkpoint_interval_s: float   # provider-clock seconds (Young/Daly or the spec's interval)
    gpus: int = 1                  # GPUs the job uses per node (SPOTRUN_GPUS)
    node_gpus: int = 1             # GPUs the node has (all paid for)
    nodes: int = 1
    mtbf_h: float | None = None    # modelled hours between reclaims (None: on-demand)
    restart_s: float = 0.0
    checkpoint_cost_s: float = 0.0
    speed_source: str = "catalog"  # catalog | measured
    reclaims_source: str = "none"  # where the reclaim rate came from (tags, e.g. trace+observed)
    reclaims_detail: str = ""      # one human line: which family, zone, files, observations
    misses_deadline: bool = False
    efa: bool = False              # nodes talk over EFA (catalog); scales better across nodes
    notice_usable: float = 1.0     # P(a reclaim brings a usable notice) here (costmodel/notice)
    loss_per_reclaim_s: float = 0.0   # expected work lost per reclaim (seconds)
    loss_honoured_s: float = 0.0   # lost per reclaim when the notice is honoured
    notice_detail: str = ""        # why no notice is usable here, when none is
    cloud: str = ""                # the provider whose pool this is (several clouds)
    # The move of the resume checkpoint from another cloud before this attempt's first step
    # (decide/clouds.py): egress billed, wall seconds of copying. Both in expected_usd and
    # expected_hours, and its share in usd_per_reference_hour; 0 inside the checkpoint's cloud.
    egress_usd: float = 0.0
    transfer_s: float = 0.0

    @property
    def reclaims_per_hour(self) -> float:
        """Modelled reclaims per hour of the job (0 on on-demand)."""
        if self.mtbf_h is None or math.isinf(self.mtbf_h) or self.mtbf_h <= 0:
            return 0.0
        return self.nodes / self.mtbf_h

    def to_dict(self) -> dict[str, Any]:
        """The JSON row of `spotrun plan --json` and `submit --dry-run --json`."""
        def r(x: float | None, n: int) -> float | None:
            return None if x is None else (x if math.isinf(x) else round(x, n))
        return {"instance_type": self.instance_type, "zone": self.zone,
                "market": self.market.value, "gpus_used": self.gpus,
                "node_gpus": self.node_gpus, "nodes": self.nodes,
                "price_usd_per_hour": r(self.price_usd_per_hour, 4),
                "total_price_usd_per_hour": r(self.price_usd_per_hour * self.nodes, 4),
                "speedup": r(self.speedup, 4), "speed_source": self.speed_source,
                "progress_fraction": r(self.progress_fraction, 4),
                "usd_per_reference_hour": r(self.usd_per_reference_hour, 4),
                "expected_hours": r(self.expected_hours, 3),
                "expected_usd": r(self.expected_usd, 4),
                "expected_preemptions": r(self.expected_preemptions, 2),
                "reclaims_per_hour": r(self.reclaims_per_hour, 4),
                "reclaims_per_hour_source": self.reclaims_source,
                "reclaims_per_hour_detail": self.reclaims_detail,
                "checkpoint_interval_s": r(self.checkpoint_interval_s, 1),
                "notice_usable": r(self.notice_usable, 4),
                "loss_per_reclaim_s": r(self.loss_per_reclaim_s, 1),
                "notice_detail": self.notice_detail,
                "misses_deadline": self.misses_deadline, "efa": self.efa,
                "cloud": self.cloud, "egress_usd": r(self.egress_usd, 4),
                "transfer_s": r(self.transfer_s, 1)}


@dataclass(frozen=True)
class Rejection:
    """A type (or one of its pools) the job cannot use, and why."""

    instance_type: str
    reason: str
    kind: str = NEVER              # never: no market change helps; now: prices or capacity
    zone: str | None = None
    market: str | None = None
    mtbf_h: float | None = None    # the job's modelled hours between reclaims (no progress)

    def to_dict(self) -> dict[str, Any]:
        """{instance_type, zone, market, kind, reason}."""
        return {"instance_type": self.instance_type, "zone": self.zone, "market": self.market,
                "kind": self.kind, "reason": self.reason}


@dataclass(frozen=True)
class Ranking:
    """Candidates in rank order (best first), the on-demand reference, and what cannot run."""

    candidates: list[Candidate]
    rejected: list[Rejection]
    reference: Candidate | None
    reference_instance: str
    work_reference_hours: float | None = None   # remaining work in reference-hours
    notes: list[str] = field(default_factory=list)


def rank(spec: JobSpec, *, catalog: Catalog, market: MarketSnapshot, history: HistorySource,
         hours_left: float | None, job_id: str | None = None, steps_done: int = 0,
         priors: Priors | None = None, risk: Any = None,
         notice: NoticePrior | None = None, time_scale: float = 1.0) -> Ranking:
    """Rank every pool the spec allows by modelled $ per reference-hour of progress.

    `notice` is the provider's interruption notice (ProviderFacts, costmodel.notice_prior_of);
    without one, GENERIC_NOTICE.
    """
    notice = notice or GENERIC_NOTICE
    priors = priors or priors_from_catalog(catalog)
    scaling = spec_scaling(spec) or default_scaling(catalog)
    zone_list = [z for z in (spec.resources.zones or market.zones)]
    nodes = spec.resources.nodes
    job = history.job_stats(job_id) if job_id else JobStats()
    pools = history.pool_stats(market.at, priors.recency_half_life_h)
    per_type_restart = _restart_by_type(pools)
    # One chance for every pool: whether a notice is usable is the provider's and the job's.
    p_notice = usable_notice_chance(notice, job.reclaims)

    rejected: list[Rejection] = []
    usable: dict[str, list[int]] = {}
    for name in (spec.resources.instance_types or catalog.names()):
        t = catalog.get(name)
        counts, why = _gpu_counts(t, spec, nodes)
        if why:
            rejected.append(Rejection(name, why, NEVER))
        else:
            usable[name] = counts

    ref_name = spec.work.reference_instance or str(catalog.meta.get("reference_instance", "")) \
        or catalog.names()[0]
    ref_type = catalog.get(ref_name)
    ref_gpus = min(spec.resources.gpus, ref_type.gpus)

    speeds: dict[tuple[str, int, int], float] = {}   # the same for every zone and market

    def speed_of(t: InstanceType, g: int, n: int = 1) -> float:
        key = (t.name, g, n)
        got = speeds.get(key)
        if got is None:
            got = speeds[key] = instance_speed(
                catalog, t, precision=spec.model.precision, sharding=spec.model.sharding,
                scaling=scaling, gpus=g, nodes=n)
        return got

    ref_speed = speed_of(ref_type, ref_gpus)
    sps_ref = _sps_reference(catalog, job, ref_name, lambda t: speed_of(t, ref_gpus) / ref_speed)
    work_h = _work_reference_hours(spec, steps_done, sps_ref)
    ref_step_s = _reference_step_s(spec, sps_ref)
    loss_in = (p_notice, notice.window_s, ref_step_s)

    markets = {MarketPolicy.SPOT: [Market.SPOT], MarketPolicy.ON_DEMAND: [Market.ON_DEMAND],
               MarketPolicy.AUTO: [Market.SPOT, Market.ON_DEMAND]}[spec.policy.market]
    cap = spec.policy.max_price_usd_per_hour
    out: list[Candidate] = []
    od_rows: dict[str, Candidate] = {}
    types = list(usable) + ([ref_name] if ref_name not in usable else [])
    for name in types:
        t = catalog.get(name)
        is_candidate = name in usable
        counts = usable.get(name) or [ref_gpus]
        od_price = market.on_demand_price(name)
        reasons: list[Rejection] = []
        for z in zone_list:
            for m in (Market.SPOT, Market.ON_DEMAND):
                if m is Market.SPOT and (not is_candidate or m not in markets):
                    continue
                price = od_price if m is Market.ON_DEMAND else market.spot_price(name, z)
                if price is None:
                    if m in markets and is_candidate:
                        reasons.append(Rejection(name, f"no {m.value} price in {z}", NOW, z,
                                                 m.value))
                    continue
                best = None
                for g in counts:
                    speedup = _speedup(name, g, speed_of(t, g, nodes) / ref_speed, job,
                                       sps_ref, counts)
                    c = _candidate(t, z, m, price, speedup, g, spec, priors, risk,
                                   pools.get((name, z)), per_type_restart.get(name), work_h,
                                   nodes, job, hours_left, loss_in, time_scale=time_scale)
                    if best is None or rank_key(c) < rank_key(best):
                        best = c
                assert best is not None
                c = best
                if m is Market.ON_DEMAND:
                    od_rows.setdefault(name, c)
                    if not is_candidate or m not in markets:
                        continue
                stuck = _no_progress(c)
                if stuck:
                    # The loss per reclaim is the job's own, the reclaim rate the pool's long-run
                    # one: waiting does not fix it (submit refuses a job with nothing else).
                    reasons.append(Rejection(name, stuck, NEVER, z, m.value,
                                             mtbf_h=c.mtbf_h / max(c.nodes, 1)))
                    continue
                if cap is not None and price > cap:
                    reasons.append(Rejection(
                        name, f"{m.value} price ${price:.3f}/h in {z} is above "
                              f"policy.max_price_usd_per_hour ${cap:g}/h", NOW, z, m.value))
                    continue
                if m is Market.SPOT and not market.is_available(name, z):
                    reasons.append(Rejection(name, f"no spot capacity in {z} now", NOW, z,
                                             m.value))
                    continue
                notice = market.notice_in(name, z) if m is Market.SPOT else None
                if notice is not None:
                    # Capacity is being taken back there: the next launch would likely be
                    # the next reclaim (decide/quarantine.py).
                    reasons.append(Rejection(name, quarantine_reason(market.quarantine, notice),
                                             NOW, z, m.value))
                    continue
                out.append(c)
        rejected.extend(reasons)
        if is_candidate and not reasons and not any(c.instance_type == name for c in out):
            rejected.append(Rejection(name, "no zone to run in", NEVER))

    out.sort(key=rank_key)
    reference = _reference(od_rows, ref_name, set(usable))
    notes = [] if ref_name in usable else [
        f"reference {ref_name} cannot run this job; it is the speed unit only"]
    return Ranking(candidates=out, rejected=rejected, reference=reference,
                   reference_instance=ref_name, work_reference_hours=work_h, notes=notes)


def _no_progress(c: Candidate) -> str | None:
    """Why the pool gives the job no progress, or None.

    With a usable notice only the honoured-notice loss can make it so: reclaims without one
    cost more, but a pool whose honoured reclaims leave progress still runs the job.
    """
    if c.mtbf_h is None or c.progress_fraction >= MIN_PROGRESS_FRACTION:
        return None
    job_mtbf_h = c.mtbf_h / max(c.nodes, 1)
    if c.notice_usable > 0:
        best = progress_fraction(mtbf_h=job_mtbf_h, restart_s=c.restart_s,
                                 checkpoint_cost_s=c.checkpoint_cost_s,
                                 interval_s=c.checkpoint_interval_s,
                                 lost_per_reclaim_s=c.loss_honoured_s)
        if best >= MIN_PROGRESS_FRACTION:
            return None
        lost = f"{c.loss_honoured_s / 3600.0:.2f} h even with the notice"
    else:
        lost = f"{c.loss_per_reclaim_s / 3600.0:.2f} h ({c.notice_detail})"
    return f"{c.zone} reclaims every {job_mtbf_h:.2f} h, each losing {lost}: {NO_PROGRESS}"


def rank_key(c: Candidate) -> tuple[Any, ...]:
    """Cheapest progress first; among equals the faster one; a deadline miss goes last."""
    return (c.misses_deadline, c.usd_per_reference_hour, -(c.speedup * c.progress_fraction),
            c.instance_type, c.zone, c.market.value, -c.gpus)


def _reference(od_rows: dict[str, Candidate], ref_name: str, usable: set[str]) -> Candidate | None:
    """The reference on-demand row: the reference type if it can run the job, else the best."""
    if ref_name in od_rows and ref_name in usable:
        return od_rows[ref_name]
    rows = [c for n, c in od_rows.items() if n in usable]
    return min(rows, key=rank_key) if rows else None


def _gpu_counts(t: InstanceType, spec: JobSpec, nodes: int) -> tuple[list[int], str | None]:
    """The GPU counts per node the job may use on t, or why none."""
    counts = spec.resources.gpu_counts(t.gpus)
    if not counts:
        return [], (f"has {t.gpus} GPU(s) per node; the job uses {spec.resources.gpus_text()} "
                    f"(resources.gpus)")
    fits = [g for g in counts if memory_reason(t, spec, g * nodes) is None]
    if not fits:
        return [], memory_reason(t, spec, counts[-1] * nodes)
    return fits, None


def _candidate(t: InstanceType, zone: str, market: Market, price: float, speedup: float,
               gpus: int, spec: JobSpec, priors: Priors, risk: Any, obs: PoolStats | None,
               type_restart: tuple[float, int] | None, work_h: float | None, nodes: int,
               job: JobStats, hours_left: float | None,
               loss_in: tuple[float, float, float | None], *,
               time_scale: float = 1.0) -> Candidate:
    restart_s = _restart_s(obs, type_restart, priors)
    ckpt_s = _checkpoint_cost_s(spec, gpus * nodes, job, priors)
    source, detail = "none", "on-demand: not reclaimed"
    if market is Market.SPOT:
        prior_up, prior_n, source, detail = _risk_prior(risk, priors, t.name, zone)
        n = obs.reclaims if obs else 0.0
        h = obs.run_hours if obs else 0.0
        # The prior counts as its pseudo-reclaims over its pseudo-hours (a Gamma prior, at most
        # one pseudo-reclaim's weight): the pool's own record takes over after a few reclaims.
        weight = min(1.0, 1.0 / max(prior_n, 1e-9))
        mtbf_h: float | None = (h + prior_up * weight) / (n + prior_n * weight)
        if n or h:
            source += "+observed"
            detail += f"; observed {n:g} reclaim(s) in {h:.1f} h on this pool"
        # A job of N nodes is reclaimed when any of its nodes is.
        mtbf_h = mtbf_h / max(nodes, 1)
    else:
        mtbf_h = None
    interval_s = checkpoint_interval_s(spec, ckpt_s, mtbf_h, priors, time_scale)
    p_notice, window_s, ref_step_s = loss_in
    # The emergency save writes what a periodic save writes: the checkpoint size model's cost.
    loss = reclaim_loss(usable=p_notice, window_s=window_s,
                        step_s=ref_step_s / speedup if ref_step_s and speedup > 0
                        else DEFAULT_STEP_S, save_s=ckpt_s, interval_s=interval_s,
                        mtbf_h=mtbf_h)
    frac = progress_fraction(mtbf_h=mtbf_h, restart_s=restart_s, checkpoint_cost_s=ckpt_s,
                             interval_s=interval_s, lost_per_reclaim_s=loss.expected_s)
    e = expected(work_reference_hours=work_h, price_usd_per_hour=price * nodes, speedup=speedup,
                 fraction=frac, mtbf_h=mtbf_h, restart_s=restart_s)
    misses = hours_left is not None and e.hours is not None and e.hours > hours_left
    return Candidate(instance_type=t.name, zone=zone, market=market, price_usd_per_hour=price,
                     speedup=speedup, progress_fraction=frac,
                     usd_per_reference_hour=e.usd_per_reference_hour, expected_hours=e.hours,
                     expected_usd=e.usd, expected_preemptions=e.preemptions,
                     checkpoint_interval_s=interval_s, gpus=gpus, node_gpus=t.gpus, nodes=nodes,
                     mtbf_h=(mtbf_h * max(nodes, 1)) if mtbf_h is not None else None,
                     restart_s=restart_s, checkpoint_cost_s=ckpt_s,
                     speed_source="measured" if t.name in job.steps_per_s else "catalog",
                     reclaims_source=source, reclaims_detail=detail, misses_deadline=misses,
                     efa=t.efa, notice_usable=loss.usable,
                     loss_per_reclaim_s=loss.expected_s if mtbf_h is not None else 0.0,
                     loss_honoured_s=loss.honoured_s, notice_detail=loss.detail)


def _risk_prior(risk: Any, priors: Priors, itype: str, zone: str
                ) -> tuple[float, float, str, str]:
    """(pseudo-hours, pseudo-reclaims, source, detail) of a pool's reclaim prior."""
    if risk is not None:
        p = risk.prior(itype, zone)
        return float(p.up_hours), float(p.reclaims), str(p.source), str(p.detail)
    z = priors.zone(zone)
    return (z.up_hours, float(max(z.reclaims, 1)), "zone-prior",
            f"the catalog's zone prior for {zone} (every type)")


def checkpoint_interval_s(spec: JobSpec, checkpoint_cost_s: float, mtbf_h: float | None,
                          priors: Priors, time_scale: float = 1.0) -> float:
    """The one checkpoint interval rule, on the provider's clock: the spec's fixed interval,
    else Young/Daly between the priors' bounds.

    A save costs real time, so Young/Daly and its floor are wall seconds of training: on a
    clock that runs time_scale times the wall while jobs train (the paced local market) the
    MTBF is divided by it first, or `auto` would save every wall second at x60. The ceiling
    is on the provider's clock: the work and money at risk between saves; where the two
    bounds cross (a clock faster than max/min) the ceiling wins.
    """
    if spec.checkpoint.interval_minutes is not None:
        return spec.checkpoint.interval_minutes * 60.0
    wall_mtbf_h = None if mtbf_h is None else mtbf_h / time_scale
    wall_s = recommended_interval_s(checkpoint_cost_s, wall_mtbf_h,
                                    min_s=priors.interval_min_s, max_s=math.inf)
    return min(wall_s * time_scale, priors.interval_max_s)


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


def _checkpoint_cost_s(spec: JobSpec, gpus_total: int, job: JobStats, priors: Priors) -> float:
    if job.checkpoint_save_s is not None:
        return job.checkpoint_save_s
    gb = checkpoint_gb(spec, gpus_total)
    if gb is None:
        return priors.checkpoint_min_s
    return max(priors.checkpoint_min_s, gb * priors.checkpoint_s_per_gb)


def _sps_reference(catalog: Catalog, job: JobStats, ref_name: str, prior: Any) -> float | None:
    """The job's steps/s on the reference: measured there, or inferred from measured types.

    Inferred through each measured type's catalog speedup (geometric mean), so two measured
    types also fix their ratio.
    """
    sps = {n: v for n, v in job.steps_per_s.items() if n in catalog}
    if not sps:
        return None
    if ref_name in sps:
        return sps[ref_name]
    logs = [math.log(v / prior(catalog.get(n))) for n, v in sps.items()]
    return math.exp(sum(logs) / len(logs))


def _speedup(name: str, gpus: int, prior: float, job: JobStats, sps_ref: float | None,
             counts: list[int]) -> float:
    """Measured steps/s (at the count it ran, the largest usable) replace the catalog prior."""
    if sps_ref and name in job.steps_per_s and gpus == counts[-1]:
        return job.steps_per_s[name] / sps_ref
    return prior


def _work_reference_hours(spec: JobSpec, steps_done: int, sps_ref: float | None) -> float | None:
    """Remaining work in hours on the reference at full progress; None without `work`."""
    total = spec.work.total_steps
    if total is not None and sps_ref:
        return max(total - steps_done, 0) / sps_ref / 3600.0
    if spec.work.reference_hours is not None:
        left = 1.0 if not total else max(total - steps_done, 0) / total
        return spec.work.reference_hours * left
    return None


def _reference_step_s(spec: JobSpec, sps_ref: float | None) -> float | None:
    """Seconds per step on the reference: measured, else the spec's steps over its hours."""
    if sps_ref:
        return 1.0 / sps_ref
    if spec.work.total_steps and spec.work.reference_hours:
        return spec.work.reference_hours * 3600.0 / spec.work.total_steps
    return None


def spec_scaling(spec: JobSpec) -> ScalingCurve | None:
    """The spec's own scaling curve (work.scaling), or None for the catalog's default."""
    raw = spec.work.scaling
    return ScalingCurve.from_mapping(dict(raw)) if raw else None
