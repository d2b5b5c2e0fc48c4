"""`/metrics`: Prometheus text exposition (format 0.0.4) of jobs, spend, savings, reclaims.

Each scrape builds its metric families from the views and renders them with prometheus_client
(a registry of its own per scrape, generate_latest), so names, escaping and number formats are
the library's.

Read from the same views as the CLI (`status_view`, `audit_view` without the hindsight
model, which is too slow for a scrape). Spend is on the ledger (USD); checkpoint age is
wall-clock seconds since the newest complete checkpoint of each running job was written.
The daemon's own loops (tick durations, lag) come from the record the daemon writes
(spotrun.daemon.health.live_loop_health).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Callable, Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric

from spotrun.audit.reclaims import PARTS, ResumeStats, quantile
from spotrun.checkpoints import latest_verified
from spotrun.states import JobState

ACTIVE = {"queued", "starting", "running", "recovering", "cancelling"}


class _Scrape:
    """A collector of the families built for one scrape (the figures are read per request)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        """The families, as prometheus_client's registry asks for them."""
        return iter(self.families)


def checkpoint_age_s(store: Any, now: datetime | None = None) -> float | None:
    """Wall seconds since the newest complete checkpoint in store was written (None: none)."""
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
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Scrape([*_job_families(status, audits, store_for),
                               _resume_family(audits), *_loop_families(loops or {})]))
    return generate_latest(registry).decode()


def _gauge(name: str, help_text: str, labels: tuple[str, ...] = (),
           samples: Iterable[tuple[tuple[str, ...], float]] = ()) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, help_text, labels=list(labels))
    for values, v in samples:
        g.add_metric(list(values), float(v))
    return g


def _job_families(status: list[dict], audits: list[dict],
                  store_for: Callable[[str], Any] | None) -> list[Metric]:
    """Jobs by state, spend, baseline and saving, reclaims, checkpoint age."""
    by_state = {s.value: 0 for s in JobState}
    for j in status:
        by_state[j["state"]] = by_state.get(j["state"], 0) + 1
    audit_by_id = {a["id"]: a for a in audits}
    ages = []
    if store_for is not None:
        for j in status:
            if j["state"] in ACTIVE and j["id"] in audit_by_id:
                age = checkpoint_age_s(store_for(j["checkpoint_uri"]))
                if age is not None:
                    ages.append(((j["id"],), age))

    def per_job(key: str) -> list[tuple[tuple[str, ...], float]]:
        return [((a["id"],), a[key]) for a in audits]
    return [
        _gauge("spotrun_jobs", "Jobs by state.", ("state",),
               [((state,), n) for state, n in sorted(by_state.items())]),
        _gauge("spotrun_job_spend_usd", "Ledger spend of a job (USD).", ("job",),
               per_job("actual_usd")),
        _gauge("spotrun_job_baseline_on_demand_usd", "On-demand cost of the same progress (USD).",
               ("job",), per_job("baseline_on_demand_usd")),
        _gauge("spotrun_job_saved_usd", "Baseline minus spend (USD).", ("job",),
               per_job("saved_usd")),
        _gauge("spotrun_spend_usd", "Ledger spend of all jobs (USD).",
               samples=[((), sum(a["actual_usd"] for a in audits))]),
        _gauge("spotrun_saved_usd", "Saving against on-demand over all jobs (USD).",
               samples=[((), sum(a["saved_usd"] for a in audits))]),
        _gauge("spotrun_job_reclaims", "Spot reclaims of a job so far.", ("job",),
               [((j["id"],), j["reclaims"]) for j in status]),
        _gauge("spotrun_reclaims", "Spot reclaims over all jobs.",
               samples=[((), sum(j["reclaims"] for j in status))]),
        _gauge("spotrun_job_checkpoint_age_wall_seconds",
               "Wall seconds since the newest complete checkpoint of a running job.", ("job",),
               ages)]


def _resume_family(audits: list[dict]) -> Metric:
    """spotrun_time_to_resume_seconds: p50 and p95 of each part over every reclaim."""
    stats = ResumeStats()
    for a in audits:
        for ttr in a.get("time_to_resume") or []:
            stats.add(ttr)
    name = "spotrun_time_to_resume_seconds"
    # A summary with quantiles: prometheus_client's SummaryMetricFamily carries only _sum and
    # _count, so the family is a plain Metric of type summary with its samples added.
    family = Metric(name, "Provider-clock seconds from a spot reclaim to the next attempt's "
                    "first new step, by part (detection, waiting, launch, boot, restore, "
                    "first_step, total), over every reclaim of every job.", "summary")
    for part in PARTS + ("total_s",):
        xs = stats.samples.get(part, [])
        if not xs:
            continue
        label = part.removesuffix("_s")
        for q in (0.5, 0.95):
            family.add_sample(name, {"part": label, "quantile": repr(q)},
                              float(quantile(xs, q) or 0.0))
        family.add_sample(f"{name}_sum", {"part": label}, float(sum(xs)))
        family.add_sample(f"{name}_count", {"part": label}, float(len(xs)))
    return family


def _loop_families(loops: dict[str, dict]) -> list[Metric]:
    """spotrun_daemon_loop_seconds (histogram) and spotrun_daemon_loop_lag_seconds by loop."""
    seconds = HistogramMetricFamily("spotrun_daemon_loop_seconds",
                                    "Duration of the daemon's loop ticks since it started (s).",
                                    labels=["loop"])
    for loop, f in sorted(loops.items()):
        h = f["histogram"]
        bounds = [repr(float(le)) for le in h["le"]] + ["+Inf"]
        seconds.add_metric([loop], list(zip(bounds, h["cumulative"])), float(h["sum_s"]))
    lag = _gauge("spotrun_daemon_loop_lag_seconds",
                 "How late the loop's last tick started against its slot (s).", ("loop",),
                 [((loop,), f["lag_s"]) for loop, f in sorted(loops.items())
                  if f.get("lag_s") is not None])
    return [seconds, lag]
