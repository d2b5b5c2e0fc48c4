"""`spotrun audit --by project|owner`: the per-job audit figures summed per group.

Nothing is computed anew: each group is the sum of its jobs' `JobAudit` figures (spend by
line, the on-demand baseline, every cause in $ and hours, free reclaims, waste), so a
group's causes still sum to its actual spend, and the groups sum to the per-job TOTAL.
Hindsight figures are per job only (a sum of optima is not an optimum).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from spotrun.audit.compute import JobAudit, WasteLine

BY = ("project", "owner")
_SUMMED = ("spot_usd", "on_demand_usd", "volume_usd", "storage_usd", "egress_usd", "other_usd",
           "actual_usd", "baseline_on_demand_usd", "saved_usd", "preemptions", "kept_steps", "lost_steps",
           "lost_steps_unknown", "ledger_rows")


@dataclass
class GroupAudit:
    """One project's or owner's jobs, their figures summed (`total` is a JobAudit whose id
    is the group's name, so the audit's table helpers render it as they render a job)."""

    by: str
    group: str
    jobs: list[str] = field(default_factory=list)
    total: JobAudit | None = None

    def to_dict(self) -> dict[str, Any]:
        """The `spotrun audit --by ... --json` element (docs/audit.md)."""
        t = self.total
        assert t is not None
        d = t.to_dict()
        out: dict[str, Any] = {"by": self.by, "group": self.group, "jobs": list(self.jobs),
                               "job_count": len(self.jobs)}
        for k in _SUMMED + ("baseline_reference_usd", "saved_fraction", "causes",
                            "causes_total_usd", "not_charged", "waste", "hours_clock",
                            "time_scale"):
            out[k] = d[k]
        out["reclaims"] = d["preemptions"]
        return out


def _add(line: WasteLine, other: WasteLine) -> None:
    line.add(other.hours, other.usd)


def group_audits(audits: list[JobAudit], by: str) -> list[GroupAudit]:
    """The jobs' audits summed per project or owner, groups by name."""
    if by not in BY:
        raise ValueError(f"group by one of {BY}, not {by!r}")
    groups: dict[str, GroupAudit] = {}
    for a in audits:
        name = getattr(a, by)
        g = groups.get(name)
        if g is None:
            g = groups[name] = GroupAudit(by, name, total=JobAudit(
                id=name, name=name, state="", project=a.project if by == "project" else "",
                owner=a.owner if by == "owner" else "", time_scale=a.time_scale))
        t = g.total
        assert t is not None
        g.jobs.append(a.id)
        for k in _SUMMED:
            setattr(t, k, getattr(t, k) + getattr(a, k))
        if a.baseline_reference_usd is not None:
            t.baseline_reference_usd = (t.baseline_reference_usd or 0.0) + \
                a.baseline_reference_usd
        for src, dst in ((a.causes, t.causes), (a.waste, t.waste)):
            for cause, line in src.items():
                _add(dst.setdefault(cause, WasteLine(None, None)), line)
        _add(t.not_charged, a.not_charged)
    for g in groups.values():
        t = g.total
        assert t is not None
        t.saved_fraction = t.saved_usd / t.baseline_on_demand_usd \
            if t.baseline_on_demand_usd > 0 else None
    return [groups[k] for k in sorted(groups)]
