"""Flat audit figures shared by the table, --csv and the totals (one source of columns)."""

from __future__ import annotations

import csv
import io
from typing import Any

from spotrun.audit.compute import CAUSES, WASTE_CAUSES, JobAudit

# (key, table header, priority: 0 = always shown, higher = dropped first on narrow
# terminals); every key is also a CSV column and a key of the --json objects.
TABLE_COLUMNS: list[tuple[str, str, int]] = [
    ("id", "job", 0), ("state", "state", 3), ("actual_usd", "actual $", 0),
    ("baseline_on_demand_usd", "baseline $", 0), ("saved_usd", "saved $", 2),
    ("saved_fraction", "saved %", 1), ("preemptions", "reclaims", 2),
    ("lost_steps", "lost steps", 3), ("not_charged_usd", "not charged $", 4),
    ("spot_usd", "spot $", 5), ("on_demand_usd", "on-demand paid $", 5),
    ("hindsight_optimal_usd", "hindsight opt. $", 6), ("hindsight_regret_usd", "regret $", 6),
]
CAUSE_LABELS = {
    "productive": "productive (steps kept)",
    "lost_work": "lost work (steps run again)",
    "startup": "startup (first boot, restore)",
    "restart_overhead": "restart overhead (boot, restore)",
    "paid_idle": "paid idle (no step made)",
    "checkpoint_stall": "checkpoint stall",
    "waiting_for_capacity": "waiting for capacity (unpaid)",
    "node_replacement": "node replacement",
    "storage": "storage (checkpoints, logs)",
    "volumes": "volumes",
    "egress": "egress (checkpoints moved between clouds)",
    "other": "other",
}
CSV_COLUMNS: list[str] = (
    ["id", "state", "spot_usd", "on_demand_usd", "volume_usd", "storage_usd", "egress_usd",
     "other_usd",
     "actual_usd", "baseline_on_demand_usd", "baseline_reference_usd", "reference_instance",
     "saved_usd", "saved_fraction", "preemptions", "kept_steps", "lost_steps",
     "lost_steps_unknown", "ledger_rows",
     "not_charged_usd", "not_charged_hours", "hindsight_optimal_usd", "hindsight_regret_usd",
     "causes_total_usd", "hours_clock"]
    + [f"cause_{c}_{u}" for c in CAUSES for u in ("usd", "hours")]
    + [f"waste_{c}_{u}" for c in WASTE_CAUSES for u in ("hours", "usd")])
_NOT_SUMMED = {"id", "state", "saved_fraction", "reference_instance", "hours_clock"}


def flat(job: JobAudit) -> dict[str, Any]:
    """One job's figures as a flat mapping."""
    d = job.to_dict()
    row = {k: d.get(k) for k in CSV_COLUMNS if k in d}
    row["not_charged_usd"] = d["not_charged"]["usd"]
    row["not_charged_hours"] = d["not_charged"]["hours"]
    for cause in CAUSES:
        w = d["causes"].get(cause, {"hours": None, "usd": None})
        row[f"cause_{cause}_usd"], row[f"cause_{cause}_hours"] = w["usd"], w["hours"]
    for cause in WASTE_CAUSES:
        w = d["waste"].get(cause, {"hours": None, "usd": None})
        row[f"waste_{cause}_hours"] = w["hours"]
        row[f"waste_{cause}_usd"] = w["usd"]
    return row


def totals(jobs: list[JobAudit]) -> dict[str, Any]:
    """Sums over jobs (the saved fraction of the sums, not a mean of fractions)."""
    rows = [flat(j) for j in jobs]
    out: dict[str, Any] = {"id": "TOTAL", "state": ""}
    for k in CSV_COLUMNS:
        if k in _NOT_SUMMED:
            continue
        vals = [r[k] for r in rows if isinstance(r.get(k), (int, float))]
        out[k] = sum(vals) if vals else None
    base = out["baseline_on_demand_usd"] or 0.0
    out["saved_fraction"] = out["saved_usd"] / base if base > 0 else None
    clocks = {r.get("hours_clock") for r in rows}
    out["hours_clock"] = clocks.pop() if len(clocks) == 1 else ""
    return out


def to_csv(jobs: list[JobAudit]) -> str:
    """CSV text: a header, one row per job, then the TOTAL row."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for row in [flat(j) for j in jobs] + [totals(jobs)]:
        w.writerow({k: _csv_cell(row.get(k)) for k in CSV_COLUMNS})
    return buf.getvalue()


def _csv_cell(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(round(v, 10))
    return v


def cell(key: str, v: Any) -> str:
    """A table cell for a figure."""
    if v is None:
        return "-"
    if key == "saved_fraction":
        return f"{v * 100:.1f}%"
    if key.endswith("_hours"):
        return f"{v:.3f}"
    if isinstance(v, float):
        if 0 < abs(v) < 0.001:
            return f"{v:.6f}"   # storage lines are often fractions of a cent
        return f"{v:,.2f}" if abs(v) >= 10 else f"{v:.4f}"
    return str(v)


def cause_rows(job: JobAudit) -> list[dict[str, str]]:
    """The causes table of one job: every cause in $ and h, the total, then what is not in it."""
    total = job.actual_usd
    rows = []
    for cause in CAUSES:
        w = job.causes.get(cause)
        if w is None:
            continue
        share = (w.usd or 0.0) / total if total > 0 else None
        rows.append({"cause": CAUSE_LABELS.get(cause, cause), "usd": cell("usd", w.usd or 0.0),
                     "hours": cell("x_hours", w.hours),
                     "share": "-" if share is None else f"{share * 100:.1f}%"})
    rows.append({"cause": "= actual (sum of the causes)",
                 "usd": cell("usd", job.causes_total_usd()),
                 "hours": "", "share": "100.0%" if total > 0 else "-"})
    rows.append({"cause": "not charged: free reclaims (first hour)",
                 "usd": f"({cell('usd', job.not_charged.usd or 0.0)})",
                 "hours": cell("x_hours", job.not_charged.hours), "share": ""})
    rows.append({"cause": "hindsight optimum (what-if, not spent)",
                 "usd": f"({cell('usd', job.hindsight_optimal_usd)})", "hours": "", "share": ""})
    return rows


# The reclaims table: (key, header, priority); the parts in the order they happen.
RECLAIM_COLUMNS: list[tuple[str, str, int]] = [
    ("reclaim", "reclaimed -> resumed", 0), ("lost_steps", "lost steps", 0),
    ("total_s", "to resume", 0), ("detection_s", "detection", 2), ("waiting_s", "waiting", 3),
    ("launch_s", "launch", 2), ("boot_s", "boot", 1), ("restore_s", "restore", 1),
    ("first_step_s", "first step", 1)]


def seconds_cell(v: float | None) -> str:
    """A duration cell in seconds (`?`: not known)."""
    return "?" if v is None else f"{v:,.1f}"


def reclaim_rows(job: JobAudit) -> list[dict[str, str]]:
    """One row per reclaim: the steps the next attempt computed again and the time it took
    to train again, by part (provider-clock seconds; `?` unknown)."""
    resumed = {(a.time_to_resume or {}).get("from_attempt"): a for a in job.attempts
               if a.time_to_resume}
    rows = []
    for a in job.attempts:
        if a.end_reason != "reclaimed":
            continue
        nxt = resumed.get(a.number)
        ttr = (nxt.time_to_resume if nxt is not None else None) or {}
        row = {"reclaim": f"{a.number} -> {nxt.number if nxt is not None else '-'}",
               "lost_steps": "?" if a.lost_steps is None else str(a.lost_steps)}
        for key, _h, _p in RECLAIM_COLUMNS[2:]:
            row[key] = seconds_cell(ttr.get(key)) if nxt is not None else "-"
        rows.append(row)
    return rows


def notice_lines(job: JobAudit) -> list[str]:
    """What each attempt's interruption notice achieved, as its agent wrote it."""
    return [f"attempt {a.number} notice: {a.notice_outcome}" for a in job.attempts
            if a.notice_outcome]
