"""JSON from the team server back into what the CLI's renderers take (datetimes, JobAudit).

The server sends exactly what `--json` prints locally; times travel as ISO-8601 text. The
tables format datetimes, so the remote CLI turns them back, and `spotrun audit`'s tables
read JobAudit objects, rebuilt here from their `to_dict()`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from spotrun.audit.compute import AttemptAudit, JobAudit, WasteLine

# Keys whose values are times in the views (`*_market`, `*_wall`, the trail's `at`, ...).
_TIME_SUFFIXES = ("_market", "_wall", "_at")


def _is_time_key(key: str) -> bool:
    return key.endswith(_TIME_SUFFIXES) or key in ("at", "ts")


def revive_times(data: Any) -> Any:
    """data with every ISO-8601 string under a time key parsed to an aware datetime."""
    if isinstance(data, list):
        return [revive_times(v) for v in data]
    if not isinstance(data, dict):
        return data
    out = {}
    for k, v in data.items():
        if isinstance(v, str) and _is_time_key(k):
            try:
                v = datetime.fromisoformat(v)
            except ValueError:
                pass
        elif isinstance(v, (dict, list)):
            v = revive_times(v)
        out[k] = v
    return out


def _lines(d: dict[str, Any]) -> dict[str, WasteLine]:
    return {k: WasteLine(hours=w["hours"], usd=w["usd"]) for k, w in d.items()}


def attempt_audit(d: dict[str, Any]) -> AttemptAudit:
    """An AttemptAudit from its `to_dict()`."""
    d = revive_times(d)
    fields = {k: v for k, v in d.items() if k not in (
        "started_at_market", "ended_at_market", "trained_until_market", "causes")}
    return AttemptAudit(started_at=d["started_at_market"], ended_at=d["ended_at_market"],
                        trained_until=d.get("trained_until_market"),
                        causes=_lines(d.get("causes") or {}), **fields)


def job_audit(d: dict[str, Any]) -> JobAudit:
    """A JobAudit from its `to_dict()` (the plot's spans are not sent: `--plot` is local)."""
    skip = {"causes", "waste", "not_charged", "attempts", "reclaims", "causes_total_usd",
            "hindsight_note", "hours_clock"}
    fields = {k: v for k, v in d.items() if k not in skip}
    nc = d.get("not_charged") or {}
    return JobAudit(causes=_lines(d.get("causes") or {}), waste=_lines(d.get("waste") or {}),
                    not_charged=WasteLine(hours=nc.get("hours"), usd=nc.get("usd")),
                    attempts=[attempt_audit(a) for a in d.get("attempts") or []], **fields)
