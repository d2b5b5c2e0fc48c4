"""`spotrun interrupt JOB [--node K] [--notice-s S]`: rehearse a reclaim on purpose.

Sends the provider's own spot interruption, notice first, to the instance(s) a job runs on
now: on the local provider through the market's /admin/interrupt, on AWS through Fault
Injection Service, on GCP through simulateMaintenanceEvent (a Spot VM is preempted: soft-off,
then hard-off 30 s later). The daemon then sees a real reclaim and recovers as from one.
Each line says the reclaim as the provider set it: a pending reclaim is never moved later
(an instance that already has a notice keeps its time, which its job was told), and a
provider's own window (FIS's 2-15 minutes, GCP's 30 s) wins over `--notice-s`.
"""

from __future__ import annotations

from typing import Any

import click

from spotrun.cli.common import echo_json, get_settings, json_option, open_state_db
from spotrun.db import Attempt, attempts_of, find_job, nodes_of, session
from spotrun.errors import BadInputError, NotFoundError
from spotrun.providers import make_provider
from spotrun.providers.base import Interruption
from spotrun.providers.facts import facts_for

DEFAULT_NOTICE_S = 120.0   # for a provider that declares no notice window (provider seconds)


def current_instances(engine: Any, job_ref: str) -> tuple[str, Attempt | None, dict[int, str]]:
    """(job id, its live attempt, node rank -> instance id) of what the job runs on now."""
    # lazy: CLI start-up: daemon code only for this verb
    from spotrun.daemon.nodes import is_multi, members_of
    with session(engine) as s:
        job = find_job(s, job_ref)
        if job is None:
            raise NotFoundError("no such job", field="job", value=job_ref)
        live = [a for a in attempts_of(s, job.id) if not a.state.is_terminal()]
        if not live:
            return job.id, None, {}
        att = live[-1]
        if is_multi(att):
            return job.id, att, {n.node_rank: n.instance_id or ""
                                 for n in members_of(nodes_of(s, att.id))}
        return job.id, att, ({0: att.instance_id} if att.instance_id else {})


@click.command()
@click.argument("job_ref")
@click.option("--node", "node", type=int, default=None,
              help="Interrupt only this node rank (multi-node jobs); default: every node.")
@click.option("--notice-s", "notice_s", type=float, default=None,
              help="Provider-clock seconds from the notice to the reclaim; 0 on the local "
                   "market: reclaimed at once, without a notice [default: the provider's own "
                   "window: 120 on AWS (FIS gives 120-900); GCP's is always 30].")
@json_option
def interrupt(job_ref: str, node: int | None, notice_s: float | None, as_json: bool) -> None:
    """Send a spot interruption (notice, then reclaim) to a job's current instance(s)."""
    if notice_s is not None and notice_s < 0:
        raise BadInputError("allowed: a number of seconds >= 0", field="--notice-s",
                            value=notice_s)
    settings = get_settings()
    facts = facts_for(settings)
    if notice_s is None:
        notice_s = facts.notice_window_s(settings) or DEFAULT_NOTICE_S
    job_id, att, ranks = current_instances(open_state_db(settings, job_ref), job_ref)
    if not ranks:
        raise NotFoundError("the job runs on no instance now", field="job", value=job_id,
                            hint="`spotrun status JOB` shows its state")
    if node is not None:
        if node not in ranks:
            raise BadInputError(f"no such running node; allowed: "
                                f"{', '.join(str(r) for r in sorted(ranks))}", field="--node",
                                value=node)
        ranks = {node: ranks[node]}
    provider = make_provider(settings)
    done = provider.interrupt(list(ranks.values()), notice_s=notice_s)
    by_id = {d.instance_id: d for d in done}
    rows = [(r, i, by_id[i]) for r, i in sorted(ranks.items())]
    if as_json:
        echo_json({"id": job_id, "attempt": att.number if att else None, "notice_s": notice_s,
                   "provider": provider.name,
                   "instances": [_instance_json(r, i, d) for r, i, d in rows]})
        return
    for r, i, d in rows:
        click.echo(f"{job_id} node {r}: {said(i, d, notice_s, facts.clock_name)}")


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


def _instance_json(rank: int, instance_id: str, done: Interruption) -> dict[str, Any]:
    return {"node_rank": rank, "instance_id": instance_id, "reclaim_in_s": done.reclaim_in_s,
            "reclaim_at": done.reclaim_at.isoformat() if done.reclaim_at else None,
            "already_noticed": done.already_noticed, "at_most": done.at_most,
            "note": done.note or None}
