"""The daemon side of the shared deadline policy (decide.policy): one decision per interval.

For a job with a deadline (and `policy.market: auto`) the scheduler asks, once per decision
interval of the provider clock, the same policy code `spotrun simulate` runs:

- the cost model (spotrun.costmodel) still ranks instance TYPES: the job keeps the type it
  runs on, else takes the model's best; the policy picks the market and zone for that type;
- the market the policy sees is what this daemon recorded: one row per interval from the
  provider's market view (availability and spot price per zone of the type);
- the job's progress: with a measured speed, the checkpointed step over steps/s; otherwise
  (no heartbeat progress, e.g. `work.reference_hours` jobs) the provider clock: seconds on an
  instance after the changeover, exactly the simulator's model;
- as in the simulator, the interval in which a spot reclaim is observed is lost (idle) and
  the policy is asked again at the next one;
- a pool with a recent interruption notice (any attempt's, from the pass's market) or a
  reclaim seen in the recorded market within the provider's `notice_quarantine_s` is closed
  to launches, as the simulator closes a pool after each reclaim of its trace.

Placement only decides; the scheduler launches, moves and stops (intent row first).
"""

from __future__ import annotations

import math
from collections import deque
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from spotrun.daemon.context import DaemonContext
from spotrun.daemon.live_decision import placement_for
from spotrun.db import Attempt, Job, add_event, attempts_of, session
from spotrun.decide import Candidate
from spotrun.decide.deadline import (DEFAULT_TICK_S, market_rows, policy_places, policy_step,
                                     policy_target, work_seconds)
from spotrun.decide.policy import (POLICIES, Decision, JobProgress, MarketHistory, Mode, Policy,
                                   make_policy)
from spotrun.errors import ConfigError
from spotrun.providers.base import Pool, ProviderFeature
from spotrun.providers.facts import facts_for
from spotrun.spec import JobSpec, job_spec
from spotrun.states import AttemptState, EndReason, Market

if TYPE_CHECKING:
    from spotrun.daemon.live_decision import PassInputs

DECISION_LOG_LEN = 10_000   # per job, most recent decisions kept in memory (inspection, tests)
LIVE = (AttemptState.LAUNCHING, AttemptState.RUNNING)
# Slot arithmetic on provider seconds: a decision exactly on a boundary belongs to it.
_SLOT_EPS = 1e-6


class PolicyStep(NamedTuple):
    """The policy's decision for one job and interval, and what it means for the scheduler."""

    at: datetime                 # provider time of the decision
    decision: Decision
    target: Candidate | None     # where the job should run for the interval (None: nowhere)
    current: Attempt | None      # the live attempt the job is on now
    act: bool                    # False: change nothing (a lost interval, work done, a launch
    #                              still unresolved)


def _ms(seconds: float) -> float:
    """Seconds rounded to milliseconds: provider clocks carry float noise, the policy compares."""
    return round(seconds, 3)


def same_pool(att: Attempt, pool: Pool) -> bool:
    """True when the attempt already runs where pool says (on-demand: any zone of the type)."""
    if att.market is not pool.market or att.instance_type != pool.instance_type:
        return False
    return pool.market is Market.ON_DEMAND or att.zone == pool.zone


def clock_progress_s(attempts: list[Attempt], changeover_s: float, now: datetime) -> float:
    """Productive provider seconds: time on instances after each launch's changeover.

    The simulator's model of progress, used when no heartbeat progress exists. Intervals are
    merged, so the shutdown of an instance moved away from never counts twice.
    """
    spans: list[tuple[float, float]] = []
    for a in attempts:
        if a.started_at is None:
            continue
        end = a.ended_at if a.ended_at is not None else (
            now if a.state in LIVE or a.state is AttemptState.TERMINATING else a.started_at)
        begin = a.started_at + timedelta(seconds=changeover_s)
        end = min(end, now)
        if end > begin:
            spans.append((begin.timestamp(), end.timestamp()))
    total, reach = 0.0, -math.inf
    for b, e in sorted(spans):
        if e <= reach:
            continue
        total += e - max(b, reach)
        reach = e
    return total


class _Recorded:
    """The market of one (type, pools) as this daemon observed it, one row per interval."""

    def __init__(self, pools: list[str], notice_quarantine_s: float) -> None:
        self.pools = pools
        # A reclaim seen in the recorded market closes its pool as a notice does, as in the
        # simulator (the provider's quarantine).
        self.notice_quarantine_s = notice_quarantine_s
        self.history: MarketHistory | None = None
        self.slot: int | None = None

    def add(self, slot: int, up: list[bool], price: list[float], od_price: float,
            tick_s: float) -> None:
        up_row, price_row = np.asarray(up, dtype=bool), np.asarray(price, dtype=np.float64)
        if self.history is None:
            self.history = MarketHistory(self.pools, up_row[None, :], price_row[None, :],
                                         od_price, tick_s,
                                         notice_quarantine_s=self.notice_quarantine_s)
        else:
            self.history = self.history.extended(up_row, price_row)
        self.slot = slot


class PolicyPlacer:
    """Asks the shared policy what each deadline job should run on, once per interval."""

    def __init__(self, ctx: DaemonContext) -> None:
        self.ctx = ctx
        d = ctx.settings.daemon
        if d.policy not in POLICIES:
            raise ConfigError(f"unknown placement policy; allowed: {', '.join(POLICIES)}",
                              field="daemon.policy", value=d.policy)
        self.policy_name = d.policy
        self._grid: tuple[float, float] | None = None     # (origin_s, tick_s)
        self._markets: dict[tuple[str, tuple[str, ...]], _Recorded] = {}
        self._policies: dict[str, Policy] = {}
        self._last: dict[str, tuple[int, datetime]] = {}  # job -> (slot, time) last decided
        self._origin: dict[str, datetime] = {}
        self._decisions: dict[str, deque[tuple[datetime, Decision]]] = {}

    # ------------------------------------------------------------ what and when

    def manages(self, job: Job, spec: JobSpec | None = None,
                attempts: list[Attempt] | None = None) -> bool:
        """True for jobs the policy places: a deadline, market auto, and a work estimate.

        `spec` (spotrun.spec.job_spec) and `attempts` when the caller already read them.
        """
        spec = spec or job_spec(job)
        if not spec.policy.deadline:
            return False
        if self.ctx.several:
            # Several clouds: a deadline job is placed by the decision over every cloud (its
            # candidates' expected hours against the deadline, on-demand allowed); the
            # interval policy reads one provider's market grid (docs/clouds.md, "Limits").
            return False
        if attempts is None:
            with session(self.ctx.engine) as s:
                attempts = attempts_of(s, job.id)
        return policy_places(spec, any(a.steps_per_s for a in attempts))

    @property
    def tick_s(self) -> float:
        """The decision interval, provider-clock seconds."""
        return self._grid_params()[1]

    def _grid_params(self) -> tuple[float, float]:
        if self._grid is None:
            origin, natural = 0.0, None
            if ProviderFeature.DECISION_GRID in self.ctx.provider.features:
                # A market replaying a trace: decide on its row boundaries.
                origin, natural = self.ctx.provider.decision_grid()
            tick = self.ctx.settings.daemon.policy_tick_s or natural or DEFAULT_TICK_S
            self._grid = (origin, tick)
        return self._grid

    def slot(self, at: datetime) -> int:
        """The decision interval a provider time falls in."""
        origin, tick = self._grid_params()
        return math.floor((at.timestamp() - origin) / tick + _SLOT_EPS)

    def retain(self, job_ids: set[str]) -> None:
        """Forget the per-job state of jobs no longer placed (finished, cancelled)."""
        for table in (self._policies, self._last, self._origin, self._decisions):
            for gone in [j for j in table if j not in job_ids]:
                del table[gone]

    def decisions(self, job_id: str) -> list[tuple[datetime, Decision]]:
        """The job's recent decisions (provider time, decision), oldest first."""
        return list(self._decisions.get(job_id, ()))

    # ------------------------------------------------------------ deciding

    def decide(self, job: Job, *, inputs: PassInputs | None = None, spec: JobSpec | None = None,
               attempts: list[Attempt] | None = None) -> PolicyStep | None:
        """The decision for the current interval; None when this interval is already decided.

        `inputs`: the scheduling pass's shared reads; `spec` and `attempts` when already read.
        """
        now = self.ctx.provider.now()
        slot = self.slot(now)
        last = self._last.get(job.id)
        if last is not None and last[0] == slot:
            return None
        spec = spec or job_spec(job)
        if attempts is None:
            with session(self.ctx.engine) as s:
                attempts = attempts_of(s, job.id)
        live = [a for a in attempts if a.state in LIVE]
        current = live[-1] if live else None
        placed = placement_for(self.ctx, job, spec, inputs=inputs)
        ranked = placed.ranking.candidates
        itype = current.instance_type if current else (ranked[0].instance_type if ranked
                                                        else None)
        if itype is None:
            return self._record(job, now, slot, Decision(Mode.IDLE), None, current, act=False)
        mine = [c for c in ranked if c.instance_type == itype]
        market = self._observe(spec, itype, slot, placed.market)
        view = market.view(len(market) - 1)
        pools = market.pools
        up = view.up_now()
        prev_at = last[1] if last else now - timedelta(seconds=self.tick_s)

        # The simulator's reclaim rule: the interval in which a reclaim shows is lost.
        if current is not None and current.market is Market.SPOT and (
                current.zone not in pools or not up[pools.index(current.zone)]):
            return self._record(job, now, slot, Decision(Mode.IDLE), None, current, act=False)
        if current is None and attempts and attempts[-1].end_reason is EndReason.RECLAIMED \
                and attempts[-1].ended_at is not None and attempts[-1].ended_at > prev_at:
            return self._record(job, now, slot, Decision(Mode.IDLE), None, None, act=False)

        changeover_s = self.ctx.settings.daemon.policy_changeover_s or (
            mine[0].restart_s if mine else 0.0)
        work = self._work_s(spec, job, attempts, itype, mine, changeover_s, now)
        if work is None:
            return self._record(job, now, slot, Decision(Mode.IDLE), None, current, act=False)
        total_s, done_s = work
        here = _current_decision(current)
        if done_s >= total_s:
            if current is not None:
                # Estimated done but still running: the job, not the estimate, says when.
                return self._record(job, now, slot, here, None, current, act=False)
            total_s = done_s + self.tick_s   # not done after all: at least one more interval
        deadline = datetime.fromisoformat(spec.policy.deadline or "")
        origin = self._origin.setdefault(job.id, min(
            [a.started_at for a in attempts if a.started_at is not None] + [now]))
        left_s = 0.0
        if current is not None and current.started_at is not None:
            left_s = max(0.0, changeover_s - (now - current.started_at).total_seconds())
        elif current is not None:
            left_s = changeover_s
        progress = JobProgress(
            work_total_s=_ms(total_s), work_done_s=_ms(done_s),
            time_left_s=_ms((deadline - now).total_seconds()),
            elapsed_s=_ms((now - origin).total_seconds()), changeover_s=_ms(changeover_s),
            tick_s=self.tick_s, mode=here.mode, pool=here.pool, changeover_left_s=_ms(left_s))
        policy = self._policies.setdefault(job.id, make_policy(self.policy_name))
        # Pools a recent notice closed (any attempt's: the pass's market carries them).
        decision = policy_step(policy, progress, view, field="daemon.policy",
                               closed=placed.market.closed_zones(itype))
        if current is not None and current.instance_id is None:
            # A launch still being resolved (same client token next tick): do not move yet.
            return self._record(job, now, slot, decision, None, current, act=False)
        target = policy_target(decision, itype, mine)
        return self._record(job, now, slot, decision, target, current, act=True)

    def _observe(self, spec: JobSpec, itype: str, slot: int, snapshot) -> MarketHistory:
        """The recorded market of the type's zones, with this interval's row added once."""
        provider = self.ctx.provider
        rows = market_rows(snapshot, itype, list(spec.resources.zones))
        key = (itype, tuple(z for z, _, _ in rows))
        rec = self._markets.get(key)
        if rec is None:
            rec = self._markets[key] = _Recorded(
                list(key[1]), facts_for(self.ctx.settings).notice_quarantine_s)
        if rec.slot != slot:
            rec.add(slot, [u for _, u, _ in rows], [p for _, _, p in rows],
                    provider.on_demand_price(itype), self.tick_s)
        assert rec.history is not None
        return rec.history

    def _work_s(self, spec: JobSpec, job: Job, attempts: list[Attempt], itype: str,
                mine: list[Candidate], changeover_s: float,
                now: datetime) -> tuple[float, float] | None:
        """(total, done) productive seconds on the type; None when the work cannot be told."""
        rates = [a.steps_per_s for a in attempts if a.steps_per_s and a.instance_type == itype]
        return work_seconds(spec, mine, rates[-1] if rates else None, job.last_step,
                            clock_progress_s(attempts, changeover_s, now))

    def _record(self, job: Job, now: datetime, slot: int, decision: Decision,
                target: Candidate | None, current: Attempt | None, *, act: bool) -> PolicyStep:
        log = self._decisions.setdefault(job.id, deque(maxlen=DECISION_LOG_LEN))
        if not log or log[-1][1] != decision:
            with session(self.ctx.engine) as s:
                add_event(s, job.id, "policy", f"{self.policy_name}: {_describe(decision)}")
                s.commit()
        log.append((now, decision))
        self._last[job.id] = (slot, now)
        self.ctx.log.debug("policy_decision", job=job.id, slot=slot, mode=decision.mode.value,
                           pool=decision.pool)
        return PolicyStep(now, decision, target, current, act)


def _current_decision(att: Attempt | None) -> Decision:
    if att is None:
        return Decision(Mode.IDLE)
    if att.market is Market.SPOT:
        return Decision(Mode.SPOT, att.zone)
    return Decision(Mode.ON_DEMAND)


def _describe(d: Decision) -> str:
    return f"spot {d.pool}" if d.mode is Mode.SPOT else d.mode.value
