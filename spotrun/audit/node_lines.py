"""The audit of a multi-node attempt: per-node lines and the `node_replacement` cause.

A multi-node attempt pays for every node it runs; its instance spend is split in
node-seconds. `node_replacement` is what the surviving nodes were paid from a node's loss
until its replacement runs (its first heartbeat), or until they stopped if none came.
"""

from __future__ import annotations

from datetime import datetime

from spotrun.db import AttemptNode
from spotrun.ledger.intervals import seconds_between


def _span(n: AttemptNode, end: datetime | None) -> tuple[datetime, datetime] | None:
    stop = n.ended_at or end
    if n.launched_at is None or stop is None or stop <= n.launched_at:
        return None
    return n.launched_at, stop


def node_seconds(nodes: list[AttemptNode], end: datetime | None) -> float:
    """Paid node-seconds of an attempt: every node's launch to its end (or `end`)."""
    spans = [_span(n, end) for n in nodes]
    return sum(seconds_between(a, b) for a, b in (s for s in spans if s))


def replacement_seconds(nodes: list[AttemptNode], end: datetime | None) -> float:
    """Survivors' node-seconds between each lost node's end and its replacement running."""
    by_id = {n.id: n for n in nodes}
    total = 0.0
    for r in nodes:
        lost = by_id.get(r.replaces) if r.replaces is not None else None
        if lost is None or lost.ended_at is None:
            continue
        until = r.running_at or (r.ended_at if r.instance_id is None else None) or end
        if until is None or until <= lost.ended_at:
            continue
        for n in nodes:
            span = _span(n, end)
            if n.id in (r.id, lost.id) or span is None:
                continue
            a, b = max(span[0], lost.ended_at), min(span[1], until)
            if b > a:
                total += seconds_between(a, b)
    return total


def node_lines(nodes: list[AttemptNode], usd_by_instance: dict[str, float],
               end: datetime | None) -> list[dict]:
    """One audit line per node instance: rank, instance, zone, times, reason, seconds, USD."""
    out = []
    for n in nodes:
        if n.instance_id is None:
            continue
        span = _span(n, end)
        out.append({"node_rank": n.node_rank, "instance_id": n.instance_id, "zone": n.zone,
                    "launched_at_market": n.launched_at, "ended_at_market": n.ended_at,
                    "end_reason": n.end_reason.value if n.end_reason else None,
                    "used_s": seconds_between(*span) if span else 0.0,
                    "usd": usd_by_instance.get(n.instance_id, 0.0)})
    return out
