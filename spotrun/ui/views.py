"""One function per view: the CLI's --json and the dashboard's JSON are the same calls.

`status_view` is `spotrun status --json` (a list, or one object for one job), `audit_view`
is `spotrun audit` (its JSON is `[a.to_dict() ...]`), `job_page` is what the dashboard's
job page shows (status + audit + curves + log tail). They only read the database and the
store's reports; they never call a cloud.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any, Callable

from sqlalchemy import func
from sqlmodel import Session, select

from spotrun import layout
from spotrun.daemon.nodes import node_view
from spotrun.db import Attempt, AttemptNode, Job, JobRows, SpendEntry, attempts_by_job, \
    events_by_job, find_job, iter_jobs, open_settings_db, rows_by_job, session, where_ids
from spotrun.daemon.savefail import save_warnings
from spotrun.errors import NotFoundError
from spotrun.audit.reclaims import RECLAIMED_EVENT, AttemptReports, ToMarket, attempt_truths, \
    reclaim_times
from spotrun.reports import ExitReport, Heartbeat, Notice, parse_report
from spotrun.states import EndReason, JobState
from spotrun.providers.timescale import WallToProvider, clock_info, provider_now, time_scale
from spotrun.budgets.marks import stop_phrase
from spotrun.budgets.source import effective
from spotrun.budgets.standing import read_standing
from spotrun.ledger.stopmargin import stop_margin_for
from spotrun.config import scope_key
from spotrun.daemon.lease import live_holder, no_daemon_reason
from spotrun.store import open_store
from spotrun.audit import audit_jobs
from spotrun.audit.plot import cumulative_curve
from spotrun.audit.regret import MODEL_FOR_JOB, use_observed_model
from spotrun.providers.facts import od_price_for

LOG_TAIL_BYTES = 8000


class Reports:
    """The agents' own last reports per attempt (heartbeat, exit, notice), read from the store."""

    def __init__(self, opener: Callable[[str], Any] | None = None) -> None:
        self._open = opener or open_store
        self._stores: dict[str, Any] = {}
        # Attempts whose agent wrote its last report (exit.json is written last) or whose
        # job is over: their reports never change. Any other attempt is read each time: an
        # agent may write its last heartbeat after the daemon saw its instance end.
        self._final: dict[tuple[str, int], AttemptReports] = {}

    def store(self, uri: str) -> Any:
        """The store at uri, opened once."""
        if uri not in self._stores:
            self._stores[uri] = self._open(uri)
        return self._stores[uri]

    def _report(self, uri: str, key: str, cls: type) -> Any:
        try:
            return parse_report(self.store(uri).get_bytes(key), cls)
        except Exception:   # a missing or unreadable report is simply not known
            return None

    def attempt(self, job: Job, att: Attempt, *, settled: bool = False) -> AttemptReports:
        """The attempt's last heartbeat, exit report and notice (settled: its job is over)."""
        known = (job.id, att.number)
        if known in self._final:
            return self._final[known]
        uri = job.store_uri
        reps = AttemptReports(
            heartbeat=self._report(uri, layout.heartbeat_key(job.id, att.number), Heartbeat),
            exit=self._report(uri, layout.exit_key(job.id, att.number), ExitReport),
            notice=self._report(uri, layout.notice_key(job.id, att.number), Notice))
        if reps.exit is not None or settled:
            self._final[known] = reps
        return reps

    def of_job(self, job: Job, att: Attempt) -> AttemptReports:
        """`attempt`, settled once the job is over (the views' `ReportsOf`)."""
        return self.attempt(job, att, settled=job.state.is_terminal())

    def final_step(self, job: Job, att: Attempt) -> int | None:
        """The highest step the attempt's agent reported reached or saved (its last heartbeat,
        its exit, the emergency save of its notice)."""
        reps = self.attempt(job, att)
        steps = [s for s in (reps.reported_step(), reps.emergency_step()) if s is not None]
        return max(steps) if steps else None

    def log_tail(self, job: Job, max_bytes: int = LOG_TAIL_BYTES) -> str:
        """The end of the job's output, all attempts in order."""
        try:
            store = self.store(job.store_uri)
            keys = sorted(o.key for o in store.list(f"{layout.job_prefix(job.id)}/logs/")
                          if o.key.endswith(".log"))
            chunks: list[bytes] = []
            size = 0
            for key in reversed(keys):
                data = store.get_bytes(key)
                chunks.insert(0, data)
                size += len(data)
                if size >= max_bytes:
                    break
        except Exception:   # the store may be unreachable: the page shows no log
            return ""
        return b"".join(chunks)[-max_bytes:].decode("utf-8", errors="replace")


def _job(s: Session, ref: str) -> Job:
    job = find_job(s, ref)
    if job is None:
        raise NotFoundError("no such job", field="JOB", value=ref, hint="see `spotrun status`")
    return job


def attempt_nodes(a: Attempt, nodes: list[AttemptNode] | None) -> list[dict[str, Any]]:
    """An attempt's instances as nodes: its AttemptNode rows, or its one instance as rank 0."""
    if nodes:
        return [node_view(n) for n in nodes]
    if a.instance_id is None:
        return []
    return [{"node_rank": 0, "instance_id": a.instance_id, "zone": a.zone,
             "state": a.state.value, "launched_at": a.started_at.isoformat()
             if a.started_at else None,
             "ended_at": a.ended_at.isoformat() if a.ended_at else None,
             "end_reason": a.end_reason.value if a.end_reason else None}]


def job_dict(job: Job, attempts: list[Attempt], *, reports: Reports | None = None,
             spend_usd: float | None = None, clock: dict | None = None,
             nodes: dict[int, list[AttemptNode]] | None = None,
             reclaimed_at: dict[int, datetime] | None = None,
             to_market: ToMarket | None = None) -> dict[str, Any]:
    """The `status --json` view of one job (the brief's contract plus progress, and each
    reclaim's truth: lost steps, time to resume, the notice's outcome; reclaimed_at: the
    wall times the daemon recorded reclaims, by attempt id)."""
    atts = []
    instance_ids: list[str] = []
    truths = attempt_truths(job, attempts, reports.of_job if reports is not None else None,
                            reclaimed_at=reclaimed_at, to_market=to_market)
    for a in attempts:
        node_list = attempt_nodes(a, (nodes or {}).get(a.id or -1))
        instance_ids += [n["instance_id"] for n in node_list
                         if n["instance_id"] and n["instance_id"] not in instance_ids]
        tr = truths.get(a.id or -1)
        atts.append({
            "number": a.number, "state": a.state.value, "market": a.market.value,
            "instance_type": a.instance_type, "zone": a.zone, "instance_id": a.instance_id,
            "cloud": a.cloud, "price_usd_per_hour": a.price_usd_per_hour,
            "started_at_market": a.started_at, "ended_at_market": a.ended_at,
            "notice_at_market": a.notice_at, "running_at_market": a.running_at,
            "created_at_wall": a.created_at,
            "end_reason": a.end_reason.value if a.end_reason else None,
            "resumed_from": a.start_step,
            # None: no step reported yet (a heartbeat from before the restore says nothing).
            "ran_to": tr.last_step if tr is not None else None,
            # Steps the work goes on from below its last step (None: running, or unknown).
            "lost_steps": tr.lost_steps if tr is not None else None,
            "notice_outcome": tr.notice_outcome if tr is not None else None,
            # From the reclaim before it to its first new step, provider-clock seconds.
            "time_to_resume": tr.time_to_resume if tr is not None else None,
            "start_step": a.start_step, "last_step": a.last_step,
            "detail": a.detail if a.state.is_terminal() else None,
            "checkpoint_failures": a.checkpoint_failures,
            "checkpoint_error": a.checkpoint_error,
            "nodes_wanted": a.nodes, "nodes_min": a.nodes_min,
            "nodes": node_list,       # every instance of the attempt (multi-node: per rank)
        })
    budget = job.budget_usd
    return {
        "id": job.id, "name": job.name, "state": job.state.value,
        "project": job.project, "owner": job.owner,
        # Set when a project or owner budget stopped the job: "<scope>:<name>@<period>".
        "budget_stop_scope": job.budget_stop_scope,
        "created_at_wall": job.created_at, "updated_at_wall": job.updated_at,
        "step": job.last_step, "total_steps": job.total_steps,
        "progress": (job.last_step / job.total_steps) if job.total_steps else None,
        "cancel_requested": job.cancel_requested, "reason": _reason(job),
        "budget_usd": budget, "spend_usd": spend_usd,
        "budget_headroom_usd": (budget - spend_usd) if budget is not None
        and spend_usd is not None else None,
        "deadline_at_market": job.deadline_at or _spec_deadline(job),
        "reclaims": reclaims_of(attempts),
        "checkpoint_uri": job.checkpoint_uri,
        "clock": clock or {},
        "attempts": atts,
        "instance_ids": instance_ids,   # every instance the job ever ran on, in launch order
        "warnings": save_warnings(attempts),   # failed checkpoint saves, one line per attempt
    }


def _reason(job: Job) -> str | None:
    """The job's reason; a budget stop names the project or owner budget behind it."""
    if job.budget_stop_scope and job.reason == "budget reached":
        return stop_phrase(job.budget_stop_scope)
    return job.reason


def reclaims_of(attempts: list[Attempt]) -> int:
    """How many of these attempts the provider reclaimed (`status`'s `reclaims`)."""
    return sum(1 for a in attempts if a.end_reason is not None
               and a.end_reason.value == "reclaimed")


def _spec_deadline(job: Job) -> datetime | None:
    if '"deadline"' not in (job.spec_json or ""):
        return None   # most jobs have none: no need to parse their spec (status of 1,000 jobs)
    raw = (job.spec.get("policy") or {}).get("deadline")
    if not raw:
        return None
    try:
        return datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
    except ValueError:
        return None


def spend_by_job(s: Session, job_ids: list[str] | None = None) -> dict[str, float]:
    """Every job's ledger total (USD), or these jobs' (one grouped query)."""
    q = where_ids(select(SpendEntry.job_id, func.sum(SpendEntry.usd)), SpendEntry.job_id,
                  job_ids)
    rows = s.exec(q.group_by(SpendEntry.job_id))
    return {jid: float(total or 0.0) for jid, total in rows}


# Jobs only a daemon moves on: without one they wait whatever their recorded reason says.
WAITS_FOR_DAEMON = (JobState.QUEUED, JobState.RECOVERING)


def daemon_missing(settings: Any, engine: Any, s: Any = None) -> str | None:
    """The reason queued jobs give while no daemon holds the lease; None while one does
    (s: the caller's open session, read instead of taking a second connection)."""
    if live_holder(engine, s=s) is not None:
        return None
    return no_daemon_reason(settings.home_path)


def status_view(settings: Any, ref: str | None = None, *, events: bool = False,
                reports: Reports | None = None, engine: Any = None,
                to_market: ToMarket | None = None) -> Any:
    """`spotrun status --json`: a list of jobs; with ref, that one job as an object
    (to_market: wall times on the provider's clock; default: the settings' provider's)."""
    engine = engine or open_settings_db(settings)
    reports = reports or Reports()
    to_market = to_market or WallToProvider(settings)
    clock = clock_info(settings)
    now: datetime | None = None
    no_daemon: str | None = None
    with session(engine) as s:
        jobs = [_job(s, ref)] if ref else list(iter_jobs(s))
        ids = [j.id for j in jobs] if ref else None
        spend = spend_by_job(s, ids)
        rows = rows_by_job(s, ids, spend=False)
        history = events_by_job(s, ids) if events or ref else {}
        reclaimed = any(a.end_reason is EndReason.RECLAIMED
                        for r in rows.values() for a in r.attempts)
        reclaims = (history if events or ref else events_by_job(s, ids, kind=RECLAIMED_EVENT)) \
            if reclaimed else {}
        if any(j.state in WAITS_FOR_DAEMON for j in jobs):
            no_daemon = daemon_missing(settings, engine, s)
        data = []
        for j in jobs:
            jr = rows.get(j.id) or JobRows()
            atts = jr.attempts
            d = job_dict(j, atts, reports=reports, spend_usd=spend.get(j.id, 0.0),
                         clock=clock, nodes=jr.nodes, to_market=to_market,
                         reclaimed_at=reclaim_times(reclaims.get(j.id, [])))
            if no_daemon and j.state in WAITS_FOR_DAEMON \
                    and all(a.state.is_terminal() for a in atts):
                # Whatever the job last waited for, nothing moves it until a daemon runs.
                d["reason"] = no_daemon
            dl = d["deadline_at_market"]
            if dl is not None and not j.state.is_terminal():
                now = now or provider_now(settings)   # reads the market's clock: only if needed
                d["deadline_headroom_s_market"] = (dl - now).total_seconds()
            else:
                d["deadline_headroom_s_market"] = None
            if events or ref:
                d["events"] = [{"ts_wall": e.ts, "kind": e.kind, "detail": e.detail}
                               for e in history.get(j.id, [])]
            data.append(d)
    return data[0] if ref else data


def budgets_view(settings: Any, *, engine: Any = None, now: datetime | None = None
                 ) -> list[dict[str, Any]]:
    """`spotrun budgets --json`: every project and owner budget with what it has spent this
    period, committed and left (docs/budgets.md); the provider's clock (now: a reading of
    it) picks the period."""
    engine = engine or open_settings_db(settings)
    found = effective(settings, engine)   # spotrun.toml, the database's rows over it
    if not found.budgets.configured():
        return []
    with session(engine) as s:
        standing = read_standing(s, found.budgets.configured(),
                                 now or provider_now(settings), stop_margin_for(settings))
        waiting = Counter(_scope_hits(found.budgets, s.exec(
            select(Job.project, Job.owner).where(Job.state.in_(WAITS_FOR_DAEMON)))))
        stopped = Counter(mark.partition("@")[0] for mark in s.exec(
            select(Job.budget_stop_scope).where(Job.budget_stop_scope.is_not(None))))
    out = []
    for st in standing:
        d = st.to_dict()
        d["queued_jobs"] = waiting.get(st.key, 0)
        d["stopped_jobs"] = stopped.get(st.key, 0)
        d.update(found.origins[st.key].to_dict())
        out.append(d)
    return out


def _scope_hits(budgets: Any, pairs: Any) -> list[str]:
    """The budget keys each (project, owner) pair spends from, flattened."""
    return [scope_key(sc, n) for project, owner in pairs
            for sc, n, _ in budgets.of_job(project, owner)]


def job_summaries(settings: Any, *, engine: Any = None) -> list[dict[str, Any]]:
    """Each job's id, state, reclaims and checkpoint_uri, as `status_view` gives them: what
    /metrics needs of the status, read without the agents' reports (two queries)."""
    engine = engine or open_settings_db(settings)
    with session(engine) as s:
        jobs = list(iter_jobs(s))
        attempts = attempts_by_job(s)
    return [{"id": j.id, "state": j.state.value, "reclaims": reclaims_of(attempts.get(j.id, [])),
             "checkpoint_uri": j.checkpoint_uri} for j in jobs]


def audit_view(settings: Any, refs: list[str] | None = None, *, since: datetime | None = None,
               until: datetime | None = None, hindsight: bool = True,
               reports: Reports | None = None, engine: Any = None,
               jobs: list[Job] | None = None, to_market: ToMarket | None = None) -> list:
    """`spotrun audit`: JobAudit per job (`.to_dict()` is the --json element); jobs: these
    Job rows, already read, instead of refs; to_market as for `status_view`."""
    # The hindsight builder is a module-level hook: set it for this call only, then restore.
    saved = MODEL_FOR_JOB.pop("default", None)
    try:
        if hindsight:
            use_observed_model(settings)
        engine = engine or open_settings_db(settings)
        reports = reports or Reports()
        with session(engine) as s:
            return audit_jobs(s, list(refs or []), since=since, until=until,
                              od_price=od_price_for(settings),
                              reports_of=reports.of_job,
                              to_market=to_market or WallToProvider(settings),
                              time_scale=time_scale(settings), jobs=jobs)
    finally:
        MODEL_FOR_JOB.pop("default", None)
        if saved is not None:
            MODEL_FOR_JOB["default"] = saved


def curve_points(spans: list[tuple[datetime, datetime, float]]) -> list[list[float]]:
    """A cumulative curve as [[unix seconds (provider clock), usd], ...]."""
    xs, ys = cumulative_curve(spans)
    return [[x.timestamp(), y] for x, y in zip(xs, ys)]


def job_page(settings: Any, ref: str, *, reports: Reports | None = None,
             engine: Any = None, audit: Any = None) -> dict[str, Any]:
    """The dashboard's job page: status, audit, spend and baseline curves, log tail."""
    engine = engine or open_settings_db(settings)
    reports = reports or Reports()
    st = status_view(settings, ref, reports=reports, engine=engine)
    ja = audit if audit is not None else audit_view(settings, [st["id"]], reports=reports,
                                                    engine=engine)[0]
    with session(engine) as s:
        job = s.get(Job, st["id"])
    return {
        "status": st, "audit": ja.to_dict(),
        "spend_curve_market": curve_points(ja.spend_spans),
        "baseline_curve_market": curve_points(ja.baseline_spans),
        "reclaims_market": [t.timestamp() for t in ja.reclaims if t is not None],
        "notices_market": [t.timestamp() for t in ja.notices if t is not None],
        "log_tail": reports.log_tail(job),
        "clock": clock_info(settings),
    }
