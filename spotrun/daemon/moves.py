"""A job's checkpoint follows it between clouds (several clouds, docs/clouds.md).

Each cloud has its store; a job's files live under the same keys in each (its prefix below
the store's root). Before an attempt starts in another cloud than the one its resume
checkpoint is in, the daemon copies that checkpoint (manifest last, every file checked against
its SHA256; resumable: what already arrived is not sent again) and the job's code bundle into
the attempt's cloud, books the bytes as the source cloud's egress in the ledger, and records
the copy (`CheckpointMove`: the measured throughput the next decisions use).
"""

from __future__ import annotations

from time import monotonic

from sqlmodel import select

from spotrun.agent.contract import rehome
from spotrun.checkpoints import resume_point
from spotrun.checkpoints.transfer import copy_checkpoint
from spotrun.costmodel.egress import EgressRate, Throughput, egress_rate
from spotrun.daemon.context import DaemonContext
from spotrun.db import Attempt, CheckpointMove, Job, SpendEntry, add_event, session
from spotrun.decide.clouds import NOWHERE, CheckpointAt
from spotrun.errors import ObjectNotFound, StoreError
from spotrun.providers.billing_rules import SpendKind
from spotrun.providers.facts import catalog_for
from spotrun.store.base import ObjectStore

# Throughput is measured over the last copies (older ones say less about the link today).
RECENT_MOVES = 20


def uri_in_cloud(ctx: DaemonContext, job: Job, uri: str) -> str:
    """A job's URI (under its store) in the store of ctx's cloud (one cloud: as is)."""
    return rehome(uri, job.store_uri, ctx.store.uri) if ctx.several else uri



def resume_cloud(ctx: DaemonContext, attempts: list[Attempt]) -> str | None:
    """The cloud whose store holds the job's resume checkpoint: that of its last attempt that
    ran (None before any did)."""
    ran = [a for a in attempts if a.running_at is not None]
    if not ran:
        return None
    return ran[-1].cloud or ctx.home_cloud or ctx.cloud


def rates(ctx: DaemonContext) -> dict[str, EgressRate]:
    """Each cloud's published egress rate (its catalog's `egress` section), by cloud."""
    return {c: egress_rate(c, catalog_for(p.settings)) for c, p in ctx.peers.items()}


def throughput(ctx: DaemonContext) -> Throughput:
    """The copy throughput measured over the recent moves (the prior before any)."""
    with session(ctx.engine) as s:
        rows = list(s.exec(select(CheckpointMove).order_by(CheckpointMove.id.desc())
                           .limit(RECENT_MOVES)))
    return Throughput.measured([(r.nbytes, r.seconds) for r in rows])


def resume_location(ctx: DaemonContext, job: Job, attempts: list[Attempt]) -> CheckpointAt:
    """Where the job's resume checkpoint is, its size, and what moving it out costs."""
    cloud = resume_cloud(ctx, attempts)
    if cloud is None:
        return NOWHERE
    peer = ctx.for_cloud(cloud)
    try:
        m = resume_point(peer.store_for(uri_in_cloud(peer, job, job.checkpoint_uri)))
    except StoreError as exc:
        ctx.log.warning("checkpoint_size_unknown", job=job.id, cloud=cloud, error=str(exc))
        return NOWHERE
    if m is None:
        return NOWHERE
    nbytes = sum(int(f.get("size", 0)) for f in m.files.values())
    return CheckpointAt(cloud=cloud, nbytes=nbytes, rates=rates(ctx),
                        throughput=throughput(ctx))


def follow(ctx: DaemonContext, job: Job, attempt: Attempt, attempts: list[Attempt]) -> None:
    """Before the attempt launches in its cloud: copy there the job's code bundle (from the
    job's own store) and its resume checkpoint (from the cloud that holds it), book each
    source cloud's egress, record the move. Nothing when both are in that cloud already, or
    when this attempt's move is recorded (a retried launch); a copy cut short is resumed by
    the next call (what arrived is not sent again)."""
    dst_cloud = attempt.cloud or ctx.home_cloud or ctx.cloud
    with session(ctx.engine) as s:
        if s.exec(select(CheckpointMove).where(CheckpointMove.attempt_id == attempt.id)).first():
            return
    dst = ctx.for_cloud(dst_cloud)
    sent: dict[str, tuple[int, float]] = {}   # source cloud -> (bytes, seconds)
    what: list[str] = []
    job_cloud = _cloud_of_job(ctx, job)
    if job.bundle_key and job_cloud != dst_cloud:
        n, secs = _copy_bundle(ctx.store_for(job.store_uri), dst.store, job.bundle_key)
        if n:
            sent[job_cloud] = (n, secs)
            what.append("the code bundle")
    name = None
    src_cloud = resume_cloud(ctx, [a for a in attempts if a.id != attempt.id])
    if src_cloud is not None and src_cloud != dst_cloud:
        src = ctx.for_cloud(src_cloud)
        src_ckpt = src.store_for(uri_in_cloud(src, job, job.checkpoint_uri))
        dst_ckpt = dst.store_for(uri_in_cloud(dst, job, job.checkpoint_uri))
        m = resume_point(src_ckpt)
        # A pinned checkpoint store is the same for both clouds: nothing moves.
        if m is not None and src_ckpt.uri.rstrip("/") != dst_ckpt.uri.rstrip("/"):
            report = copy_checkpoint(src_ckpt, dst_ckpt, m.name)
            n, secs = sent.get(src_cloud, (0, 0.0))
            sent[src_cloud] = (n + report.bytes_copied, secs + report.seconds)
            name = m.name
            what.insert(0, m.name)
    if not sent:
        return
    _record(ctx, job, attempt, dst_cloud, sent, name, " and ".join(what))


def _record(ctx: DaemonContext, job: Job, attempt: Attempt, dst_cloud: str,
            sent: dict[str, tuple[int, float]], name: str | None, what: str) -> None:
    """The move's egress rows (one per source cloud), its record and its event, together."""
    by_cloud = rates(ctx)
    now = ctx.provider.now()
    nbytes = sum(n for n, _ in sent.values())
    seconds = sum(t for _, t in sent.values())
    usd = sum(by_cloud[c].usd(n) for c, (n, _) in sent.items())
    with session(ctx.engine) as s:
        s.add(CheckpointMove(job_id=job.id, attempt_id=attempt.id, checkpoint=name or "",
                             src_cloud=",".join(sent), dst_cloud=dst_cloud, nbytes=nbytes,
                             seconds=seconds, usd=usd))
        for cloud, (n, _) in sent.items():
            rate = by_cloud[cloud]
            s.add(SpendEntry(job_id=job.id, attempt_id=attempt.id,
                             kind=SpendKind.EGRESS.value, start=now, end=now,
                             billed_seconds=0.0, price_usd_per_hour=0.0, usd=rate.usd(n),
                             price_source=f"egress {rate.source}",
                             note=f"{n} bytes {cloud} -> {dst_cloud} ({what}) at "
                                  f"${rate.usd_per_gb}/GB"))
        add_event(s, job.id, "checkpoint_moved",
                  f"{what}: {nbytes / 1e6:.1f} MB {'+'.join(sent)} -> {dst_cloud} in "
                  f"{seconds:.1f} s, egress ${usd:.4f}", attempt_id=attempt.id)
        s.commit()
    ctx.log.info("checkpoint_moved", job=job.id, attempt=attempt.number, src=list(sent),
                 dst=dst_cloud, bytes=nbytes, seconds=round(seconds, 2), usd=round(usd, 4))


def _cloud_of_job(ctx: DaemonContext, job: Job) -> str:
    """The cloud whose store is the job's own (where submit put its bundle)."""
    root = job.store_uri.rstrip("/")
    return next((c for c, p in ctx.peers.items() if p.store.uri.rstrip("/") == root),
                ctx.home_cloud or ctx.cloud)


def _copy_bundle(src: ObjectStore, dst: ObjectStore, key: str) -> tuple[int, float]:
    """The code bundle into the other cloud's store (once): (bytes sent, seconds)."""
    if dst.exists(key):
        return 0, 0.0
    started = monotonic()
    try:
        data = src.get_bytes(key)
    except ObjectNotFound:
        return 0, 0.0
    dst.put_bytes(key, data)
    return len(data), monotonic() - started
