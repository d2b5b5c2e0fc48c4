"""Flat audit figures shared by the table, --csv and the totals (one source of columns)."""

from __future__ import annotations

import csv
import io
from typing import Any

from spotrun.audit.compute import WASTE_CAUSES, JobAudit

# (key, table header); every key is also a CSV column, and a key of the --json objects
# (waste_* keys map to json["waste"][cause]["usd" | "hours"]).
TABLE_COLUMNS: list[tuple[str, str]] = [
    ("id", "job"), ("state", "state"), ("spot_usd", "spot $"), ("on_demand_usd", "on-demand $"),
    ("volume_usd", "volume $"), ("storage_usd", "storage $"), ("actual_usd", "actual $"),
    ("baseline_on_demand_usd", "baseline $"), ("saved_usd", "saved $"),
    ("saved_fraction", "saved %"), ("preemptions", "preempt."),
    ("waste_lost_work_usd", "lost work $"), ("waste_restart_overhead_usd", "restart $"),
    ("waste_waiting_for_capacity_hours", "wait h"), ("waste_checkpoint_stall_usd", "stall $"),
    ("hindsight_optimal_usd", "optimal $"), ("hindsight_regret_usd", "regret $"),
]
CSV_COLUMNS: list[str] = (
    [k for k, _ in TABLE_COLUMNS[:8]]
    + ["baseline_reference_usd", "reference_instance", "saved_usd", "saved_fraction",
       "preemptions", "kept_steps", "ledger_rows", "hindsight_regret_usd",
       "hindsight_optimal_usd"]
    + [f"waste_{c}_{u}" for c in WASTE_CAUSES for u in ("hours", "usd")])
_SUMMED = ["spot_usd", "on_demand_usd", "volume_usd", "storage_usd", "actual_usd",
           "baseline_on_demand_usd", "baseline_reference_usd", "saved_usd", "preemptions",
           "kept_steps", "ledger_rows", "hindsight_optimal_usd",
           "hindsight_regret_usd"] + [f"waste_{c}_{u}" for c in WASTE_CAUSES
                                           for u in ("hours", "usd")]


def flat(job: JobAudit) -> dict[str, Any]:
    """One job's figures as a flat mapping."""
    d = job.to_dict()
    row = {k: d.get(k) for k in CSV_COLUMNS if k in d}
    for cause in WASTE_CAUSES:
        w = d["waste"].get(cause, {"hours": None, "usd": None})
        row[f"waste_{cause}_hours"] = w["hours"]
        row[f"waste_{cause}_usd"] = w["usd"]
    return row


def totals(jobs: list[JobAudit]) -> dict[str, Any]:
    """Sums over jobs (the saved fraction of the sums, not a mean of fractions)."""
    rows = [flat(j) for j in jobs]
    out: dict[str, Any] = {"id": "TOTAL", "state": ""}
    for k in _SUMMED:
        vals = [r[k] for r in rows if r.get(k) is not None]
        out[k] = sum(vals) if vals else None
    base = out["baseline_on_demand_usd"] or 0.0
    out["saved_fraction"] = out["saved_usd"] / base if base > 0 else None
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
        return f"{v:.2f}"
    if isinstance(v, float):
        if 0 < abs(v) < 0.001:
            return f"{v:.6f}"   # storage lines are often fractions of a cent
        return f"{v:,.2f}" if abs(v) >= 10 else f"{v:.4f}"
    return str(v)
