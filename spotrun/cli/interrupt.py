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

import click

from spotrun.cli.common import backend, echo_json, json_option
from spotrun.interrupts import check_notice_s, said


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
    check_notice_s(notice_s)
    done = backend().interrupt(job_ref, node=node, notice_s=notice_s)
    if as_json:
        echo_json(done.to_dict())
        return
    for rank, d in done.nodes:
        click.echo(f"{done.job_id} node {rank}: {said(d.instance_id, d, done.notice_s, done.clock)}")
