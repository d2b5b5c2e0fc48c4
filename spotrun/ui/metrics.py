"""`/metrics`: Prometheus text exposition (format 0.0.4) of jobs, spend, savings, reclaims.

Read from the same views as the CLI (`status_view`, `audit_view` without the hindsight
model, which is too slow for a scrape). Spend is on the ledger (USD); checkpoint age is
wall-clock seconds since the newest complete checkpoint of each running job was written.
The daemon's own loops (tick durations, lag) come from the record the daemon writes
(spotrun.daemon.health.live_loop_health).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Callable

from spotrun.audit.reclaims import PARTS, ResumeStats, quantile
from spotrun.states import JobState

ACTIVE = {"queued", "starting", "running", "recovering", "cancelling"}


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Out:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]

    def sample(self, name: str, value: float, **labels: str) -> None:
        lab = ",".join(f'{k}="{_esc(str(v))}"' for k, v in labels.items())
        self.lines.append(f"{name}{{{lab}}} {value!r}" if lab else f"{name} {value!r}")


def checkpoint_age_s(store: Any, now: datetime | None = None) -> float | None:
    """Wall seconds since the newest complete checkpoint in store was written (None: none)."""
    from spotrun.checkpoints import latest_verified
    try:
        m = latest_verified(store, deep=False)
    except Exception:   # an unreachable store: no figure rather than a failed scrape
        return None
    if m is None:
        return None
    created = datetime.fromisoformat(m.created.replace("Z", "+00:00"))
    return ((now or datetime.now(timezone.utc)) - created).total_seconds()


def render_metrics(status: list[dict], audits: list[dict],
                   store_for: Callable[[str], Any] | None = None, *,
                   loops: dict[str, dict] | None = None) -> str:
    """The exposition text from the status and audit JSON views (and the daemon's loops)."""
    out = _Out()
    out.family("spotrun_jobs", "gauge", "Jobs by state.")
    by_state = {s.value: 0 for s in JobState}
    for j in status:
        by_state[j["state"]] = by_state.get(j["state"], 0) + 1
    for state, n in sorted(by_state.items()):
        out.sample("spotrun_jobs", n, state=state)
    audit_by_id = {a["id"]: a for a in audits}
    out.family("spotrun_job_spend_usd", "gauge", "Ledger spend of a job (USD).")
    for a in audits:
        out.sample("spotrun_job_spend_usd", a["actual_usd"], job=a["id"])
    out.family("spotrun_job_baseline_on_demand_usd", "gauge",
               "On-demand cost of the same progress (USD).")
    for a in audits:
        out.sample("spotrun_job_baseline_on_demand_usd", a["baseline_on_demand_usd"], job=a["id"])
    out.family("spotrun_job_saved_usd", "gauge", "Baseline minus spend (USD).")
    for a in audits:
        out.sample("spotrun_job_saved_usd", a["saved_usd"], job=a["id"])
    out.family("spotrun_spend_usd", "gauge", "Ledger spend of all jobs (USD).")
    out.sample("spotrun_spend_usd", sum(a["actual_usd"] for a in audits))
    out.family("spotrun_saved_usd", "gauge", "Saving against on-demand over all jobs (USD).")
    out.sample("spotrun_saved_usd", sum(a["saved_usd"] for a in audits))
    out.family("spotrun_job_reclaims", "gauge", "Spot reclaims of a job so far.")
    for j in status:
        out.sample("spotrun_job_reclaims", j["reclaims"], job=j["id"])
    out.family("spotrun_reclaims", "gauge", "Spot reclaims over all jobs.")
    out.sample("spotrun_reclaims", sum(j["reclaims"] for j in status))
    out.family("spotrun_job_checkpoint_age_wall_seconds", "gauge",
               "Wall seconds since the newest complete checkpoint of a running job.")
    if store_for is not None:
        for j in status:
            if j["state"] in ACTIVE and j["id"] in audit_by_id:
                age = checkpoint_age_s(store_for(j["checkpoint_uri"]))
                if age is not None:
                    out.sample("spotrun_job_checkpoint_age_wall_seconds", age, job=j["id"])
    _resume_family(out, audits)
    _loop_families(out, loops or {})
    return "\n".join(out.lines) + "\n"


def _resume_family(out: _Out, audits: list[dict]) -> None:
    """spotrun_time_to_resume_seconds: p50 and p95 of each part over every reclaim."""
    stats = ResumeStats()
    for a in audits:
        for ttr in a.get("time_to_resume") or []:
            stats.add(ttr)
    name = "spotrun_time_to_resume_seconds"
    out.family(name, "summary", "Provider-clock seconds from a spot reclaim to the next "
               "attempt's first new step, by part (detection, waiting, launch, boot, restore, "
               "first_step, total), over every reclaim of every job.")
    for part in PARTS + ("total_s",):
        xs = stats.samples.get(part, [])
        if not xs:
            continue
        label = part.removesuffix("_s")
        for q in (0.5, 0.95):
            out.sample(name, float(quantile(xs, q) or 0.0), part=label, quantile=repr(q))
        out.sample(f"{name}_sum", float(sum(xs)), part=label)
        out.sample(f"{name}_count", len(xs), part=label)


def _loop_families(out: _Out, loops: dict[str, dict]) -> None:
    """spotrun_daemon_loop_seconds (histogram) and spotrun_daemon_loop_lag_seconds by loop."""
    name = "spotrun_daemon_loop_seconds"
    out.family(name, "histogram", "Duration of the daemon's loop ticks since it started (s).")
    for loop, f in sorted(loops.items()):
        h = f["histogram"]
        for le, n in zip([*h["le"], None], h["cumulative"]):
            out.sample(f"{name}_bucket", n, loop=loop,
                       le="+Inf" if le is None else repr(float(le)))
        out.sample(f"{name}_sum", float(h["sum_s"]), loop=loop)
        out.sample(f"{name}_count", h["count"], loop=loop)
    out.family("spotrun_daemon_loop_lag_seconds", "gauge",
               "How late the loop's last tick started against its slot (s).")
    for loop, f in sorted(loops.items()):
        if f.get("lag_s") is not None:
            out.sample("spotrun_daemon_loop_lag_seconds", float(f["lag_s"]), loop=loop)
