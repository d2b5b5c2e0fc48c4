"""What `spotrun interrupt` did, as the CLI prints it, locally or from the team server's JSON
(the act itself: spotrun.jobs.interrupt_job). Light: a laptop's CLI imports it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from spotrun.errors import BadInputError
from spotrun.providers.base import Interruption

DEFAULT_NOTICE_S = 120.0   # for a provider that declares no notice window (provider seconds)


@dataclass(frozen=True)
class Interrupted:
    """What one `spotrun interrupt` did: per node rank, the provider's answer."""

    job_id: str
    attempt: int | None
    notice_s: float
    provider: str
    clock: str                                   # whose clock reclaim_at is on
    nodes: list[tuple[int, Interruption]]

    def to_dict(self) -> dict[str, Any]:
        """`interrupt --json`'s object."""
        return {"id": self.job_id, "attempt": self.attempt, "notice_s": self.notice_s,
                "provider": self.provider, "clock": self.clock,
                "instances": [{"node_rank": r, "instance_id": d.instance_id,
                               "reclaim_in_s": d.reclaim_in_s,
                               "reclaim_at": d.reclaim_at.isoformat() if d.reclaim_at else None,
                               "already_noticed": d.already_noticed, "at_most": d.at_most,
                               "note": d.note or None} for r, d in self.nodes]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Interrupted":
        """Back from `to_dict` (the server's answer)."""
        nodes = [(int(i["node_rank"]), Interruption(
            instance_id=i["instance_id"], reclaim_in_s=float(i["reclaim_in_s"]),
            reclaim_at=datetime.fromisoformat(i["reclaim_at"]) if i.get("reclaim_at") else None,
            already_noticed=bool(i.get("already_noticed")), at_most=bool(i.get("at_most")),
            note=i.get("note") or "")) for i in data.get("instances", [])]
        return cls(job_id=data["id"], attempt=data.get("attempt"),
                   notice_s=float(data["notice_s"]), provider=str(data.get("provider", "")),
                   clock=str(data.get("clock", "")), nodes=nodes)


def check_notice_s(notice_s: float | None) -> None:
    """Refuse a negative notice (exit 2) before anything is looked up."""
    if notice_s is not None and notice_s < 0:
        raise BadInputError("allowed: a number of seconds >= 0", field="--notice-s",
                            value=notice_s)


def said(instance_id: str, done: Interruption, asked_s: float, clock: str) -> str:
    """What the interrupt did to one instance, in one line: its reclaim as it really stands."""
    in_s = f"in {round(done.reclaim_in_s, 1):g} s"
    sooner = done.reclaim_in_s + 0.5 < asked_s
    if done.already_noticed:
        verb = "stays" if sooner else "moves sooner"
        where = (f"{'at' if sooner else 'to'} {done.reclaim_at:%Y-%m-%d %H:%M:%S} "
                 f"({clock} clock, {in_s})" if done.reclaim_at is not None else f"({in_s})")
        return f"{instance_id} already has a notice; reclaim {verb} {where}"
    if done.reclaim_in_s == 0 and not done.at_most:
        return f"{instance_id} reclaimed at once, without a notice"
    when = f"within {done.reclaim_in_s:g} s" if done.at_most else in_s
    if sooner and not done.at_most:
        when += f": one was already due sooner than the {asked_s:g} s asked"
    return f"interruption sent to {instance_id} (reclaim {when}" \
        + (f"; {done.note})" if done.note else ")")
