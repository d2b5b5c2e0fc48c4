"""Assemble a daemon: context, loops and runner."""

from __future__ import annotations

import logging
import sys
from typing import Any

from spotrun.config import Settings
from spotrun.daemon.context import Clock, DaemonContext, SystemClock
from spotrun.daemon.dbturns import take_turns
from spotrun.daemon.heartbeats import HeartbeatLoop, LivenessLoop
from spotrun.daemon.lease import Lease, LeaseGuard
from spotrun.daemon.nodeloop import NodeLoop
from spotrun.daemon.notify import NotifyLoop
from spotrun.daemon.orphans import OrphanLoop
from spotrun.daemon.reconcile import ReconcileLoop
from spotrun.daemon.runner import Runner, Scheduled
from spotrun.daemon.price_loop import PriceLoop
from spotrun.daemon.spend import SpendLoop
from spotrun.daemon.scheduler import SchedulerLoop
from spotrun.db import open_settings_db
from spotrun.ledger.stopmargin import stop_margin_for
from spotrun.providers import make_provider
from spotrun.providers.base import Provider
from spotrun.store import open_store
from spotrun.store.base import ObjectStore
from spotrun import logsetup
from spotrun.providers.facts import facts_for
from spotrun.clouds import cloud_settings




def configure_logging(level: int = logging.INFO, stream: Any = None) -> None:
    """The daemon's log: JSON lines on stderr (journald picks them up), stdlib records too."""
    logsetup.configure_logging(json=True, level=level, stream=stream or sys.stderr)


def build_context(settings: Settings, *, provider: Provider | None = None,
                  store: ObjectStore | None = None, clock: Clock | None = None) -> DaemonContext:
    """The daemon's shared handles from settings (anything passed in wins).

    The loops run on threads of their own: their transactions on this engine take turns
    (spotrun.daemon.dbturns), waiting at most the database busy timeout.
    """
    engine = open_settings_db(settings)
    take_turns(engine, settings.db_busy_timeout_s)
    clock = clock or SystemClock()
    if len(settings.clouds) == 1:
        ctx = DaemonContext(engine=engine, settings=settings,
                            provider=provider or make_provider(settings),
                            store=store or open_store(settings.store_url), clock=clock)
        ctx.peers = {ctx.cloud: ctx}
        return ctx
    # Several clouds: a context per cloud on its own settings view (its provider, its store),
    # the engine and clock shared; the home cloud's is the daemon's (docs/clouds.md).
    peers: dict[str, DaemonContext] = {}
    for cloud in settings.clouds:
        view = cloud_settings(settings, cloud)
        peers[cloud] = DaemonContext(engine=engine, settings=view, provider=make_provider(view),
                                     store=open_store(view.store_url), clock=clock,
                                     home_cloud=settings.clouds[0], peers=peers)
    return peers[settings.clouds[0]]


# A scheduling pass stops at this share of its interval; the next resumes where it stopped.
PASS_BUDGET_SHARE = 0.8


class OfCloud:
    """One cloud's instance of a per-cloud loop, named for its cloud (several clouds)."""

    def __init__(self, loop: Any, cloud: str) -> None:
        self.loop = loop
        self.name = f"{loop.name}:{cloud}"

    def tick(self, now: Any) -> Any:
        """The cloud's loop's tick."""
        return self.loop.tick(now)


def build_loops(ctx: DaemonContext, *, bounded: bool = False) -> list[Scheduled]:
    """Every loop of the daemon with its interval (`bounded`, the service's: scheduling passes
    are cut at their time budget and resumed; `daemon --once` and tests do everything).

    One scheduler decides over every cloud; the loops that talk to a provider or its store
    run once per cloud, each on that cloud's attempts (named `loop:cloud` beyond the first).
    """
    d = ctx.settings.daemon
    budget_s = PASS_BUDGET_SHARE * d.schedule_interval_s if bounded else None
    loops: list[Scheduled] = []
    for cloud, peer in (ctx.peers or {ctx.cloud: ctx}).items():
        mine = [Scheduled(loop if peer is ctx else OfCloud(loop, cloud), interval_s)
                for loop, interval_s in _cloud_loops(peer, home=peer is ctx)]
        if peer is ctx:   # the liveness proof first, then the one scheduler
            mine.insert(1, Scheduled(SchedulerLoop(ctx, pass_budget_s=budget_s),
                                     d.schedule_interval_s))
        loops += mine
    loops.append(Scheduled(NotifyLoop(ctx), ctx.settings.notify.interval_s))
    return loops


def _cloud_loops(ctx: DaemonContext, *, home: bool) -> list[tuple[Any, float]]:
    """The loops that act on one cloud's instances and store, with their intervals."""
    d = ctx.settings.daemon
    volume_gb = facts_for(ctx.settings).billed_volume_gb(ctx.settings)
    return [(LivenessLoop(ctx), d.liveness_interval_s),
            (ReconcileLoop(ctx), d.reconcile_interval_s),
            (HeartbeatLoop(ctx), d.heartbeat_interval_s),
            # Multi-node attempts; a refused replacement is tried again every schedule tick.
            (NodeLoop(ctx), d.schedule_interval_s),
            (OrphanLoop(ctx), d.orphan_interval_s),
            # Stopping a job takes the wall seconds stops were measured to take (save, stop);
            # on an accelerated market that is `time_scale` times more provider seconds.
            (SpendLoop(ctx.engine, ctx.provider, volume_gb=volume_gb,
                       stop_margin=stop_margin_for(ctx.settings), owns=ctx.owns(),
                       books_storage=home), d.spend_interval_s),
            (PriceLoop(ctx.engine, ctx.provider, owns=ctx.owns()), d.price_interval_s)]


def build_runner(ctx: DaemonContext, lease: Lease | None = None, *,
                 bounded: bool = False) -> Runner:
    """A runner over every loop (each ticking only while lease is held, when one is given)."""
    loops = build_loops(ctx, bounded=bounded)
    if lease is not None:
        loops = [Scheduled(LeaseGuard(item.loop, lease), item.interval_s) for item in loops]
    return Runner(loops, clock=ctx.clock)
