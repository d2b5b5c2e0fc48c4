"""`spotrun audit --by project|owner`: the groups' table, and `--reconcile` summed per group."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from spotrun.audit.groups import GroupAudit
from spotrun.audit.render import cause_rows, cell
from spotrun.cli.tables import Column, print_table

# (key, header, priority): 0 = always shown, higher = dropped first on narrow terminals.
GROUP_COLUMNS = [("group", "group", 0), ("job_count", "jobs", 1), ("actual_usd", "actual $", 0),
                 ("baseline_on_demand_usd", "baseline $", 0), ("saved_usd", "saved $", 2),
                 ("saved_fraction", "saved %", 1), ("reclaims", "reclaims", 2),
                 ("lost_steps", "lost steps", 3)]


def print_groups(console: Console, groups: list[GroupAudit], wide: bool = False) -> None:
    """One row per group and a TOTAL, then each group's causes (as a job's)."""
    if not groups:
        console.print("no jobs to audit", highlight=False)
        return
    by = groups[0].by
    dicts = [g.to_dict() for g in groups]
    total: dict[str, Any] = {"group": "TOTAL"}
    for key, _h, _p in GROUP_COLUMNS[1:]:
        total[key] = sum(d[key] or 0 for d in dicts) if key != "saved_fraction" else None
    base = total["baseline_on_demand_usd"]
    total["saved_fraction"] = total["saved_usd"] / base if base > 0 else None
    rows = [{k: (str(d[k]) if k in ("group", "job_count", "reclaims", "lost_steps")
                 else cell(k, d[k])) for k, _h, _p in GROUP_COLUMNS} for d in dicts + [total]]
    cols = [Column(k, by if k == "group" else h, p, "left" if k == "group" else "right")
            for k, h, p in GROUP_COLUMNS]
    print_table(console, f"spend audit by {by} (USD; baseline = on-demand for the same "
                         "progress)", cols, rows, wide=wide, bold_rows=[len(dicts)])
    ccols = [Column("cause", "cause"), Column("usd", "$", 0, "right"),
             Column("hours", "h", 1, "right"), Column("share", "share", 2, "right")]
    for g in groups:
        assert g.total is not None
        clock = "market" if g.total.time_scale != 1.0 else "provider"
        print_table(console, f"{by} {g.group} ({len(g.jobs)} jobs): where the money went "
                             f"(h = {clock}-clock hours)", ccols, cause_rows(g.total)[:-1],
                    wide=wide)


def group_reconcile(lines: list[Any], jobs: list[Any], by: str) -> list[dict[str, Any]]:
    """Ledger vs Cost Explorer summed per project or owner (the value the jobs' instances
    are tagged with: `spotrun:project`, `spotrun:owner`). A job Cost Explorer could not
    check is named with its reason, and left out of both sides of the difference."""
    of = {j.id: getattr(j, by) for j in jobs}
    out: dict[str, dict[str, Any]] = {}
    for ln in lines:
        name = of.get(ln.id, "")
        g = out.setdefault(name, {"by": by, "group": name, "jobs": [], "ledger_usd": 0.0,
                                  "checked_ledger_usd": 0.0, "cost_explorer_usd": None,
                                  "difference_usd": None, "estimated": False,
                                  "could_not_check": {}})
        g["jobs"].append(ln.id)
        g["ledger_usd"] += ln.ledger_usd
        if ln.cost_explorer_usd is None:
            g["could_not_check"][ln.id] = ln.could_not_check
            continue
        g["checked_ledger_usd"] += ln.ledger_usd
        g["cost_explorer_usd"] = (g["cost_explorer_usd"] or 0.0) + ln.cost_explorer_usd
        g["difference_usd"] = g["cost_explorer_usd"] - g["checked_ledger_usd"]
        g["estimated"] = g["estimated"] or ln.estimated
    return [out[k] for k in sorted(out)]


def print_reconcile_groups(console: Console, groups: list[dict[str, Any]]) -> None:
    """The grouped reconcile as a table."""
    from rich.table import Table
    by = groups[0]["by"] if groups else "group"
    t = Table(title=f"ledger vs Cost Explorer by {by} (USD, tagged instances and volumes)")
    for header in (by, "jobs", "ledger $", "Cost Explorer $", "difference $", "note"):
        t.add_column(header, justify="left" if header in (by, "note") else "right")
    for g in groups:
        n = len(g["could_not_check"])
        note = (f"{n} job(s) not checked" if n else "") + (" estimated" if g["estimated"] else "")
        t.add_row(g["group"], str(len(g["jobs"])), cell("actual_usd", g["ledger_usd"]),
                  cell("actual_usd", g["cost_explorer_usd"]),
                  cell("actual_usd", g["difference_usd"]), note.strip())
    console.print(t)
