"""Scheduling loop: launch an attempt for every job that needs an instance.

Jobs with a deadline (market auto) are placed by the policy shared with `spotrun
simulate` (placement.py): once per decision interval it says stay, launch, move or stop.

Crash safety: the attempt row (with its client token) is committed before the
launch call, so a daemon killed mid-launch re-issues the same token on restart
and the provider returns the instance it already started instead of a second one.
"""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, literal, or_, update
from sqlalchemy import select as sa_select
from sqlmodel import select


from spotrun.agent.contract import AttemptPlan, launch_request, spec_is_multi
from spotrun.budgets.guard import ScopeGuard
from spotrun.daemon.context import DaemonContext
from spotrun.daemon.live_decision import Decisions, PassInputs, RiskModels, placement_for
from spotrun.daemon.moves import follow, resume_cloud, uri_in_cloud
from spotrun.daemon.nodes import (add_group_intents, group_pending, is_multi, launch_group,
                                  terminate_nodes)
from spotrun.daemon.deadline_policy import PolicyPlacer, same_pool
from spotrun.decide import MAX_CANDIDATES, Candidate
from spotrun.decide.deadline import deadline_on_provider_clock
from spotrun.decide.waitkind import reason_kind
from spotrun.daemon.reconcile import terminate_attempt
from spotrun.steps import job_resumes_from
from spotrun.db import Attempt, Event, Job, add_event, attempts_of, session, utcnow
from spotrun.errors import CapacityError, ProviderError, StoreError
from spotrun.ledger.budget import budget_check, request_budget_stop
from spotrun.providers.base import TAG_ATTEMPT, Pool, pools_from_json, pools_to_json
from spotrun.spec import JobSpec, job_spec, spec_from_dict
from spotrun.states import AttemptState, EndReason, JobState, Market, move_attempt, move_job

NEEDS_LAUNCH = (JobState.QUEUED, JobState.RECOVERING)
# (job id, the reason it waits, whether the reason's kind changed: a `waiting` event)
Wait = tuple[str, str, bool]
# Deadline jobs are placed by the shared policy in every live state (it may move them).
PLACED = (JobState.QUEUED, JobState.RECOVERING, JobState.STARTING, JobState.RUNNING)
RETRY_AFTER_NO_CAPACITY_S = 2.0


def pool_of(c: Candidate) -> Pool:
    """The pool a candidate names."""
    return Pool(c.instance_type, c.zone, c.market)


class SchedulerLoop:
    """Each tick: finish launches left half-done, then launch for jobs without an instance."""

    name = "schedule"

    def __init__(self, ctx: DaemonContext, *, pass_budget_s: float | None = None) -> None:
        self.ctx = ctx
        # A pass stops once it has run this long (ctx.clock) and the next one resumes after
        # the last job it handled, so a thousand launches never make one long pass. None: a
        # pass handles every job (`daemon --once`).
        self.pass_budget_s = pass_budget_s
        self._cursor: tuple[datetime, str] | None = None
        self._no_capacity_until: dict[str, datetime] = {}
        self.placer = PolicyPlacer(ctx)
        self.decisions = Decisions()
        self.risks = RiskModels()
        self.scopes = ScopeGuard(ctx)   # project and owner budgets (spotrun.budgets)
        # job id -> ((spec_json, deadline_at), spec as stored, spec with the provider deadline)
        self._specs: dict[str, tuple[tuple[str, datetime | None], JobSpec, JobSpec]] = {}

    def tick(self, now: datetime) -> None:
        """One scheduling pass: every job and its attempts in two reads, the market read
        once, and a decision only for a job whose inputs changed (daemon/live_decision.py)."""
        self._finish_pending_launches()
        self.scopes.pass_start(now)   # one read of every budget, when [budgets] names any
        started = self.ctx.clock.monotonic() if self.pass_budget_s is not None else 0.0
        with session(self.ctx.engine) as s:
            jobs = list(s.exec(select(Job).where(Job.state.in_(PLACED))
                               .order_by(Job.created_at, Job.id)))
            rows = list(s.exec(select(Attempt).join(Job, Job.id == Attempt.job_id)
                               .where(Job.state.in_(PLACED))
                               .order_by(Attempt.job_id, Attempt.number)))
        attempts: dict[str, list[Attempt]] = {}
        for a in rows:
            attempts.setdefault(a.job_id, []).append(a)
        ids = {j.id for j in jobs}
        self.placer.retain(ids)
        self.decisions.retain({j.id for j in jobs if j.state in NEEDS_LAUNCH})
        for gone in [j for j in self._specs if j not in ids]:
            del self._specs[gone]
        inputs = PassInputs(self.ctx, attempts=attempts, jobs={j.id: j for j in jobs},
                            risks=self.risks)
        waits: list[Wait] = []
        try:
            for k, job in enumerate(self._resume_order(jobs)):
                if k and self._out_of_time(started):
                    break
                self._cursor = (job.created_at, job.id)
                job = self._fix_deadline(job)
                if job.cancel_requested or job.budget_stop_requested:
                    continue
                mine = attempts.get(job.id, [])
                # Deadline jobs: the policy shared with `spotrun simulate` picks market and
                # zone once per decision interval; the cost model still picks the type
                # (placement.py).
                if self.placer.manages(job, self._spec(job), mine):
                    self._place(job, now, inputs, mine)
                    continue
                if job.state not in NEEDS_LAUNCH:
                    continue
                if self._no_capacity_until.get(job.id, now) > now:
                    continue
                self._launch_for(job, now, inputs, mine, waits)
            else:
                self._cursor = None   # every job had its turn: the next pass starts at the top
        finally:
            self._record_waits(waits)

    def _resume_order(self, jobs: list[Job]) -> list[Job]:
        """Jobs (oldest first) from the one after the cursor round to the one at it."""
        if self._cursor is None:
            return jobs
        at = next((i for i, j in enumerate(jobs) if (j.created_at, j.id) > self._cursor),
                  len(jobs))
        return jobs[at:] + jobs[:at]

    def _out_of_time(self, started: float) -> bool:
        """Whether this pass has used its budget."""
        return (self.pass_budget_s is not None
                and self.ctx.clock.monotonic() - started >= self.pass_budget_s)

    def _specs_of(self, job: Job) -> tuple[JobSpec, JobSpec]:
        """(the spec as stored, with its deadline on the provider's clock), parsed once per
        version of the row's spec and deadline."""
        key = (job.spec_json, job.deadline_at)
        held = self._specs.get(job.id)
        if held is None or held[0] != key:
            stored = spec_from_dict(job.spec)
            held = (key, stored, job_spec(job) if job.deadline_at is not None else stored)
            self._specs[job.id] = held
        return held[1], held[2]

    def _spec(self, job: Job) -> JobSpec:
        """The typed spec decisions read (spotrun.spec.job_spec), parsed once per version."""
        return self._specs_of(job)[1]

    def _fix_deadline(self, job: Job) -> Job:
        """Put a deadline on the provider's clock once (the one conversion; see decide)."""
        deadline = self._specs_of(job)[0].policy.deadline
        if deadline is None or job.deadline_at is not None:
            return job
        with session(self.ctx.engine) as s:
            j = s.get(Job, job.id)
            j.deadline_at = deadline_on_provider_clock(
                datetime.fromisoformat(deadline), job.created_at, self.ctx.provider.now(),
                self.ctx.time_scale)
            s.add(j)
            s.commit()
            return j

    def _place(self, job: Job, now: datetime, inputs: PassInputs,
               attempts: list[Attempt]) -> None:
        """Carry out the policy's decision: stay, launch, move (stop, then launch) or stop."""
        p = self.placer.decide(job, inputs=inputs, spec=self._spec(job), attempts=attempts)
        if p is None or not p.act:
            return
        current, target = p.current, p.target
        if current is not None and target is not None and same_pool(current, pool_of(target)):
            return
        if current is not None:
            where = pool_of(target).key() if target is not None else "wait (idle)"
            terminate_attempt(self.ctx.for_cloud(current.cloud), current, EndReason.MOVED,
                              f"policy: {where}")
        if target is None:
            return
        with session(self.ctx.engine) as s:
            attempts = attempts_of(s, job.id)
        self._start_attempt(job, attempts, [target], now)

    # ------------------------------------------------------------ launching

    def _launch_for(self, job: Job, now: datetime, inputs: PassInputs,
                    attempts: list[Attempt], waits: list[Wait]) -> None:
        """Launch where the job's decision says, deciding again only if its inputs changed."""
        if any(not a.state.is_terminal() for a in attempts):
            return
        spec = self._spec(job)
        key = self.decisions.key(job, spec, attempts, inputs)
        placed = self.decisions.standing(job, spec, key, inputs, now)
        if placed is None:
            placed = placement_for(self.ctx, job, spec, inputs=inputs)
            self.decisions.keep(job, spec, key, placed, now)
        if not placed.candidates:
            why = placed.wait_reason or "no pool can take the job now"
        else:   # a pool can take it: does a project or owner budget let it?
            why = self.scopes.wait_reason(job, placed.candidates[0].price_usd_per_hour,
                                          spec.resources.nodes)
        if why is not None:
            self._no_capacity_until[job.id] = now + timedelta(seconds=RETRY_AFTER_NO_CAPACITY_S)
            if job.reason != why:
                # status reads the live text (prices, pools); the history gets one event per
                # change of what the job waits for, not one per price move (reason_kind).
                waits.append((job.id, why, job.reason is None
                              or reason_kind(job.reason) != reason_kind(why)))
            return
        self._start_attempt(job, attempts, placed.candidates[:MAX_CANDIDATES], now)

    def _record_waits(self, waits: list[Wait]) -> None:
        """The pass's waiting reasons and `waiting` events, in one transaction of two batched
        statements; a job cancelled (or launched) since the pass read it is left alone."""
        if not waits:
            return
        jobs, events = Job.__table__, Event.__table__
        # Not IN (...): an expanding parameter cannot go into a batched (executemany) statement.
        waiting = or_(*(jobs.c.state == state for state in NEEDS_LAUNCH))
        set_reason = jobs.update().where(jobs.c.id == bindparam("b_id"), waiting) \
            .values(reason=bindparam("b_why"))
        still = sa_select(jobs.c.id).where(jobs.c.id == bindparam("b_id"), waiting).exists()
        add = events.insert().from_select(
            ["job_id", "kind", "detail", "ts"],
            sa_select(bindparam("b_id", type_=events.c.job_id.type), literal("waiting"),
                      bindparam("b_why", type_=events.c.detail.type),
                      bindparam("b_ts", type_=events.c.ts.type)).where(still))
        ts = utcnow()
        with session(self.ctx.engine) as s:
            conn = s.connection()
            conn.execute(set_reason, [{"b_id": j, "b_why": why} for j, why, _ in waits])
            changed = [{"b_id": j, "b_why": why, "b_ts": ts} for j, why, kind in waits if kind]
            if changed:
                conn.execute(add, changed)
            s.commit()

    def _start_attempt(self, job: Job, attempts: list[Attempt], choices: list[Candidate],
                       now: datetime) -> None:
        """Intent row (with its client token) first, then the launch over choices in order."""
        pools = [pool_of(c) for c in choices]
        if not self._budget_allows(job, choices[0], now):
            return
        number = (attempts[-1].number + 1) if attempts else 1
        # Where the resume checkpoint is now: the cloud of the last attempt that ran (it moves
        # to the new attempt's cloud before the launch, daemon/moves.py).
        held = self.ctx.for_cloud(resume_cloud(self.ctx, attempts))
        start_step = held.checkpointed_step(job.id, uri_in_cloud(held, job, job.checkpoint_uri),
                                            job.last_step)
        cloud = choices[0].cloud or self.ctx.cloud
        first = pools[0]
        price = self._price(first, cloud)
        spec = self._specs_of(job)[0]
        multi = spec_is_multi(spec)
        attempt = Attempt(job_id=job.id, number=number, state=AttemptState.LAUNCHING,
                          nodes=spec.resources.nodes, nodes_min=spec.resources.nodes_min,
                          market=first.market, instance_type=first.instance_type, zone=first.zone,
                          price_usd_per_hour=price, start_step=start_step,
                          client_token=f"{job.id}-a{number}-{secrets.token_hex(4)}",
                          gpus=choices[0].gpus,
                          checkpoint_interval_s=choices[0].checkpoint_interval_s,
                          candidates=pools_to_json(pools[:MAX_CANDIDATES]), cloud=cloud)
        with session(self.ctx.engine) as s:
            if not _still_launchable(s, job.id, now):
                return   # cancelled (or moved on) since this tick read it: no intent
            # A project or owner budget: checked in the intent's own transaction, so two
            # passes (or daemons) never spend the same room twice.
            over = self.scopes.check_in(s, job, price, spec.resources.nodes)
            if over is not None:
                s.rollback()
                self._wait(job, now, over)
                return
            s.add(attempt)
            j = s.get(Job, job.id)
            move_job(j, JobState.STARTING)
            j.reason = None
            job_resumes_from(j, start_step)
            j.updated_at = now
            s.add(j)
            s.flush()
            if multi:
                add_group_intents(s, attempt)   # one row per rank, tokens <token>-<k>
            add_event(s, job.id, "launch_intent", f"attempt {number}: {first.key()}"
                      + (f" on {cloud}" if self.ctx.several else "") + " "
                      f"(+{len(pools) - 1} more)"
                      + (f", {spec.resources.nodes_text()} nodes" if multi else ""),
                      attempt_id=attempt.id)
            s.commit()
        self.scopes.launched(job, price, spec.resources.nodes)
        self._launch(job, attempt, pools, now)

    def _finish_pending_launches(self) -> None:
        with session(self.ctx.engine) as s:
            pending = list(s.exec(select(Attempt).where(Attempt.state == AttemptState.LAUNCHING,
                                                        Attempt.instance_id.is_(None))))
        for att in pending:
            with session(self.ctx.engine) as s:
                job = s.get(Job, att.job_id)
                if is_multi(att) and not group_pending(s, att):
                    continue   # launched: its nodes are the node loop's
            if job.cancel_requested and not is_multi(att):
                self._adopt_or_drop(job, att)
                continue
            pools = pools_from_json(att.candidates)
            if not pools:
                pools = [Pool(att.instance_type, att.zone, att.market)]
            self._launch(job, att, pools, self.ctx.clock.now())

    def _adopt_or_drop(self, job: Job, att: Attempt) -> None:
        """A cancelled job's half-done launch: adopt the instance if it started, else drop it."""
        found = [i for i in self.ctx.for_cloud(att.cloud).provider.describe(job_id=job.id)
                 if i.tags.get(TAG_ATTEMPT) == str(att.number)
                 or (i.client_token and i.client_token == att.client_token)]
        with session(self.ctx.engine) as s:
            a = s.get(Attempt, att.id)
            if found:
                a.instance_id = found[0].instance_id
                a.started_at = found[0].launched_at
                move_attempt(a, AttemptState.RUNNING)  # the reconcile loop terminates it
            else:
                move_attempt(a, AttemptState.ENDED)
                a.end_reason = EndReason.CANCELLED
                a.detail = "cancelled before launch"
            s.add(a)
            s.commit()

    def _launch(self, job: Job, attempt: Attempt, pools: list[Pool], now: datetime) -> None:
        cloud = self.ctx.for_cloud(attempt.cloud)
        if self.ctx.several and not self._followed(job, attempt):
            return
        if is_multi(attempt):
            self._launch_group(job, attempt, pools, now)
            return
        request = launch_request(cloud.settings,
                                 AttemptPlan.of(job, attempt, cloud.plan_store_uri), pools,
                                 client_token=attempt.client_token)
        plan = cloud.provider.plan_launch(request)
        try:
            info = cloud.provider.launch(plan)
        except CapacityError as exc:
            self._end_attempt(attempt, EndReason.LAUNCH_FAILED, f"no capacity: {exc.message}")
            self._wait(job, now, f"no capacity in {len(pools)} pool(s)")
            return
        except ProviderError as exc:
            # Leave the intent in place: the next tick retries with the same client token.
            self.ctx.log.warning("launch_failed_retrying", job=job.id, error=str(exc))
            return
        with session(self.ctx.engine) as s:
            a = s.get(Attempt, attempt.id)
            a.instance_id = info.instance_id
            a.instance_type = info.instance_type
            a.zone = info.zone
            a.market = info.market
            if info.price_usd_per_hour is not None:
                a.price_usd_per_hour = info.price_usd_per_hour
            a.started_at = info.launched_at
            s.add(a)
            add_event(s, job.id, "launched", f"attempt {a.number}: {info.instance_id} "
                      f"{info.instance_type} {info.zone} {info.market.value} "
                      f"${a.price_usd_per_hour:.3f}/h", attempt_id=a.id)
            s.commit()
        self._no_capacity_until.pop(job.id, None)
        self.ctx.log.info("launched", job=job.id, attempt=attempt.number,
                          instance=info.instance_id, pool=f"{info.instance_type}/{info.zone}",
                          market=info.market.value)

    def _followed(self, job: Job, attempt: Attempt) -> bool:
        """Several clouds: the job's checkpoint and code are in the attempt's cloud (copied
        there now if they were elsewhere). False: the copy failed; the intent stays and the
        next pass goes on from what arrived."""
        with session(self.ctx.engine) as s:
            attempts = attempts_of(s, job.id)
        try:
            follow(self.ctx, job, attempt, attempts)
        except (StoreError, ProviderError) as exc:
            self.ctx.log.warning("checkpoint_move_failed_retrying", job=job.id,
                                 attempt=attempt.number, error=str(exc))
            return False
        return True

    def _launch_group(self, job: Job, attempt: Attempt, pools: list[Pool], now: datetime) -> None:
        """All of a multi-node attempt's nodes in one pool (spotrun.daemon.nodes)."""
        cloud = self.ctx.for_cloud(attempt.cloud)
        try:
            infos = launch_group(cloud, job, attempt, pools)
        except CapacityError as exc:
            terminate_nodes(cloud, attempt, EndReason.LAUNCH_FAILED, "no capacity")
            self._end_attempt(attempt, EndReason.LAUNCH_FAILED, f"no capacity: {exc.message}")
            self._wait(job, now, f"no pool of {len(pools)} has room for {attempt.nodes} nodes")
            return
        except ProviderError as exc:
            self.ctx.log.warning("launch_failed_retrying", job=job.id, error=str(exc))
            return
        self._no_capacity_until.pop(job.id, None)
        self.ctx.log.info("launched", job=job.id, attempt=attempt.number,
                          instances=[i.instance_id for i in infos],
                          pool=f"{infos[0].instance_type}/{infos[0].zone}",
                          market=infos[0].market.value)

    def _budget_allows(self, job: Job, c: Candidate, now: datetime) -> bool:
        """Refuse a launch the model expects to overrun the budget; stop the job instead."""
        # The next stretch: one checkpoint interval, or the whole remaining work if shorter.
        hours = c.checkpoint_interval_s / 3600.0
        if c.expected_hours is not None:
            hours = min(hours, c.expected_hours)
        with session(self.ctx.engine) as s:
            j = s.get(Job, job.id)
            decision = budget_check(s, j, now, max(hours, 60.0 / 3600.0) * c.price_usd_per_hour)
            if decision.allowed:
                return True
            request_budget_stop(s, j, decision, now)
            s.commit()
        return False

    def _end_attempt(self, attempt: Attempt, reason: EndReason, detail: str) -> None:
        with session(self.ctx.engine) as s:
            a = s.get(Attempt, attempt.id)
            move_attempt(a, AttemptState.ENDED)
            a.end_reason = reason
            a.detail = detail
            s.add(a)
            s.commit()

    def _wait(self, job: Job, now: datetime, why: str) -> None:
        """No launch now: retry soon; the job shows the true reason it waits (one writer)."""
        self._no_capacity_until[job.id] = now + timedelta(seconds=RETRY_AFTER_NO_CAPACITY_S)
        with session(self.ctx.engine) as s:
            j = s.get(Job, job.id)
            if j.state.is_terminal():
                return   # cancelled since this tick read it: nothing waits any more
            if j.state is JobState.STARTING:
                move_job(j, JobState.RECOVERING if j.last_step or attempts_of(s, j.id)
                         else JobState.QUEUED)
            # status reads the live text (prices, pools); the history gets one event per
            # change of what the job waits for, not one per price move (reason_kind).
            changed = j.reason is None or reason_kind(j.reason) != reason_kind(why)
            j.reason = why
            s.add(j)
            if changed:
                add_event(s, job.id, "waiting", why)
            s.commit()

    def _price(self, pool: Pool, cloud: str) -> float:
        provider = self.ctx.for_cloud(cloud).provider
        if pool.market is Market.ON_DEMAND:
            return provider.on_demand_price(pool.instance_type)
        price = provider.spot_price(pool.instance_type, pool.zone)
        return price if price is not None else provider.on_demand_price(pool.instance_type)


def _still_launchable(s: Any, job_id: str, now: datetime) -> bool:
    """Lock the job's row if it is still live and not being cancelled (a conditional update),
    and say whether it still needs an intent (no attempt of it is launching or running).

    `spotrun cancel` ends a never-launched job with the mirror-image update, so of an intent
    and an immediate cancel racing, exactly one wins; the loser changes nothing. Of two passes
    racing to launch one job (two daemons' schedulers), the second finds the first's intent.
    """
    res = s.execute(update(Job).where(Job.id == job_id, Job.state.in_(PLACED),
                                      Job.cancel_requested == False)  # noqa: E712
                    .values(updated_at=now).execution_options(synchronize_session=False))
    if res.rowcount != 1:
        return False
    # The row is ours until commit; an intent another pass committed before is visible now
    # (a statement after the lock: PostgreSQL's read-committed snapshot is taken per statement).
    live = sa_select(Attempt.id).where(
        Attempt.job_id == job_id,
        Attempt.state.in_([AttemptState.LAUNCHING, AttemptState.RUNNING])).exists()
    return not s.execute(sa_select(live)).scalar()
