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
    return DaemonContext(engine=engine, settings=settings,
                         provider=provider or make_provider(settings),
                         store=store or open_store(settings.store_url),
                         clock=clock or SystemClock())


# A scheduling pass stops at this share of its interval; the next resumes where it stopped.
PASS_BUDGET_SHARE = 0.8


def build_loops(ctx: DaemonContext, *, bounded: bool = False) -> list[Scheduled]:
    """Every loop of the daemon with its interval (`bounded`, the service's: scheduling passes
    are cut at their time budget and resumed; `daemon --once` and tests do everything)."""
    d = ctx.settings.daemon
    budget_s = PASS_BUDGET_SHARE * d.schedule_interval_s if bounded else None
    loops = [Scheduled(LivenessLoop(ctx), d.liveness_interval_s),
             Scheduled(SchedulerLoop(ctx, pass_budget_s=budget_s), d.schedule_interval_s),
             Scheduled(ReconcileLoop(ctx), d.reconcile_interval_s),
             Scheduled(HeartbeatLoop(ctx), d.heartbeat_interval_s),
             # Multi-node attempts; a refused replacement is tried again every schedule tick.
             Scheduled(NodeLoop(ctx), d.schedule_interval_s),
             Scheduled(OrphanLoop(ctx), d.orphan_interval_s)]
    volume_gb = facts_for(ctx.settings).billed_volume_gb(ctx.settings)
    # Stopping a job takes the wall seconds stops were measured to take (save, stop); on an
    # accelerated market that is `time_scale` times more provider seconds of spend.
    loops.append(Scheduled(SpendLoop(ctx.engine, ctx.provider, volume_gb=volume_gb,
                                     stop_margin=stop_margin_for(ctx.settings)),
                           d.spend_interval_s))
    loops.append(Scheduled(PriceLoop(ctx.engine, ctx.provider), d.price_interval_s))
    loops.append(Scheduled(NotifyLoop(ctx), ctx.settings.notify.interval_s))
    return loops


def build_runner(ctx: DaemonContext, lease: Lease | None = None, *,
                 bounded: bool = False) -> Runner:
    """A runner over every loop (each ticking only while lease is held, when one is given)."""
    loops = build_loops(ctx, bounded=bounded)
    if lease is not None:
        loops = [Scheduled(LeaseGuard(item.loop, lease), item.interval_s) for item in loops]
    return Runner(loops, clock=ctx.clock)
