"""The daemon's call into the one decision (spotrun.decide), with its live inputs.

The market snapshot and the reclaim-risk hints come from the provider, the history and the
recent interruption notices (on the snapshot) from the state database, the deadline from the
job row (fixed once on the provider's clock); everything else is `decide` itself.

A scheduling pass reads what its decisions share once (`PassInputs`): one market read for
every job, one risk model per (types, zones) kept while the provider's hints stay the same,
the pool history once, each job's attempts from the pass's one query. A job's decision then
stands (`Decisions`) until an input of it changes: its spec, its own history, the market
(`snapshot_fingerprint`, with the pools recent notices close), the fleet's reclaims and
restarts, the risk hints, or its deadline's slack crossing a bound where a pool starts or
stops missing the deadline.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Iterable

from sqlalchemy import case, func
from sqlmodel import select

from spotrun.providers.facts import catalog_for
from spotrun.costmodel import DbHistory, JobStats
from spotrun.costmodel.history import reclaim_records
from spotrun.costmodel.notice_loss import notice_prior_of
from spotrun.costmodel.risk import risk_model
from spotrun.daemon.context import DaemonContext
from spotrun.db import Attempt, Job, session
from spotrun.decide import MarketSnapshot, Placement, Ranking, decide, hours_left
from spotrun.decide.clouds import CheckpointAt, merge, spec_in_cloud
from spotrun.decide.market import SnapshotSource
from spotrun.decide.quarantine import recent_notices
from spotrun.providers.facts import facts_for
from spotrun.daemon.moves import resume_location
from spotrun.zones import known_zones
from spotrun.errors import SpotrunError
from spotrun.spec import JobSpec
from spotrun.states import EndReason

# A standing decision is made again after this long (wall) whatever else holds: what no key
# tracks (the pool history's slow decay, hours run on pools) moves on slowly.
REDECIDE_AFTER_S = 600.0
# A deadline job is decided again once its slack shrank by this share since its decision.
SLACK_STEP = 0.05


def placement_for(ctx: DaemonContext, job: Job, spec: JobSpec, *,
                  inputs: "PassInputs | None" = None) -> Placement:
    """Where the job's next attempt should run, decided on what the daemon sees now (with
    several clouds: over each cloud the job may use, spotrun.decide.clouds)."""
    inputs = inputs or PassInputs(ctx)
    # Jobs of one spec and no history yet (a sweep, a queue filled from one file) get one
    # decision: its inputs are the same, the job's id only names its (empty) history.
    alike = inputs.alike_key(job)
    if alike is not None and alike in inputs.decided:
        return inputs.decided[alike]
    if ctx.several:
        placed = across_clouds(ctx, job, spec, inputs)
    else:
        placed = _decide_in(ctx, job, spec, inputs)
    if alike is not None:
        inputs.decided[alike] = placed
    return placed


def _decide_in(ctx: DaemonContext, job: Job, spec: JobSpec, inputs: "PassInputs") -> Placement:
    """The decision in one cloud, on its pass inputs."""
    market = inputs.market(spec.resources.zones)
    types = list(spec.resources.instance_types or inputs.catalog.names())
    return decide(spec, catalog=inputs.catalog, market=market, history=inputs.history,
                  hours_left=hours_left(spec.policy.deadline, market.at),
                  time_scale=ctx.time_scale, job_id=job.id, steps_done=job.last_step,
                  risk=inputs.risk(types, market.zones), notice=inputs.notice)


def across_clouds(ctx: DaemonContext, job: Job, spec: JobSpec,
                  inputs: "PassInputs") -> Placement:
    """Each cloud the job may use decided on its own inputs, then one order with the move of
    the job's resume checkpoint priced (spotrun.decide.clouds.merge)."""
    catalogs = {c: inputs.peer(c).catalog for c in ctx.peers}
    placed: dict[str, Placement] = {}
    units: dict[str, float] = {}
    left: dict[str, str] = {}
    for cloud in ctx.peers:
        if spec.resources.clouds and cloud not in spec.resources.clouds:
            continue
        peer = ctx.peers[cloud]
        cut, why = spec_in_cloud(spec, catalogs[cloud], known_zones(peer.settings), catalogs)
        if cut is None:
            left[cloud] = why
            continue
        try:
            placed[cloud] = _decide_in(peer, job, cut.spec, inputs.peer(cloud))
        except SpotrunError as exc:
            # A cloud that cannot be read now (credentials, its API down) takes no part in
            # this decision; the others go on (`spotrun doctor` names what to fix).
            left[cloud] = f"its market could not be read ({exc})"
            continue
        units[cloud] = cut.unit
    if not placed:
        home = inputs.peer(ctx.cloud)
        return Placement(candidates=[], ranking=Ranking([], [], None, ""),
                         market=home.market(None), wait_reason="no cloud it may use can run "
                         "it: " + "; ".join(f"{c}: {w}" for c, w in left.items()))
    at = inputs.checkpoint_at(job)
    return merge(placed, at, hours_left(spec.policy.deadline, next(
        iter(placed.values())).market.at), left, units)


class RiskModels:
    """Risk models per (types, zones), each kept while the provider's hints stay the same
    (a model memoizes its per-pool priors, so a kept one answers from memory)."""

    def __init__(self) -> None:
        self._models: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[Any, Any, int]] = {}

    def get(self, ctx: DaemonContext, catalog: Any, types: tuple[str, ...],
            zones: tuple[str, ...]) -> tuple[Any, int]:
        """(model, version): the version changes whenever the hints did."""
        hints = ctx.provider.risk_hints(list(types), list(zones))
        held = self._models.get((types, zones))
        if held is not None and held[0] == hints:
            return held[1], held[2]
        version = held[2] + 1 if held is not None else 0
        model = risk_model(catalog, hints=hints)
        self._models[(types, zones)] = (hints, model, version)
        return model, version


class PassInputs:
    """What the decisions of one scheduling pass share, each read at most once."""

    def __init__(self, ctx: DaemonContext, *, attempts: dict[str, list[Attempt]] | None = None,
                 jobs: dict[str, Job] | None = None, risks: RiskModels | None = None) -> None:
        self.ctx = ctx
        self._attempts_in, self._jobs_in = attempts, jobs
        self._peers: dict[str, PassInputs] = {ctx.cloud: self}
        self._moves: dict[str, CheckpointAt] = {}
        self.catalog = catalog_for(ctx.settings)   # the provider's own catalog
        facts = facts_for(ctx.settings)
        # Every attempt's recent notices (any job) ride on the pass's market: a pool with one
        # is closed to launches for the provider's quarantine (decide/quarantine.py).
        window_s = facts.notice_quarantine_s
        self.source = SnapshotSource(ctx.provider, self.catalog.names(),
                                     notices=lambda at: recent_notices(ctx.engine, at, window_s))
        self.history = PassHistory(ctx.engine, attempts, jobs)
        self.notice = notice_prior_of(facts, ctx.settings)
        self.risks = risks or RiskModels()
        self._risk: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[Any, int]] = {}
        self._fleet: tuple[int, int] | None = None
        self.decided: dict[tuple[Any, ...], Placement] = {}   # by alike_key, this pass

    def peer(self, cloud: str) -> "PassInputs":
        """The pass inputs of another cloud (several clouds), read at most once per pass."""
        got = self._peers.get(cloud)
        if got is None:
            got = self._peers[cloud] = PassInputs(self.ctx.peers[cloud],
                                                  attempts=self._attempts_in,
                                                  jobs=self._jobs_in, risks=self.risks)
        return got

    def checkpoint_at(self, job: Job) -> CheckpointAt:
        """Where the job's resume checkpoint is and its size (several clouds): the store of
        the cloud its last attempt that ran was on; NOWHERE before any attempt ran."""
        got = self._moves.get(job.id)
        if got is None:
            got = self._moves[job.id] = resume_location(self.ctx, job,
                                                        self.history.attempts_of(job.id))
        return got

    def alike_key(self, job: Job) -> tuple[Any, ...] | None:
        """What makes two jobs' decisions the same this pass, for a job without attempts
        (None otherwise, or when the pass did not read the jobs' attempts)."""
        if not self.history.read_attempts_of(job.id) or self.history.attempts_of(job.id):
            return None
        return (job.spec_json, job.deadline_at, job.last_step)

    def market(self, zones: Iterable[str] | None) -> MarketSnapshot:
        """The pass's market over these zones (default: the provider's)."""
        return self.source.snapshot(tuple(zones) if zones else None)

    def risk(self, types: Iterable[str], zones: Iterable[str]) -> Any:
        """The risk model of these types and zones (hints asked once per pass)."""
        return self._risk_of(tuple(types), tuple(zones))[0]

    def risk_version(self, types: Iterable[str], zones: Iterable[str]) -> int:
        """Changes whenever the provider's hints for these types and zones did."""
        return self._risk_of(tuple(types), tuple(zones))[1]

    def _risk_of(self, types: tuple[str, ...], zones: tuple[str, ...]) -> tuple[Any, int]:
        got = self._risk.get((types, zones))
        if got is None:
            got = self._risk[(types, zones)] = self.risks.get(self.ctx, self.catalog, types,
                                                              zones)
        return got

    def fleet(self) -> tuple[int, int]:
        """(reclaims, measured restarts) over every attempt: what moves the pools' history
        in steps (the hours run on pools grow smoothly, see REDECIDE_AFTER_S)."""
        if self._fleet is None:
            q = select(func.count(Attempt.running_at),
                       func.sum(case((Attempt.end_reason == EndReason.RECLAIMED, 1), else_=0)))
            with session(self.ctx.engine) as s:
                restarts, reclaims = s.exec(q).one()
            self._fleet = (int(reclaims or 0), int(restarts or 0))
        return self._fleet


class PassHistory(DbHistory):
    """DbHistory read once per pass: the pool stats once, a job's own from the pass's rows."""

    def __init__(self, engine: Any, attempts: dict[str, list[Attempt]] | None = None,
                 jobs: dict[str, Job] | None = None) -> None:
        super().__init__(engine)
        self._attempts = attempts
        self._jobs = jobs or {}
        self._pools: dict[tuple[datetime, float], Any] = {}

    def read_attempts_of(self, job_id: str) -> bool:
        """True when the pass read this job's attempts (they are all in attempts_of)."""
        return self._attempts is not None and job_id in self._jobs

    def attempts_of(self, job_id: str) -> list[Attempt]:
        """The job's attempts as the pass read them."""
        return (self._attempts or {}).get(job_id, [])

    def pool_stats(self, now: datetime, half_life_h: float) -> Any:
        """DbHistory.pool_stats, once per (time, half-life)."""
        key = (now, half_life_h)
        if key not in self._pools:
            self._pools[key] = super().pool_stats(now, half_life_h)
        return self._pools[key]

    def job_stats(self, job_id: str) -> JobStats:
        """DbHistory.job_stats from the attempts and job row the pass read (else the database)."""
        if not self.read_attempts_of(job_id):
            return super().job_stats(job_id)
        rows = sorted(self.attempts_of(job_id), key=lambda a: a.number)
        # The same reading as DbHistory.job_stats (tests/test_scheduler_pass_cost.py compares).
        speeds: dict[str, float] = {}
        save_s: float | None = None
        for a in rows:
            if a.steps_per_s is not None and a.steps_per_s > 0:
                speeds[a.instance_type] = float(a.steps_per_s)
            if a.checkpoint_save_s is not None and a.checkpoint_save_s >= 0:
                save_s = float(a.checkpoint_save_s)
        return JobStats(steps_per_s=speeds, checkpoint_save_s=save_s,
                        reclaims=reclaim_records(rows, self._jobs[job_id].last_step))


def history_key(job: Job, attempts: list[Attempt]) -> tuple[Any, ...]:
    """What of the job's own rows a decision reads: spec, deadline, step, every attempt."""
    return (job.spec_json, job.deadline_at, job.last_step, tuple(
        (a.id, a.number, a.state, a.end_reason, a.market, a.instance_type, a.zone,
         a.started_at, a.ended_at, a.running_at, a.notice_at, a.start_step, a.last_step,
         a.steps_per_s, a.checkpoint_save_s) for a in attempts))


@dataclass
class _Standing:
    key: tuple[Any, ...]
    placement: Placement
    decided_at: datetime                         # wall time of the pass that decided
    slack_h: float | None                        # hours left to the deadline then
    bounds: tuple[float, float]                  # hours left in which no pool changes sides


class Decisions:
    """Each queued job's last decision and what it was made on (in memory: a restarted
    daemon decides every job once)."""

    def __init__(self) -> None:
        self._held: dict[str, _Standing] = {}

    def key(self, job: Job, spec: JobSpec, attempts: list[Attempt],
            inputs: PassInputs) -> tuple[Any, ...]:
        """Everything but time a decision of the job reads (every cloud's market, with
        several)."""
        zones = spec.resources.zones or None
        if not inputs.ctx.several:
            types = tuple(spec.resources.instance_types or inputs.catalog.names())
            market = inputs.market(zones)
            return (history_key(job, attempts), inputs.source.fingerprint(zones, types),
                    inputs.fleet(), inputs.risk_version(types, market.zones))
        markets: list[Any] = []
        for cloud, peer in inputs.ctx.peers.items():
            pin = inputs.peer(cloud)
            types = tuple(t for t in spec.resources.instance_types if t in pin.catalog) \
                or tuple(pin.catalog.names())
            own = tuple(z for z in zones or () if z in known_zones(peer.settings)) or None
            try:
                market = pin.market(own)
                markets.append((pin.source.fingerprint(own, types),
                                pin.risk_version(types, market.zones)))
            except SpotrunError as exc:   # unreadable now: decided without it (across_clouds)
                markets.append(("unreadable", cloud, str(exc)))
        return (history_key(job, attempts), tuple(markets), inputs.fleet())

    def standing(self, job: Job, spec: JobSpec, key: tuple[Any, ...], inputs: PassInputs,
                 now: datetime) -> Placement | None:
        """The job's last placement if nothing it was made on changed, else None."""
        held = self._held.get(job.id)
        if held is None or held.key != key:
            return None
        if now - held.decided_at > timedelta(seconds=REDECIDE_AFTER_S):
            return None
        left = hours_left(spec.policy.deadline, inputs.market(spec.resources.zones).at)
        if left is not None:
            lo, hi = held.bounds
            if not lo <= left < hi or held.slack_h is None \
                    or left < held.slack_h - SLACK_STEP * abs(held.slack_h):
                return None
        return held.placement

    def keep(self, job: Job, spec: JobSpec, key: tuple[Any, ...], placed: Placement,
             now: datetime) -> None:
        """Remember a fresh decision and the slack bounds it holds within."""
        left = hours_left(spec.policy.deadline, placed.market.at)
        self._held[job.id] = _Standing(key, placed, now, left, _bounds(placed, left))

    def retain(self, job_ids: set[str]) -> None:
        """Forget jobs no longer waiting to launch."""
        for gone in [j for j in self._held if j not in job_ids]:
            del self._held[gone]


def _bounds(placed: Placement, left: float | None) -> tuple[float, float]:
    """Hours left in which every ranked pool stays on its side of the deadline.

    A candidate misses the deadline when its expected hours exceed the hours left.
    """
    if left is None:
        return (float("-inf"), float("inf"))
    hours = sorted(c.expected_hours for c in placed.ranking.candidates
                   if c.expected_hours is not None)
    i = bisect.bisect_right(hours, left)
    return (hours[i - 1] if i > 0 else float("-inf"), hours[i] if i < len(hours) else
            float("inf"))
