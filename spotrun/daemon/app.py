"""Assemble a daemon: context, loops and runner."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

from spotrun.config import Settings
from spotrun.daemon.context import Clock, DaemonContext, SystemClock
from spotrun.daemon.heartbeats import HeartbeatLoop, LivenessLoop
from spotrun.daemon.lease import Lease, LeaseGuard
from spotrun.daemon.notify import NotifyLoop
from spotrun.daemon.orphans import OrphanLoop
from spotrun.daemon.reconcile import ReconcileLoop
from spotrun.daemon.runner import Runner, Scheduled
from spotrun.daemon.prices import PriceLoop
from spotrun.daemon.spend import SpendLoop
from spotrun.daemon.scheduler import SchedulerLoop
from spotrun.db import open_db
from spotrun.providers import make_provider
from spotrun.providers.base import Provider
from spotrun.store import open_store
from spotrun.store.base import ObjectStore


STOP_WALL_S = 3.0   # wall seconds from a budget stop request to the instance gone


def configure_logging(level: int = logging.INFO, stream: Any = None) -> None:
    """structlog JSON lines on stdout (journald picks them up)."""
    structlog.configure(
        processors=[structlog.processors.add_log_level,
                    structlog.processors.TimeStamper(fmt="iso", utc=True),
                    structlog.processors.format_exc_info,
                    structlog.processors.JSONRenderer()],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=stream or sys.stdout),
        cache_logger_on_first_use=False)


def build_context(settings: Settings, *, provider: Provider | None = None,
                  store: ObjectStore | None = None, clock: Clock | None = None) -> DaemonContext:
    """The daemon's shared handles from settings (anything passed in wins)."""
    engine = open_db(settings.database_url)
    return DaemonContext(engine=engine, settings=settings,
                         provider=provider or make_provider(settings),
                         store=store or open_store(settings.store_url),
                         clock=clock or SystemClock())


def build_loops(ctx: DaemonContext) -> list[Scheduled]:
    """Every loop of the daemon with its interval."""
    d = ctx.settings.daemon
    loops = [Scheduled(LivenessLoop(ctx), d.liveness_interval_s),
             Scheduled(SchedulerLoop(ctx), d.schedule_interval_s),
             Scheduled(ReconcileLoop(ctx), d.reconcile_interval_s),
             Scheduled(HeartbeatLoop(ctx), d.heartbeat_interval_s),
             Scheduled(OrphanLoop(ctx), d.orphan_interval_s)]
    volume_gb = ctx.settings.aws.volume_size_gb if ctx.provider.name == "aws" else 0.0
    # Stopping a job takes a few wall seconds (save, stop, notice); on the local market
    # that is `time_scale` times more provider seconds of spend to leave room for.
    scale = ctx.settings.local.time_scale if ctx.provider.name == "local" else 1.0
    loops.append(Scheduled(SpendLoop(ctx.engine, ctx.provider, volume_gb=volume_gb,
                                     stop_margin_s=max(900.0, STOP_WALL_S * scale)),
                           d.spend_interval_s))
    loops.append(Scheduled(PriceLoop(ctx.engine, ctx.provider), d.price_interval_s))
    loops.append(Scheduled(NotifyLoop(ctx), ctx.settings.notify.interval_s))
    return loops


def build_runner(ctx: DaemonContext, lease: Lease | None = None) -> Runner:
    """A runner over every loop (each ticking only while lease is held, when one is given)."""
    loops = build_loops(ctx)
    if lease is not None:
        loops = [Scheduled(LeaseGuard(item.loop, lease), item.interval_s) for item in loops]
    return Runner(loops, clock=ctx.clock)
