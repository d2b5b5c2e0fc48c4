"""Orphan sweeper: a spotrun-tagged instance that no live attempt owns is terminated and booked.

Orphans come from a lost or restored database, a second daemon that should not have
run, or an attempt that ended while its instance kept going. An instance waits a
grace period first (a launch may be half recorded). Its seconds are booked once it
has ended: through its attempt when the tags name one that never got an instance id
(re-attached), else as attempt-less ledger rows under the job named by its tags.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlmodel import select

from spotrun.daemon.context import DaemonContext
from spotrun.db import Attempt, AttemptNode, LedgerMark, SpendEntry, add_event, session
from spotrun.ledger.intervals import seconds_between
from spotrun.providers.billing_rules import BillingRules, PriceSource, SpendKind
from spotrun.providers.facts import rules_for
from spotrun.providers.base import TAG_ATTEMPT, TAG_JOB, TAG_MANAGED, InstanceInfo
from spotrun.states import AttemptState, Market, TerminationCause

UNKNOWN_JOB = "(orphan)"   # ledger/event job id for an instance whose tags name no job


def orphan_key(instance_id: str) -> str:
    """LedgerMark key of an orphan booked without an attempt."""
    return f"orphan:{instance_id}"


@dataclass
class OrphanTick:
    """What one sweep did."""

    terminated: list[str] = field(default_factory=list)
    reattached: list[str] = field(default_factory=list)
    booked: list[str] = field(default_factory=list)


class OrphanLoop:
    """Each tick: find unowned spotrun instances, terminate them after the grace, book them."""

    name = "orphans"

    def __init__(self, ctx: DaemonContext, *, rules: BillingRules | None = None) -> None:
        self.ctx = ctx
        self.rules = rules or rules_for(ctx.provider.name)
        self._first_seen: dict[str, datetime] = {}   # wall clock; a restart starts the grace anew

    def tick(self, now: datetime) -> OrphanTick:
        """One sweep over every instance the provider reports."""
        out = OrphanTick()
        managed = [i for i in self.ctx.provider.describe()
                   if i.tags.get(TAG_MANAGED) == "true"]
        with session(self.ctx.engine) as s:
            atts = list(s.exec(select(Attempt)))
            booked = {m.key for m in s.exec(select(LedgerMark).where(
                LedgerMark.key.startswith("orphan:")))}
            # A multi-node attempt owns its nodes' instances while the node is live.
            by_id = {a.id: a for a in atts}
            nodes = list(s.exec(select(AttemptNode)))
        by_iid = {a.instance_id: a for a in atts if a.instance_id}
        node_of = {n.instance_id: n for n in nodes if n.instance_id}
        pending_tokens = {n.client_token for n in nodes
                          if n.instance_id is None and not n.state.is_terminal()}
        for info in managed:
            node = node_of.get(info.instance_id)
            if node is not None:
                # The spend loop books node instances; a live one whose node ended is swept.
                if not info.state.is_terminal() and node.state.is_terminal():
                    self._sweep(info, by_id.get(node.attempt_id), now, out)
                continue
            att = by_iid.get(info.instance_id)
            if att is None:
                att = self._reattach(info, atts, out)
            if not info.state.is_terminal():
                if att is not None and att.state is not AttemptState.ENDED:
                    self._first_seen.pop(info.instance_id, None)
                    continue
                if self._pending_launch(info, atts) or (
                        info.client_token and info.client_token in pending_tokens):
                    continue   # the scheduler (or node loop) adopts it by client token
                self._sweep(info, att, now, out)
            elif att is None and orphan_key(info.instance_id) not in booked:
                if self._pending_launch(info, atts) or (
                        info.client_token and info.client_token in pending_tokens):
                    # Ended before its launch was recorded: the scheduler (or reconcile, once
                    # it ends that attempt) adopts it and books it; booking it here too would
                    # count its seconds twice (loops run side by side).
                    continue
                self._book(info, now)
                out.booked.append(info.instance_id)
        return out

    # ------------------------------------------------------------ ownership

    @staticmethod
    def _tagged(info: InstanceInfo, atts: list[Attempt]) -> Attempt | None:
        job, number = info.tags.get(TAG_JOB), info.tags.get(TAG_ATTEMPT)
        for a in atts:
            if info.client_token and a.client_token == info.client_token:
                return a
            if a.job_id == job and str(a.number) == number:
                return a
        return None

    def _pending_launch(self, info: InstanceInfo, atts: list[Attempt]) -> bool:
        a = self._tagged(info, atts)
        return a is not None and a.state is AttemptState.LAUNCHING and a.instance_id is None

    def _reattach(self, info: InstanceInfo, atts: list[Attempt], out: OrphanTick
                  ) -> Attempt | None:
        """An attempt named by the tags that never learnt its instance id gets it now."""
        a = self._tagged(info, atts)
        if a is None or a.instance_id is not None or a.state is not AttemptState.ENDED:
            return None
        with session(self.ctx.engine) as s:
            if s.get(LedgerMark, f"attempt:{a.id}") is not None:
                return None   # already closed as never started: book it attempt-less
            row = s.get(Attempt, a.id)
            row.instance_id = info.instance_id
            row.started_at = info.launched_at
            if info.ended_at is not None:
                row.ended_at = info.ended_at
            s.add(row)
            add_event(s, row.job_id, "orphan_reattached",
                      f"attempt {row.number}: instance {info.instance_id} found by its tags",
                      attempt_id=row.id)
            s.commit()
        out.reattached.append(info.instance_id)
        self.ctx.log.warning("orphan_reattached", instance=info.instance_id, job=row.job_id,
                             attempt=row.number)
        return row

    # ------------------------------------------------------------ acting

    def _sweep(self, info: InstanceInfo, att: Attempt | None, now: datetime,
               out: OrphanTick) -> None:
        first = self._first_seen.setdefault(info.instance_id, now)
        grace = timedelta(seconds=self.ctx.settings.daemon.orphan_grace_s)
        if now - first < grace:
            return
        self.ctx.provider.terminate(info.instance_id)
        self._first_seen.pop(info.instance_id, None)
        job = info.tags.get(TAG_JOB) or UNKNOWN_JOB
        with session(self.ctx.engine) as s:
            add_event(s, job, "orphan_terminated",
                      f"instance {info.instance_id} ({info.instance_type} {info.zone}) had no "
                      "live attempt", attempt_id=att.id if att else None)
            s.commit()
        out.terminated.append(info.instance_id)
        self.ctx.log.warning("orphan_terminated", instance=info.instance_id, job=job)

    def _book(self, info: InstanceInfo, now: datetime) -> None:
        """Book an ended orphan's billed seconds as attempt-less rows (once: its mark)."""
        start = info.launched_at
        end = info.ended_at or start
        used_s = max(seconds_between(start, end), 0.0)
        reclaimed = info.cause is TerminationCause.SPOT_RECLAIM
        billed_s = self.rules.billed_seconds(used_s, market=info.market,
                                             reclaimed_by_provider=reclaimed)
        price, source = self._price(info)
        job = info.tags.get(TAG_JOB) or UNKNOWN_JOB
        base = dict(job_id=job, attempt_id=None, instance_id=info.instance_id,
                    market=info.market.value, instance_type=info.instance_type, zone=info.zone,
                    price_usd_per_hour=price, price_source=source, booked_at=now)
        rows = [SpendEntry(kind=SpendKind.COMPUTE.value, start=start, end=end,
                           billed_seconds=used_s, usd=used_s / 3600.0 * price,
                           note="orphan instance: no attempt owned it", **base)]
        if abs(billed_s - used_s) > 1e-6:
            kind = SpendKind.ADJUSTMENT if billed_s > used_s else SpendKind.CORRECTION
            diff = billed_s - used_s
            rows.append(SpendEntry(kind=kind.value, start=end, end=end, billed_seconds=diff,
                                   usd=diff / 3600.0 * price,
                                   note=f"billing rules: ran {used_s:.3f} s, billed "
                                        f"{billed_s:.0f} s", **base))
        with session(self.ctx.engine) as s:
            for r in rows:
                s.add(r)
            s.add(LedgerMark(key=orphan_key(info.instance_id), job_id=job, booked_until=end,
                             closed=True, version=1))
            add_event(s, job, "orphan_booked",
                      f"instance {info.instance_id}: {billed_s:.0f} s at ${price:.3f}/h")
            s.commit()

    def _price(self, info: InstanceInfo) -> tuple[float, str]:
        if info.price_usd_per_hour is not None:
            return float(info.price_usd_per_hour), PriceSource.LAUNCH.value
        if info.market is Market.SPOT:
            spot = self.ctx.provider.spot_price(info.instance_type, info.zone)
            if spot is not None:
                return spot, PriceSource.SPOT_NOW.value
        return self.ctx.provider.on_demand_price(info.instance_type), PriceSource.ON_DEMAND.value
