"""Multi-node attempts: N nodes launched together, the membership file, one node's replacement.

An attempt of a job with `resources.nodes > 1` (or an elastic "MIN-MAX") owns its instances
as AttemptNode rows, one per node rank, a replacement being a new row for the same rank;
`Attempt.instance_id` stays None. The daemon is the one writer of the membership the agents
read, `layout.nodes_key` (MULTINODE.md):

    {"version", "nnodes", "nnodes_min", "rdzv_id", "rdzv_endpoint", "rdzv_host_rank",
     "nodes": [{"rank", "instance_id", "host"}]}

A node is listed from its launch until it is lost; when the lost node hosted the rendezvous,
the same write moves the rendezvous to the lowest surviving rank on a new endpoint. The loop
that follows the nodes is spotrun.daemon.nodeloop; this module holds what the scheduler and
the other loops call.
"""

from __future__ import annotations

import json
import socket
from datetime import datetime
from typing import Any

from spotrun import layout
from spotrun.agent.contract import AttemptPlan, launch_request
from spotrun.daemon.context import DaemonContext
from spotrun.db import Attempt, AttemptNode, Job, add_event, nodes_of, session
from spotrun.errors import StoreError
from spotrun.providers.base import InstanceInfo, Pool
from spotrun.states import EndReason, NodeState, move_node
from spotrun.providers.facts import facts_for

LIVE_NODE = (NodeState.LAUNCHING, NodeState.RUNNING)


def is_multi(att: Attempt) -> bool:
    """True for an attempt whose instances are AttemptNode rows."""
    return (att.nodes or 1) > 1 or att.nodes_min is not None


def min_nodes(att: Attempt) -> int:
    """The fewest nodes the attempt keeps running on (all of them unless elastic)."""
    return att.nodes_min or att.nodes


def node_token(attempt_token: str, rank: int) -> str:
    """The intent token of a node of the first group launch (`<attempt token>-<k>`)."""
    return f"{attempt_token}-{rank}"


def replacement_token(attempt_token: str, rank: int, try_number: int) -> str:
    """A replacement's own client token: a new one per try (a refused try's token is spent)."""
    return f"{attempt_token}-r{rank}-{try_number}"


def add_group_intents(s: Any, att: Attempt) -> list[AttemptNode]:
    """One LAUNCHING row per rank of a new attempt (caller commits, before the launch)."""
    rows = [AttemptNode(attempt_id=att.id, job_id=att.job_id, node_rank=k,
                        client_token=node_token(att.client_token, k), market=att.market,
                        instance_type=att.instance_type, zone=att.zone,
                        price_usd_per_hour=att.price_usd_per_hour)
            for k in range(att.nodes)]
    for r in rows:
        s.add(r)
    return rows


def group_pending(s: Any, att: Attempt) -> bool:
    """True while the attempt's first group launch has not recorded its instances."""
    return not any(n.instance_id for n in nodes_of(s, att.id))


def live_nodes(nodes: list[AttemptNode]) -> list[AttemptNode]:
    """Nodes whose instance may still run (launching, running or being terminated)."""
    return [n for n in nodes if not n.state.is_terminal()]


def record_launched(s: Any, node: AttemptNode, info: InstanceInfo) -> None:
    """Copy a launched instance onto its node row (caller commits)."""
    node.instance_id = info.instance_id
    node.instance_type, node.zone, node.market = info.instance_type, info.zone, info.market
    if info.price_usd_per_hour is not None:
        node.price_usd_per_hour = info.price_usd_per_hour
    node.launched_at = info.launched_at
    node.private_ip = info.private_ip
    if info.client_token and info.client_token != node.client_token:
        node.client_token = info.client_token   # the provider's own token for this instance
    s.add(node)


def launch_group(ctx: DaemonContext, job: Job, att: Attempt,
                 pools: list[Pool]) -> list[InstanceInfo]:
    """Launch the attempt's first group (all nodes in one pool) and record it; CapacityError
    and ProviderError reach the caller (the scheduler), which treats them as for one node."""
    with session(ctx.engine) as s:
        pending = [n for n in nodes_of(s, att.id) if n.instance_id is None]
    req = launch_request(ctx.settings, AttemptPlan.of(job, att, ctx.plan_store_uri), pools,
                         client_token=att.client_token, ranks=[n.node_rank for n in pending])
    infos = ctx.provider.launch_group(ctx.provider.plan_launch(req))
    with session(ctx.engine) as s:
        a = s.get(Attempt, att.id)
        for node, info in zip(pending, infos):
            record_launched(s, s.get(AttemptNode, node.id), info)
        first = infos[0]
        a.instance_type, a.zone, a.market = first.instance_type, first.zone, first.market
        if first.price_usd_per_hour is not None:
            a.price_usd_per_hour = first.price_usd_per_hour
        a.started_at = min(i.launched_at for i in infos)
        s.add(a)
        add_event(s, job.id, "launched", f"attempt {a.number}: {len(infos)} nodes "
                  f"{', '.join(i.instance_id for i in infos)} {first.instance_type} {first.zone} "
                  f"{first.market.value} ${a.price_usd_per_hour:.3f}/h each", attempt_id=a.id)
        s.commit()
    sync_membership(ctx, job, att.id)
    return infos


# ---------------------------------------------------------------- membership

def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the local rendezvous; a new one per host change)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def members_of(nodes: list[AttemptNode]) -> list[AttemptNode]:
    """The nodes nodes.json lists: launched and neither lost nor being terminated, by rank."""
    out = {}
    for n in nodes:
        if n.instance_id and n.state in LIVE_NODE:
            out[n.node_rank] = n
    return [out[k] for k in sorted(out)]


def _endpoint(ctx: DaemonContext, host: AttemptNode) -> str:
    port = facts_for(ctx.settings).rdzv_port or free_port()
    return f"{host.private_ip or '127.0.0.1'}:{port}"


def sync_membership(ctx: DaemonContext, job: Job, attempt_id: int) -> bool:
    """Rewrite nodes.json when the listed nodes changed; True when it wrote a new version."""
    with session(ctx.engine) as s:
        a = s.get(Attempt, attempt_id)
        if a.state.is_terminal():
            return False
        members = members_of(nodes_of(s, a.id))
        pairs = [[n.node_rank, n.instance_id] for n in members]
        old = json.loads(a.nodes_members) if a.nodes_members else []
        old_host = dict((r, i) for r, i in old).get(a.rdzv_host_rank) \
            if a.rdzv_host_rank is not None else None
        host_rank, endpoint = a.rdzv_host_rank, a.rdzv_endpoint
        if members and (old_host is None or [host_rank, old_host] not in pairs):
            # The host was lost (or none yet): the lowest surviving rank hosts, on a new port.
            host_rank = members[0].node_rank
            endpoint = _endpoint(ctx, members[0])
        if pairs == old and host_rank == a.rdzv_host_rank:
            return False
        version = a.nodes_version + 1
        doc = {"version": version, "nnodes": a.nodes, "nnodes_min": min_nodes(a),
               "rdzv_id": job.id, "rdzv_endpoint": endpoint, "rdzv_host_rank": host_rank,
               "nodes": [{"rank": n.node_rank, "instance_id": n.instance_id,
                          "host": n.private_ip or "127.0.0.1"} for n in members]}
        try:
            ctx.job_store(job).put_bytes(layout.nodes_key(job.id, a.number),
                                                   json.dumps(doc).encode())
        except StoreError as exc:
            ctx.log.warning("nodes_write_failed", job=job.id, attempt=a.number, error=str(exc))
            return False   # unchanged in the database: the next tick writes it again
        moved = host_rank != a.rdzv_host_rank and a.rdzv_host_rank is not None
        a.nodes_version, a.nodes_members = version, json.dumps(pairs)
        a.rdzv_host_rank, a.rdzv_endpoint = host_rank, endpoint
        s.add(a)
        add_event(s, job.id, "nodes", f"attempt {a.number} v{version}: "
                  f"{len(members)}/{a.nodes} nodes "
                  f"({', '.join(f'{r}={i}' for r, i in pairs) or 'none'}); rendezvous "
                  f"{'moved to ' if moved else ''}rank {host_rank} at {endpoint}",
                  attempt_id=a.id)
        s.commit()
    return True


# ---------------------------------------------------------------- terminating

def terminate_nodes(ctx: DaemonContext, att: Attempt, reason: EndReason, detail: str,
                    *, ranks: set[int] | None = None) -> list[str]:
    """Terminate an attempt's live nodes (or those of `ranks`); a node intent that never got an
    instance ends at once. Returns the instance ids asked to terminate."""
    asked: list[str] = []
    with session(ctx.engine) as s:
        for n in nodes_of(s, att.id):
            if n.state.is_terminal() or (ranks is not None and n.node_rank not in ranks):
                continue
            if n.instance_id is None:
                move_node(n, NodeState.ENDED)
                n.end_reason, n.detail = reason, detail
            else:
                ctx.provider.terminate(n.instance_id)
                asked.append(n.instance_id)
                if n.state is not NodeState.TERMINATING:
                    move_node(n, NodeState.TERMINATING)
                    n.end_reason, n.detail = reason, detail
            s.add(n)
        s.commit()
    return asked


def latest_per_rank(nodes: list[AttemptNode]) -> dict[int, AttemptNode]:
    """The newest row of each rank (a replacement supersedes the node it replaces)."""
    out: dict[int, AttemptNode] = {}
    for n in sorted(nodes, key=lambda n: (n.node_rank, n.id or 0)):
        out[n.node_rank] = n
    return out


def node_view(n: AttemptNode) -> dict[str, Any]:
    """One node in `status --json` (times on the provider clock)."""
    def iso(t: datetime | None) -> str | None:
        return t.isoformat() if t else None
    return {"node_rank": n.node_rank, "instance_id": n.instance_id, "zone": n.zone,
            "state": n.state.value, "launched_at": iso(n.launched_at),
            "ended_at": iso(n.ended_at),
            "end_reason": n.end_reason.value if n.end_reason else None}
