"""Audit figures from the database: actual spend by line, the on-demand baseline, waste.

Actual figures are sums of raw ledger rows (nothing re-priced). The baseline is,
for every attempt, the on-demand cost of the progress it kept (steps that survived
into the next checkpoint) on the same instance type at the job's measured speed
on that type, without interruptions; the job's baseline is their sum.

Every dollar of actual spend lands in exactly one cause (CAUSES): each attempt's
instance spend is split by time at what it paid per second (`split_attempt`), and
storage, volume and other rows are their own causes, so the causes sum to actual_usd.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable

from sqlmodel import Session

from spotrun.audit.regret import hindsight, hindsight_wanted
from spotrun.audit.reclaims import RECLAIMED_EVENT, AttemptTruth, ReportsOf, ToMarket, \
    attempt_truths, reclaim_times
from spotrun.daemon.savefail import save_warnings
from spotrun.audit.node_lines import node_lines, node_seconds, replacement_seconds
from spotrun.db import Attempt, AttemptNode, Job, JobRows, PricePointsOnce, SpendEntry, \
    events_by_job, iter_jobs, jobs_by_ref, rows_by_job
from spotrun.errors import NotFoundError
from spotrun.ledger.intervals import seconds_between
from spotrun.providers.billing_rules import SpendKind
from spotrun.states import EndReason, JobState, Market

OdPrice = Callable[[str], "float | None"]
CheckpointStep = Callable[[Job], "int | None"]
# Every dollar of a job lands in exactly one cause; hours are provider-clock hours.
ATTEMPT_CAUSES = ("productive", "lost_work", "startup", "restart_overhead", "paid_idle",
                  "checkpoint_stall")
CAUSES = ATTEMPT_CAUSES + ("waiting_for_capacity",
                           # Multi-node jobs: the surviving nodes' paid wait while a lost node
                           # is replaced (spotrun.audit.node_lines).
                           "node_replacement",
                           "storage", "volumes",
                           # Checkpoints copied out of a cloud when a job moved (clouds.md).
                           "egress", "other")
WASTE_CAUSES = ("lost_work", "restart_overhead", "waiting_for_capacity", "checkpoint_stall",
                "paid_idle", "node_replacement")


@dataclass
class AttemptAudit:
    """One attempt's share of the audit."""

    number: int
    market: str
    instance_type: str
    zone: str
    started_at: datetime | None
    ended_at: datetime | None
    end_reason: str | None
    used_s: float
    instance_usd: float
    gained_steps: int
    kept_steps: int
    lost_steps: int | None            # None: still running, or its last step is unknown
    steps_per_hour: float | None      # the speed its causes are split at (its own, measured)
    od_usd_per_hour: float | None
    baseline_usd: float
    overhead_s: float | None
    stall_s: float | None
    wait_before_s: float | None
    resumed_from: int = 0
    ran_to: int | None = 0           # None: no report named a step of it
    causes: dict = field(default_factory=dict)
    not_charged_usd: float = 0.0
    nodes: list = field(default_factory=list)    # multi-node: one line per node instance
    notice_outcome: str | None = None             # what the notice achieved, as the agent said
    time_to_resume: dict | None = None            # the reclaim before it -> its first new step
    trained_until: datetime | None = None         # its command's end (exit report), if known
    cloud: str | None = None                      # the provider it ran on (None: not recorded)

    def to_dict(self) -> dict:
        """The JSON view of one attempt (times on the provider clock: `*_market`)."""
        d = {k: v for k, v in vars(self).items() if k not in ("causes", "started_at",
                                                               "ended_at", "trained_until")}
        d["started_at_market"], d["ended_at_market"] = self.started_at, self.ended_at
        d["trained_until_market"] = self.trained_until
        d["causes"] = {c: {"hours": w.hours, "usd": w.usd} for c, w in self.causes.items()}
        return d


@dataclass
class WasteLine:
    """Time and money lost to one cause (None = not measured)."""

    hours: float | None = 0.0
    usd: float | None = 0.0

    def add(self, hours: float | None, usd: float | None) -> None:
        """Accumulate; an unmeasured part leaves the line's known parts alone."""
        if hours is not None:
            self.hours = (self.hours or 0.0) + hours
        if usd is not None:
            self.usd = (self.usd or 0.0) + usd


@dataclass
class JobAudit:
    """Per-job audit figures."""

    id: str
    name: str
    state: str
    project: str = "default"
    owner: str = "unknown"
    spot_usd: float = 0.0
    on_demand_usd: float = 0.0
    volume_usd: float = 0.0
    storage_usd: float = 0.0
    egress_usd: float = 0.0          # checkpoints copied out of a cloud (docs/clouds.md)
    other_usd: float = 0.0
    actual_usd: float = 0.0
    baseline_on_demand_usd: float = 0.0
    baseline_reference_usd: float | None = None
    reference_instance: str | None = None
    saved_usd: float = 0.0
    saved_fraction: float | None = None
    preemptions: int = 0
    kept_steps: int = 0
    lost_steps: int = 0              # summed over the attempts whose lost steps are known
    lost_steps_unknown: int = 0      # ended attempts whose last step no report gave
    ledger_rows: int = 0
    hindsight_regret_usd: float | None = None
    hindsight_optimal_usd: float | None = None   # instance cost of the best schedule
    waste: dict[str, WasteLine] = field(default_factory=dict)
    causes: dict[str, WasteLine] = field(default_factory=dict)
    not_charged: WasteLine = field(default_factory=WasteLine)   # free reclaims (first hour)
    time_scale: float = 1.0          # provider-clock seconds per wall second
    attempts: list[AttemptAudit] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # (start, end, usd) pieces for the plot: spend accrues over each row's interval,
    # the baseline over each attempt's.
    spend_spans: list[tuple[datetime, datetime, float]] = field(default_factory=list)
    baseline_spans: list[tuple[datetime, datetime, float]] = field(default_factory=list)
    reclaims: list[datetime] = field(default_factory=list)
    notices: list[datetime] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The JSON view (`spotrun audit --json` element)."""
        return {
            "id": self.id, "name": self.name, "state": self.state,
            "project": self.project, "owner": self.owner,
            "actual_usd": self.actual_usd, "spot_usd": self.spot_usd,
            "on_demand_usd": self.on_demand_usd, "volume_usd": self.volume_usd,
            "storage_usd": self.storage_usd, "egress_usd": self.egress_usd,
            "other_usd": self.other_usd,
            "baseline_on_demand_usd": self.baseline_on_demand_usd,
            "baseline_reference_usd": self.baseline_reference_usd,
            "reference_instance": self.reference_instance,
            "saved_usd": self.saved_usd, "saved_fraction": self.saved_fraction,
            "preemptions": self.preemptions, "reclaims": self.preemptions,
            "kept_steps": self.kept_steps, "lost_steps": self.lost_steps,
            "lost_steps_unknown": self.lost_steps_unknown,
            "ledger_rows": self.ledger_rows,
            "causes": {k: {"hours": w.hours, "usd": w.usd} for k, w in self.causes.items()},
            "causes_total_usd": self.causes_total_usd(),
            "not_charged": {"hours": self.not_charged.hours, "usd": self.not_charged.usd,
                            "what": NOT_CHARGED_NOTE},
            "hindsight_regret_usd": self.hindsight_regret_usd,
            "hindsight_optimal_usd": self.hindsight_optimal_usd,
            "hindsight_note": HINDSIGHT_NOTE,
            "waste": {k: {"hours": w.hours, "usd": w.usd} for k, w in self.waste.items()},
            "hours_clock": "market" if self.time_scale != 1.0 else "provider",
            "time_scale": self.time_scale,
            "attempts": [a.to_dict() for a in self.attempts],
            "notes": list(self.notes),
        }

    def causes_total_usd(self) -> float:
        """The sum of every cause's dollars (equals actual_usd)."""
        return sum(w.usd or 0.0 for w in self.causes.values())


NOT_CHARGED_NOTE = ("spot reclaimed by the provider within its first hour: AWS charges "
                    "nothing; the amount is what those seconds were booked at, then reversed")
HINDSIGHT_NOTE = ("hindsight optimum: the cheapest schedule knowing the whole market in "
                  "advance; it pays every second it runs, so a job with free reclaims "
                  "(not charged) can cost less than it (negative regret)")


def audit_jobs(s: Session, refs: list[str] | None = None, *, since: datetime | None = None,
               until: datetime | None = None, od_price: OdPrice,
               checkpoint_step: CheckpointStep | None = None,
               reports_of: ReportsOf | None = None, to_market: ToMarket | None = None,
               time_scale: float = 1.0, jobs: list[Job] | None = None) -> list[JobAudit]:
    """Audit the named jobs (all jobs when refs is empty; jobs: these rows, already read),
    in the order given / created. reports_of: the agents' own reports of an attempt (none:
    the database's figures only); to_market: a wall time on the provider's clock.

    Every job's rows are read up front, a query per table (`rows_by_job`), never per job.
    """
    all_jobs = jobs is None and not refs
    if jobs is None and refs:
        jobs = []
        for ref, job in zip(refs, jobs_by_ref(s, refs)):
            if job is None:
                raise NotFoundError("no such job", field="JOB", value=ref,
                                    hint="see `spotrun status`")
            jobs.append(job)
    elif jobs is None:
        jobs = list(iter_jobs(s))
    rows = read_rows(s, jobs, all_jobs=all_jobs)
    reclaims = events_by_job(s, None if all_jobs else [j.id for j in jobs], kind=RECLAIMED_EVENT)
    return [audit_job(s, j, since=since, until=until, od_price=od_price,
                      checkpoint_step=checkpoint_step, reports_of=reports_of,
                      to_market=to_market, time_scale=time_scale,
                      rows=rows.get(j.id) or JobRows(),
                      reclaimed_at=reclaim_times(reclaims.get(j.id, [])))
            for j in jobs]


def read_rows(s: Session, jobs: list[Job], *, all_jobs: bool = False) -> dict[str, JobRows]:
    """The audit's rows of these jobs, a query per table; what hindsight needs for finished
    jobs once a model builder is registered (their waiting events, the pools' prices)."""
    ids = None if all_jobs else [j.id for j in jobs]
    rows = rows_by_job(s, ids)
    done = [j.id for j in jobs if j.state.is_terminal()]
    if done and hindsight_wanted():
        waiting = events_by_job(s, None if all_jobs else done, kind="waiting")
        prices = PricePointsOnce({a.instance_type for jid in done
                                  for a in (rows.get(jid) or JobRows()).attempts})
        for jid in done:
            r = rows.setdefault(jid, JobRows())
            r.waiting, r.prices = waiting.get(jid, []), prices
    return rows


def audit_job(s: Session, job: Job, *, since: datetime | None = None,
              until: datetime | None = None, od_price: OdPrice,
              checkpoint_step: CheckpointStep | None = None,
              reports_of: ReportsOf | None = None, to_market: ToMarket | None = None,
              time_scale: float = 1.0, rows: JobRows | None = None,
              reclaimed_at: dict[int, datetime] | None = None) -> JobAudit:
    """Every figure for one job (rows, reclaimed_at: its rows and reclaim times as
    audit_jobs read them; None: read here)."""
    if rows is None:
        rows = read_rows(s, [job]).get(job.id) or JobRows()
    if reclaimed_at is None:
        reclaimed_at = reclaim_times(events_by_job(s, [job.id], kind=RECLAIMED_EVENT)
                                     .get(job.id, []))
    out = JobAudit(id=job.id, name=job.name, state=job.state.value, project=job.project,
                   owner=job.owner, time_scale=time_scale)
    ledger = [r for r in rows.spend if _in_window(r.start, since, until)]
    _actuals(out, ledger)
    all_atts = rows.attempts
    atts = [a for a in all_atts if a.started_at is None or _in_window(a.started_at, since, until)]
    usd_by_attempt: dict[int, float] = defaultdict(float)
    gross_by_attempt: dict[int, float] = defaultdict(float)
    booked_end: dict[int, datetime] = {}
    usd_by_instance: dict[str, float] = defaultdict(float)
    for r in ledger:
        if r.attempt_id is not None and r.kind in SpendKind.instance_kinds():
            usd_by_attempt[r.attempt_id] += r.usd
            usd_by_instance[r.instance_id or ""] += r.usd
            if r.kind == SpendKind.COMPUTE.value:
                gross_by_attempt[r.attempt_id] += r.usd
                booked_end[r.attempt_id] = max(r.end, booked_end.get(r.attempt_id, r.end))
    ckpt = checkpoint_step(job) if checkpoint_step else None
    nodes = {a.id: rows.nodes_of(a.id) for a in atts if a.nodes > 1 or a.nodes_min is not None}
    truths = attempt_truths(job, all_atts, reports_of, reclaimed_at=reclaimed_at,
                            to_market=to_market, checkpointed=ckpt)
    _attempts(out, job, all_atts, atts, usd_by_attempt, gross_by_attempt, booked_end,
              od_price, ckpt, truths, nodes, usd_by_instance)
    # Instance rows of no attempt audited here (outside the window, an orphan's) are "other".
    audited = {a.id for a in atts if a.started_at is not None}
    loose = sum(u for aid, u in usd_by_attempt.items() if aid not in audited) + sum(
        r.usd for r in ledger if r.attempt_id is None and r.kind in SpendKind.instance_kinds())
    out.causes["storage"] = WasteLine(None, out.storage_usd)   # GB-months, not hours
    out.causes["volumes"] = WasteLine(None, out.volume_usd)
    out.causes["egress"] = WasteLine(None, out.egress_usd)      # bytes moved between clouds
    out.causes["other"] = WasteLine(None, out.other_usd + loose)
    _reference(out, job, od_price)
    out.saved_usd = out.baseline_on_demand_usd - out.actual_usd
    out.saved_fraction = (out.saved_usd / out.baseline_on_demand_usd
                          if out.baseline_on_demand_usd > 0 else None)
    h = hindsight(s, job, rows)
    if h is not None:
        out.hindsight_optimal_usd, out.hindsight_regret_usd = h.optimal_usd, h.regret_usd
    return out


def _in_window(t: datetime, since: datetime | None, until: datetime | None) -> bool:
    return (since is None or t >= since) and (until is None or t < until)


def _actuals(out: JobAudit, rows: list[SpendEntry]) -> None:
    for r in rows:
        if r.kind in SpendKind.instance_kinds():
            if r.market == Market.ON_DEMAND.value:
                out.on_demand_usd += r.usd
            else:
                out.spot_usd += r.usd
        elif r.kind == SpendKind.VOLUME.value:
            out.volume_usd += r.usd
        elif r.kind in (SpendKind.STORAGE.value, SpendKind.REQUESTS.value):
            out.storage_usd += r.usd
        elif r.kind == SpendKind.EGRESS.value:
            out.egress_usd += r.usd
        else:
            out.other_usd += r.usd
        out.actual_usd += r.usd
        out.spend_spans.append((r.start, r.end, r.usd))
    out.ledger_rows = len(rows)


def _attempts(out: JobAudit, job: Job, all_atts: list[Attempt], atts: list[Attempt],
              usd_by_attempt: dict[int, float], gross_by_attempt: dict[int, float],
              booked_end: dict[int, datetime], od_price: OdPrice, ckpt: int | None,
              truths: dict[int, AttemptTruth], nodes: dict[int, list[AttemptNode]] | None = None,
              usd_by_instance: dict[str, float] | None = None) -> None:
    prev = {a.id: all_atts[i - 1] if i > 0 else None for i, a in enumerate(all_atts)}
    facts = []
    for a in atts:
        if a.started_at is None:
            continue   # never ran: nothing billed, nothing gained
        tr = truths[a.id]
        end = a.ended_at or booked_end.get(a.id)   # still running: as far as booked
        used_s = seconds_between(a.started_at, end) if end else 0.0
        # The agent's reports may tell of steps after the daemon's last read (the notice's).
        ran_to = tr.last_step if tr.last_step is not None else a.last_step
        n = tr.resumed_by
        if n is not None:
            end_step = n.start_step
        elif job.state is JobState.SUCCEEDED:
            end_step = max(ran_to, job.last_step)
        else:
            end_step = ckpt if ckpt is not None else job.last_step
        kept = max(end_step - a.start_step, 0)
        gained = max(ran_to - a.start_step, kept)
        overhead = seconds_between(a.started_at, a.running_at) if a.running_at else None
        p = prev[a.id]
        wait = (seconds_between(p.ended_at, a.started_at)
                if p is not None and p.ended_at is not None else None)
        train_s = _training_s(a, end, tr.trained_until, overhead)
        facts.append((a, end, used_s, gained, kept, overhead, wait, ran_to, train_s))
    out.notes += save_warnings(atts)   # failed checkpoint saves (spotrun.daemon.savefail)
    rates = _rates([(f[0].instance_type, f[3], f[8], f[2]) for f in facts], out)
    out.waste = {c: WasteLine() for c in WASTE_CAUSES}
    out.causes = {c: WasteLine() for c in CAUSES}
    for a, end, used_s, gained, kept, overhead, wait, _ran_to, train_s in facts:
        tr = truths[a.id]
        rate = rates.get(a.instance_type)
        od = od_price(a.instance_type)
        base = kept / rate / 3600.0 * od if rate and od else 0.0
        if kept and (rate is None or od is None):
            missing = "speed" if rate is None else "on-demand price"
            out.notes.append(f"attempt {a.number}: no {missing}"
                             f" for {a.instance_type}; its baseline is left out")
        # Causes at the attempt's own speed: steps made over the time it trained (a paced
        # market's clock runs at other rates in other attempts, and so does a busy host).
        own = gained / train_s if train_s is not None and train_s > 0 and gained > 0 else rate
        inst_usd = usd_by_attempt.get(a.id, 0.0)
        # Unsaved steps of an attempt still running are work in progress, not (yet) lost.
        lost = 0 if a.ended_at is None else gained - kept
        first = prev[a.id] is None
        mine = (nodes or {}).get(a.id) or []
        if mine:
            split = _split_nodes(mine, end, used_s=used_s, inst_usd=inst_usd, overhead_s=overhead,
                                 stall_s=a.checkpoint_stall_s, kept_steps=gained - lost,
                                 lost_steps=lost, steps_per_s=own, first=first)
        else:
            split = split_attempt(used_s=used_s, inst_usd=inst_usd, overhead_s=overhead,
                                  stall_s=a.checkpoint_stall_s, kept_steps=gained - lost,
                                  lost_steps=lost, steps_per_s=own, first=first)
        free = (a.end_reason is EndReason.RECLAIMED and abs(inst_usd) < 1e-12
                and gross_by_attempt.get(a.id, 0.0) > 0)
        aa = AttemptAudit(
            number=a.number, market=a.market.value, instance_type=a.instance_type, zone=a.zone,
            started_at=a.started_at, ended_at=a.ended_at,
            end_reason=a.end_reason.value if a.end_reason else None, used_s=used_s,
            instance_usd=inst_usd, gained_steps=gained, kept_steps=kept,
            lost_steps=tr.lost_steps, steps_per_hour=own * 3600.0 if own else None,
            od_usd_per_hour=od, baseline_usd=base, overhead_s=overhead,
            stall_s=a.checkpoint_stall_s, wait_before_s=wait, resumed_from=a.start_step,
            ran_to=tr.last_step, causes=split, cloud=a.cloud,
            not_charged_usd=gross_by_attempt.get(a.id, 0.0) if free else 0.0,
            nodes=node_lines(mine, usd_by_instance or {}, end),
            notice_outcome=tr.notice_outcome, time_to_resume=tr.time_to_resume,
            trained_until=tr.trained_until)
        out.attempts.append(aa)
        out.baseline_on_demand_usd += base
        out.kept_steps += kept
        out.lost_steps += tr.lost_steps or 0
        if a.ended_at is not None and tr.lost_steps is None:
            out.lost_steps_unknown += 1
        for cause, line in split.items():
            out.causes[cause].add(line.hours, line.usd)
        if wait is not None and wait > 0:
            out.causes["waiting_for_capacity"].add(wait / 3600.0, 0.0)
        if free:
            out.not_charged.add(used_s / 3600.0, aa.not_charged_usd)
        for n in mine:   # a multi-node attempt: each reclaimed node is one preemption
            if n.end_reason is EndReason.RECLAIMED:
                out.preemptions += 1
                out.reclaims.append(n.ended_at or a.started_at)
        if a.end_reason is EndReason.RECLAIMED and not mine:
            out.preemptions += 1
            out.reclaims.append(a.ended_at or a.started_at)
        if a.notice_at is not None:
            out.notices.append(a.notice_at)
        if base and end is not None:
            out.baseline_spans.append((a.started_at, end, base))
    for cause in WASTE_CAUSES:
        out.waste[cause] = out.causes[cause]
    if any(prev[f[0].id] is not None and f[5] is None for f in facts):
        out.notes.append("restart overhead not measured for some attempts (no running_at)")
    if out.lost_steps_unknown:
        out.notes.append(f"lost steps unknown for {out.lost_steps_unknown} attempt(s): no "
                         "report named their last step (not counted as 0)")


def _training_s(a: Attempt, end: datetime | None, trained_until: datetime | None,
                overhead_s: float | None) -> float | None:
    """Provider seconds the attempt trained: from its first progress (running_at) to its
    command's end (its exit report; none: its instance's end), less its checkpoint stalls;
    None when its start of training is unknown."""
    if overhead_s is None or end is None or a.started_at is None:
        return None
    stop = min(end, trained_until) if trained_until is not None else end
    return seconds_between(a.started_at, stop) - overhead_s - (a.checkpoint_stall_s or 0.0)


def split_attempt(*, used_s: float, inst_usd: float, overhead_s: float | None,
                  stall_s: float | None, kept_steps: int, lost_steps: int,
                  steps_per_s: float | None, first: bool) -> dict[str, WasteLine]:
    """One attempt's paid seconds and dollars by cause; the dollars sum to inst_usd exactly.

    Boot (started -> running_at) is `startup` on the first attempt and `restart_overhead`
    after; checkpoint stalls are measured; kept and lost steps take steps / speed seconds of
    the training time left (scaled down together if that is more than there was); whatever
    training time remains is `paid_idle` (the instance ran, no step was made or kept).
    """
    used = max(used_s, 0.0)
    boot = min(max(overhead_s or 0.0, 0.0), used)
    stall = min(max(stall_s or 0.0, 0.0), used - boot)
    train = used - boot - stall
    prod = kept_steps / steps_per_s if steps_per_s and kept_steps > 0 else 0.0
    lost = lost_steps / steps_per_s if steps_per_s and lost_steps > 0 else 0.0
    if steps_per_s is None and train > 0:
        # No speed: the training time is split by steps, so nothing is left as idle.
        total = kept_steps + max(lost_steps, 0)
        prod, lost = (train * kept_steps / total, train * lost_steps / total) if total else \
            (0.0, 0.0)
    if prod + lost > train and prod + lost > 0:
        scale = train / (prod + lost)
        prod, lost = prod * scale, lost * scale
    idle = max(train - prod - lost, 0.0)
    secs = {"productive": prod, "lost_work": lost, "checkpoint_stall": stall,
            "startup" if first else "restart_overhead": boot, "paid_idle": idle}
    out = {c: WasteLine() for c in ATTEMPT_CAUSES}
    if used <= 0:
        out["paid_idle"] = WasteLine(0.0, inst_usd)   # a minimum charge with no run time
        return out
    usd_per_s = inst_usd / used
    for cause, s in secs.items():
        out[cause] = WasteLine(s / 3600.0, s * usd_per_s)
    # Rounding: the largest line takes the last fraction of a cent, so the sum is exact.
    big = max(out, key=lambda c: abs(out[c].usd or 0.0))
    out[big].usd = (out[big].usd or 0.0) + inst_usd - sum(w.usd or 0.0 for w in out.values())
    return out


def _split_nodes(nodes: list[AttemptNode], end: datetime | None, *, used_s: float,
                 inst_usd: float, overhead_s: float | None, stall_s: float | None,
                 kept_steps: int, lost_steps: int, steps_per_s: float | None,
                 first: bool) -> dict[str, WasteLine]:
    """split_attempt in node-seconds, with the survivors' wait for replacements on its own."""
    node_s = node_seconds(nodes, end)
    if node_s <= 0 or used_s <= 0:
        out = split_attempt(used_s=used_s, inst_usd=inst_usd, overhead_s=overhead_s,
                            stall_s=stall_s, kept_steps=kept_steps, lost_steps=lost_steps,
                            steps_per_s=steps_per_s, first=first)
        out["node_replacement"] = WasteLine()
        return out
    k = node_s / used_s                      # nodes paid on average over the attempt
    repl_s = min(replacement_seconds(nodes, end), node_s)
    frac = repl_s / node_s
    out = split_attempt(used_s=node_s - repl_s, inst_usd=inst_usd * (1.0 - frac),
                        overhead_s=overhead_s * k if overhead_s is not None else None,
                        stall_s=stall_s * k if stall_s is not None else None,
                        kept_steps=kept_steps, lost_steps=lost_steps,
                        steps_per_s=steps_per_s / k if steps_per_s else None, first=first)
    out["node_replacement"] = WasteLine(repl_s / 3600.0, inst_usd * frac)
    return out


def _rates(facts: list[tuple[str, int, float | None, float]], out: JobAudit
           ) -> dict[str, float]:
    """Measured steps per provider-second on each instance type (the baseline's speed):
    facts are (type, steps gained, seconds trained or None if unknown, seconds used)."""
    by_type: dict[str, list] = defaultdict(list)
    for f in facts:
        by_type[f[0]].append(f)
    rates: dict[str, float] = {}
    for itype, fs in by_type.items():
        known = [(g, train) for _t, g, train, _u in fs if train is not None and g > 0]
        steps = sum(g for g, _ in known)
        secs = sum(max(p, 0.0) for _, p in known)
        if steps > 0 and secs > 0:
            rates[itype] = steps / secs
            continue
        # Without a measured start of training, the best attempt's overall rate is the
        # fastest (least overhead-diluted) figure: it keeps the baseline on the low side.
        best = [g / used for _t, g, _train, used in fs if g > 0 and used > 0]
        if best:
            rates[itype] = max(best)
            out.notes.append(f"{itype}: speed from the fastest attempt (training start unknown)")
    return rates


def _reference(out: JobAudit, job: Job, od_price: OdPrice) -> None:
    work = (job.spec.get("work") or {})
    ref, hours = work.get("reference_instance"), work.get("reference_hours")
    total = work.get("total_steps") or job.total_steps
    out.reference_instance = ref
    if ref and hours and total:
        od = od_price(ref)
        if od is not None:
            out.baseline_reference_usd = min(out.kept_steps / total, 1.0) * hours * od
