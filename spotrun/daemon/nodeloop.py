"""Node loop: follow every node of the multi-node attempts; replace a lost node alone.

Each tick, per live multi-node attempt:
1. instance states: a node whose instance ended gets its end reason from its own exit report
   (a completed exit outranks a later reclaim, as for one node); a launched one runs;
2. per-node heartbeats (keyed by instance id): progress, a notice on any node (the attempt's
   notice_at: the torch side saves the whole job), a silent node is terminated as lost;
3. the attempt: every node completed -> completed; an error exit -> the attempt ends in error;
   a lost node (reclaimed, dead, silent) -> one replacement for its rank in the same pool with
   its own client token, survivors untouched. A refused replacement: an elastic job with at
   least MIN nodes keeps running and the replacement is tried again every tick; otherwise the
   whole job moves (the attempt ends, survivors are terminated, the scheduler places anew);
4. nodes.json follows the listed nodes (spotrun.daemon.nodes.sync_membership).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

from sqlalchemy import or_
from sqlmodel import select

from spotrun import layout
from spotrun.agent.contract import AttemptPlan, launch_request
from spotrun.daemon.context import DaemonContext
from spotrun.daemon.nodes import (latest_per_rank, live_nodes, members_of, min_nodes,
                                  record_launched, replacement_token, sync_membership,
                                  terminate_nodes)
from spotrun.daemon.reconcile import LIVE, ReconcileLoop, attempt_running, end_reason_of
from spotrun.db import Attempt, AttemptNode, Job, add_event, nodes_of, session
from spotrun.errors import CapacityError, ObjectNotFound, ProviderError, StoreError
from spotrun.daemon.heartbeats import apply_beat
from spotrun.steps import attempt_reported, attempt_saved, job_reached
from spotrun.reports import ExitReport, Heartbeat, Notice, parse_report, read_report
from spotrun.providers.base import InstanceInfo, Pool
from spotrun.states import (AttemptState, EndReason, InstanceState, NodeState, move_attempt,
                            move_node)

# A node lost for these reasons is replaced; the others end the attempt as they would one node.
REPLACEABLE = (EndReason.RECLAIMED, EndReason.LOST, EndReason.DEADMAN)


class NodeLoop:
    """Each tick: node states, node heartbeats, replacements and the attempt's outcome."""

    name = "nodes"

    def __init__(self, ctx: DaemonContext) -> None:
        self.ctx = ctx
        self._seen_ts: dict[int, Any] = {}       # node id -> last heartbeat ts seen
        self._saved: dict[int, int] = {}         # attempt id -> newest checkpoint step seen
        self._waiting: set[int] = set()          # attempt ids whose wait event was written
        self._outcome = ReconcileLoop(ctx)       # the job's next state, exactly as for one node

    def tick(self, now: datetime) -> None:
        """One pass over the live multi-node attempts."""
        with session(self.ctx.engine) as s:
            atts = [a for a in s.exec(select(Attempt).where(
                Attempt.state.in_(LIVE), or_(Attempt.nodes > 1, Attempt.nodes_min.is_not(None)),
                self.ctx.owns()))]
            ids = [n.instance_id for a in atts for n in nodes_of(s, a.id)
                   if n.instance_id and not n.state.is_terminal()]
        infos = {i.instance_id: i for i in self.ctx.provider.describe(instance_ids=ids)} \
            if ids else {}
        for att in atts:
            with session(self.ctx.engine) as s:
                job = s.get(Job, att.job_id)
                launched = any(n.instance_id for n in nodes_of(s, att.id))
            if not launched and att.state is not AttemptState.TERMINATING:
                continue   # the scheduler still owns the first group launch
            self._follow_instances(job, att, infos)
            self._heartbeats(job, att, now)
            # A lost node leaves nodes.json before its replacement joins it (two versions).
            self._sync(job, att)
            self._decide(job, att, now)
            self._sync(job, att)

    def _sync(self, job: Job, att: Attempt) -> None:
        """nodes.json follows the nodes until one completes: from then on it stays as it is,
        so the nodes still finishing never see the rendezvous move (and restart)."""
        with session(self.ctx.engine) as s:
            done = any(n.end_reason is EndReason.COMPLETED for n in nodes_of(s, att.id))
        if not done:
            sync_membership(self.ctx, job, att.id)

    # ------------------------------------------------------------ instances

    def _follow_instances(self, job: Job, att: Attempt, infos: dict[str, InstanceInfo]) -> None:
        with session(self.ctx.engine) as s:
            nodes = live_nodes(nodes_of(s, att.id))
        for n in nodes:
            info = infos.get(n.instance_id or "")
            if info is None:
                continue
            if info.state.is_terminal():
                self._node_ended(job, att, n, info)
            elif n.state is NodeState.LAUNCHING and info.state is InstanceState.RUNNING:
                with session(self.ctx.engine) as s:
                    row = s.get(AttemptNode, n.id)
                    move_node(row, NodeState.RUNNING)
                    s.add(row)
                    s.commit()

    def _node_ended(self, job: Job, att: Attempt, n: AttemptNode, info: InstanceInfo) -> None:
        store = self.ctx.job_store(job)
        try:
            report = parse_report(store.get_bytes(
                layout.node_exit_key(job.id, att.number, n.instance_id)), ExitReport)
        except ObjectNotFound:
            report = None
        except StoreError as exc:
            # Unknown is not "no report": deciding now could replace a node that completed.
            self.ctx.log.warning("node_exit_unreadable", job=job.id, node=n.instance_id,
                                 error=str(exc)[:200])
            return
        shim = SimpleNamespace(state=AttemptState.TERMINATING if n.state is NodeState.TERMINATING
                               else AttemptState.RUNNING, end_reason=n.end_reason, detail=n.detail)
        reason, detail = end_reason_of(report, info, shim, job.cancel_requested)  # type: ignore
        with session(self.ctx.engine) as s:
            row = s.get(AttemptNode, n.id)
            move_node(row, NodeState.ENDED)
            row.end_reason, row.detail = reason, detail
            row.ended_at = info.ended_at or self.ctx.provider.now()
            row.cause = info.cause.value if info.cause else None
            if report is not None and report.step is not None:
                row.last_step = max(row.last_step, report.step)
                a = s.get(Attempt, att.id)
                attempt_reported(a, report.step)
                s.add(a)
            s.add(row)
            add_event(s, job.id, f"node_{reason.value}", f"attempt {att.number} node "
                      f"{row.node_rank} ({row.instance_id}): {detail}", attempt_id=att.id)
            s.commit()

    # ------------------------------------------------------------ heartbeats

    def _heartbeats(self, job: Job, att: Attempt, now: datetime) -> None:
        store = self.ctx.job_store(job)
        timeout = timedelta(seconds=self.ctx.settings.daemon.heartbeat_timeout_s)
        with session(self.ctx.engine) as s:
            running = [n for n in nodes_of(s, att.id) if n.state is NodeState.RUNNING]
        lead = min((n.node_rank for n in running), default=None)
        for n in running:
            iid = n.instance_id or ""
            beat = read_report(store, layout.node_heartbeat_key(job.id, att.number, iid), Heartbeat)
            notice = None if n.notice_at else read_report(
                store, layout.node_notice_key(job.id, att.number, iid), Notice)
            fresh = beat is not None and beat.ts != self._seen_ts.get(n.id)
            with session(self.ctx.engine) as s:
                row = s.get(AttemptNode, n.id)
                a = s.get(Attempt, att.id)
                j = s.get(Job, job.id)
                if fresh:
                    self._seen_ts[n.id] = beat.ts
                    row.last_heartbeat_at = now
                    if row.running_at is None:   # its agent is up: the node has joined
                        row.running_at = self.ctx.provider.now()
                    if beat.step is not None:
                        row.last_step = max(row.last_step, beat.step)
                    if n.node_rank == lead:   # one node speaks for the attempt's progress
                        self._saved[att.id] = apply_beat(self.ctx, a, j, beat,
                                                         self._saved.get(att.id, att.start_step))
                    s.add(j)
                if notice is not None:
                    row.notice_at = a.notice_at = self.ctx.provider.now()
                    s.add(a)
                    add_event(s, job.id, "notice", f"attempt {a.number} node {row.node_rank}: "
                              f"interruption notice {notice.action or ''} at "
                              f"{notice.time or ''}: the whole job saves", attempt_id=a.id)
                s.add(row)
                s.commit()
            last = row.last_heartbeat_at or row.created_at
            if now - last > timeout:
                terminate_nodes(self.ctx, att, EndReason.LOST,
                                f"no heartbeat for {timeout.total_seconds():.0f} s",
                                ranks={n.node_rank})

    # ------------------------------------------------------------ the attempt

    def _decide(self, job: Job, att: Attempt, now: datetime) -> None:
        with session(self.ctx.engine) as s:
            a = s.get(Attempt, att.id)
            j = s.get(Job, job.id)
            nodes = nodes_of(s, a.id)
        intents = [n for n in live_nodes(nodes) if n.instance_id is None]
        live = [n for n in live_nodes(nodes) if n.instance_id is not None]
        ended = [n for n in nodes if n.state.is_terminal() and n.instance_id]
        completed = [n for n in ended if n.end_reason is EndReason.COMPLETED]
        if a.state is AttemptState.TERMINATING or j.cancel_requested \
                or j.budget_stop_requested:
            if intents:
                terminate_nodes(self.ctx, a, a.end_reason or EndReason.CANCELLED,
                                a.detail or "the attempt is stopping",
                                ranks={n.node_rank for n in intents})
            if not live:
                self._end(a, a.end_reason or _first_reason(ended), now)
            return
        if completed:
            # Training finished on every rank together: no replacement; end once all are gone.
            if intents:
                terminate_nodes(self.ctx, a, EndReason.COMPLETED, "the job completed",
                                ranks={n.node_rank for n in intents})
            if not live:
                self._end(a, EndReason.COMPLETED, now, detail=f"{len(completed)} node(s) "
                          "reported completed")
            return
        final = [n for n in ended if n.end_reason not in REPLACEABLE
                 and n.end_reason is not EndReason.LAUNCH_FAILED]
        if final:
            first = final[0]
            why = f"node {first.node_rank} ({first.instance_id}): {first.detail}"
            self._stop_attempt(a, first.end_reason or EndReason.ERROR, why)
            return
        if a.state is AttemptState.LAUNCHING:
            running = [n for n in live if n.state is NodeState.RUNNING]
            if len(running) >= min_nodes(a):
                attempt_running(self.ctx, a.id, f"{len(running)} node(s): "
                                f"{', '.join(n.instance_id or '' for n in running)}", now)
        self._replace_lost(j, a, nodes)

    def _replace_lost(self, job: Job, a: Attempt, nodes: list[AttemptNode]) -> None:
        latest = latest_per_rank(nodes)
        for rank in range(a.nodes):
            n = latest.get(rank)
            if n is None or (n.state.is_terminal() and n.end_reason in REPLACEABLE) \
                    or (n.instance_id is None and n.state is NodeState.LAUNCHING):
                if not self._replace(job, a, rank, n):
                    return

    def _replace(self, job: Job, a: Attempt, rank: int, lost: AttemptNode | None) -> bool:
        """Launch one replacement for rank in the attempt's pool; False when the job moved."""
        pool = Pool(a.instance_type, a.zone, a.market)
        with session(self.ctx.engine) as s:
            if lost is not None and lost.instance_id is None:
                row = s.get(AttemptNode, lost.id)   # an earlier try was refused: a new token
                tries = _tries(row.detail) + 1
            else:
                row = AttemptNode(attempt_id=a.id, job_id=a.job_id, node_rank=rank,
                                  market=a.market, instance_type=a.instance_type, zone=a.zone,
                                  price_usd_per_hour=a.price_usd_per_hour, client_token="",
                                  replaces=lost.id if lost is not None else None)
                tries = 1
            row.client_token = replacement_token(a.client_token, rank, tries)
            row.detail = f"tries {tries}"
            s.add(row)
            if tries == 1:
                add_event(s, job.id, "node_replacing", f"attempt {a.number} node {rank}: "
                          f"launching a replacement in {pool.key()}", attempt_id=a.id)
            s.commit()
        req = launch_request(self.ctx.settings, AttemptPlan.of(job, a, self.ctx.plan_store_uri),
                             [pool], client_token=row.client_token, ranks=[rank])
        try:
            info = self.ctx.provider.launch(self.ctx.provider.plan_launch(req))
        except CapacityError as exc:
            return self._refused(job, a, rank, pool, exc.message)
        except ProviderError as exc:
            self.ctx.log.warning("node_replacement_failed_retrying", job=job.id, rank=rank,
                                 error=str(exc))
            return True
        with session(self.ctx.engine) as s:
            node = s.get(AttemptNode, row.id)
            record_launched(s, node, info)
            add_event(s, job.id, "node_replaced", f"attempt {a.number} node {rank}: "
                      f"{info.instance_id} in {pool.key()}", attempt_id=a.id)
            s.commit()
        self._waiting.discard(a.id)
        self.ctx.log.info("node_replaced", job=job.id, attempt=a.number, rank=rank,
                          instance=info.instance_id)
        return True

    def _refused(self, job: Job, a: Attempt, rank: int, pool: Pool, why: str) -> bool:
        with session(self.ctx.engine) as s:
            alive = len(members_of(nodes_of(s, a.id)))
        if a.nodes_min is not None and alive >= min_nodes(a):
            if a.id not in self._waiting:
                self._waiting.add(a.id)
                with session(self.ctx.engine) as s:
                    add_event(s, job.id, "node_replacement_waiting",
                              f"attempt {a.number} node {rank}: {pool.key()} refused ({why}); "
                              f"running on {alive} of {a.nodes} nodes (elastic minimum "
                              f"{min_nodes(a)}) and trying again", attempt_id=a.id)
                    s.commit()
            return True
        detail = (f"node {rank} lost and {pool.key()} has no capacity for its replacement "
                  f"({why}): moving the whole job")
        with session(self.ctx.engine) as s:
            add_event(s, job.id, "node_replacement_refused", f"attempt {a.number}: {detail}",
                      attempt_id=a.id)
            s.commit()
        self._stop_attempt(a, EndReason.MOVED, detail)
        return False

    def _stop_attempt(self, a: Attempt, reason: EndReason, detail: str) -> None:
        """End the attempt for good: terminate every live node, then end it once they are gone."""
        terminate_nodes(self.ctx, a, reason, detail)
        with session(self.ctx.engine) as s:
            row = s.get(Attempt, a.id)
            if row.state.is_terminal():
                return
            move_attempt(row, AttemptState.TERMINATING)
            row.end_reason, row.detail = reason, detail
            s.add(row)
            add_event(s, row.job_id, "terminating", f"attempt {row.number}: {detail}",
                      attempt_id=row.id)
            s.commit()

    def _end(self, a: Attempt, reason: EndReason, now: datetime, detail: str | None = None
             ) -> None:
        with session(self.ctx.engine) as s:
            job = s.get(Job, a.job_id)
        saved = self.ctx.checkpointed_step(job.id, job.checkpoint_uri, job.last_step)
        with session(self.ctx.engine) as s:
            row = s.get(Attempt, a.id)
            if row.state.is_terminal():
                return
            nodes = nodes_of(s, row.id)
            move_attempt(row, AttemptState.ENDED)
            row.end_reason = reason
            row.detail = detail or row.detail or reason.value
            ends = [n.ended_at for n in nodes if n.ended_at is not None]
            row.ended_at = max(ends) if ends else self.ctx.provider.now()
            row.last_step = max([row.last_step] + [n.last_step for n in nodes])
            attempt_saved(row, saved)   # a save after the last report counts as reached
            s.add(row)
            add_event(s, row.job_id, f"attempt_{reason.value}",
                      f"attempt {row.number}: {row.detail}", attempt_id=row.id)
            j = s.get(Job, row.job_id)
            job_reached(j, saved)
            self._outcome._advance_job(s, j, row, reason, now)
            s.commit()
        self._waiting.discard(a.id)


def _tries(detail: str | None) -> int:
    parts = (detail or "").split()
    return int(parts[1]) if len(parts) == 2 and parts[0] == "tries" and parts[1].isdigit() else 0


def _first_reason(ended: list[AttemptNode]) -> EndReason:
    reasons = [n.end_reason for n in ended if n.end_reason is not None]
    return reasons[0] if reasons else EndReason.LOST


