"""`spotrun interrupt JOB [--node K]`: rehearse a reclaim on purpose.

Sends the provider's own spot interruption, notice first, to the instance(s) a job runs on
now: on the local provider through the market's /admin/interrupt, on AWS through Fault
Injection Service, on GCP through simulateMaintenanceEvent (a Spot VM is preempted: soft-off,
then hard-off 30 s later). The daemon then sees a real reclaim and recovers as from one.
"""

from __future__ import annotations

from typing import Any

import click

from spotrun.cli.common import echo_json, get_settings, json_option, open_state_db
from spotrun.db import Attempt, attempts_of, find_job, nodes_of, session
from spotrun.errors import BadInputError, NotFoundError, SpotrunError

DEFAULT_NOTICE_S = 120.0   # for a provider that declares no notice window (provider seconds)


def current_instances(engine: Any, job_ref: str) -> tuple[str, Attempt | None, dict[int, str]]:
    """(job id, its live attempt, node rank -> instance id) of what the job runs on now."""
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
              help="Provider-clock seconds from the notice to the reclaim [default: the "
                   "provider's own window: 120 on AWS; GCP's is always 30].")
@json_option
def interrupt(job_ref: str, node: int | None, notice_s: float | None, as_json: bool) -> None:
    """Send a spot interruption (notice, then reclaim) to a job's current instance(s)."""
    if notice_s is not None and notice_s < 0:
        raise BadInputError("allowed: a number of seconds >= 0", field="--notice-s",
                            value=notice_s)
    settings = get_settings()
    if notice_s is None:
        from spotrun.providers.facts import facts_for
        notice_s = facts_for(settings).notice_window_s(settings) or DEFAULT_NOTICE_S
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
    from spotrun.providers import make_provider
    provider = make_provider(settings)
    try:
        provider.interrupt(list(ranks.values()), notice_s=notice_s)
    except NotImplementedError:
        raise SpotrunError(f"the {provider.name} provider cannot send interruptions yet",
                           field="provider", value=provider.name) from None
    out = {"id": job_id, "attempt": att.number if att else None, "notice_s": notice_s,
           "provider": provider.name,
           "instances": [{"node_rank": r, "instance_id": i} for r, i in sorted(ranks.items())]}
    if as_json:
        echo_json(out)
        return
    for r, i in sorted(ranks.items()):
        click.echo(f"{job_id} node {r}: interruption sent to {i} (reclaim in {notice_s:g} s)")
