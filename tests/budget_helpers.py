"""A daemon's loops against the real local market on a hand-moved clock, for budget tests.

The market runs in-process (its HTTP server on 127.0.0.1, real instance processes) on a
ManualClock at time scale 1, so the provider's clock is the manual wall: a test starts it
just before a UTC midnight and moves it into the next day to see a new budget period.
Every other part is the product's: settings from spotrun.toml, submit, the scheduler,
spend and reconcile loops, on SQLite (or PostgreSQL through SPOTRUN_DB_URL).
"""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlmodel import select

from conftest import kill_leftovers, write_prices, write_trace
from spotrun.config import load_settings
from spotrun.daemon.app import build_context
from spotrun.daemon.reconcile import ReconcileLoop
from spotrun.daemon.scheduler import SchedulerLoop
from spotrun.daemon.spend import SpendLoop
from spotrun.db import Attempt, Event, Job, session
from spotrun.jobs import submit, validate_submission
from spotrun.ledger.stopmargin import stop_margin_for
from spotrun.providers.local.market import server as market_server
from spotrun.providers.local.market.client import MarketClient
from spotrun.providers.local.market.clock import ManualClock
from spotrun.providers.local.market.core import Market
from spotrun.providers.local.market.options import MarketOptions
from spotrun.providers.local.provider import LocalProvider
from spotrun.states import AttemptState

TYPE = "p3.2xlarge"
ZONES = ("za", "zb", "zc")
PRICE = 2.0            # spot USD/h in every zone, all day
# What one launch commits: the stop margin at PRICE. At scale 1 with the default 5 s spend
# check, the market's stated 5 s terminate (and the ~25 s stops measured here: the stand-in
# never saves, so the reconcile loop terminates it after its 20 s grace) stay under the
# floor: 60 billed seconds, the local market's (EC2's) minimum.
MARGIN_S = 60.0
COMMIT_USD = MARGIN_S / 3600.0 * PRICE


class Clock:
    """The daemon's clock on the market's manual wall clock."""

    def __init__(self, wall: ManualClock) -> None:
        self.wall = wall

    def now(self) -> datetime:
        """The manual time as an aware UTC datetime."""
        return datetime.fromtimestamp(self.wall.time(), tz=timezone.utc)

    def time(self) -> float:
        """Manual wall seconds."""
        return self.wall.time()

    def monotonic(self) -> float:
        """Manual seconds (only moved forward)."""
        return self.wall.time()


class BudgetRig:
    """A home whose spotrun.toml holds `extra_toml` (budgets, notify), a market, and loops."""

    def __init__(self, root: Path, instance_command: str, start: datetime, extra_toml: str,
                 price: float = PRICE) -> None:
        root.mkdir(parents=True, exist_ok=True)
        home = root / "home"
        home.mkdir()
        trace = write_trace(root / "trace.csv", {z: [1] * 6 for z in ZONES}, 60.0)
        prices = write_prices(root / "prices.csv",
                              [(z, k, price) for k in range(6) for z in ZONES])
        self.wall = ManualClock(start_s=start.timestamp())
        opts = MarketOptions(trace=str(trace), prices=str(prices), instance_type=TYPE,
                             time_scale=1.0, notice_s=0.0, instance_command=instance_command,
                             grace_s=1.0)
        self.market = Market(root / "market", opts, wall=self.wall)
        self.server = market_server.MarketHTTPServer(self.market, market_server._Flags())
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        (home / "spotrun.toml").write_text(
            f'[local]\ntrace = "{trace}"\nprices = "{prices}"\ntime_scale = 1.0\n'
            f'pacing = "fixed"\n' + extra_toml)
        self.home, self.root = home, root
        self.settings = load_settings(str(home))
        self.ctx = self.context()
        self.scheduler = SchedulerLoop(self.ctx)
        self.spender = SpendLoop(self.ctx.engine, self.ctx.provider, storage_interval_s=1e9,
                                 stop_margin=stop_margin_for(self.settings))
        self.reconciler = ReconcileLoop(self.ctx)

    def context(self) -> Any:
        """A daemon context of its own (its own engine and market client)."""
        provider = LocalProvider(MarketClient(f"http://127.0.0.1:{self.server.port}"),
                                 wall=self.wall)
        return build_context(self.settings, provider=provider, clock=Clock(self.wall))

    def now(self) -> datetime:
        """The manual clock now."""
        return Clock(self.wall).now()

    def submit(self, name: str, *, project: str = "ml", owner: str | None = None,
               policy: str = "{market: spot}", engine: Any = None) -> str:
        """Submit a one-hour job through the product's submit path; its id."""
        spec = self.root / f"{name}.yaml"
        spec.write_text(f"name: {name}\ncommand: 'true'\nproject: {project}\n"
                        f"resources: {{instance_types: [{TYPE}]}}\n"
                        f"work: {{reference_hours: 1.0, reference_instance: {TYPE}}}\n"
                        f"policy: {policy}\n")
        return submit(validate_submission(spec, self.settings, owner=owner),
                      engine or self.ctx.engine).id

    def advance(self, seconds: float) -> None:
        """Move the wall (= provider) clock on, and let the market act on it."""
        self.wall.now_s += seconds
        self.market.step()

    def tick(self) -> None:
        """One scheduler pass, 3 s after the last (past a waiting job's retry delay)."""
        self.advance(3.0)
        self.scheduler.tick(self.now())

    def book(self) -> None:
        """One spend pass."""
        self.spender.tick(self.now())

    def reconcile(self) -> None:
        """One reconcile pass."""
        self.reconciler.tick(self.now())

    def jobs(self) -> dict[str, Job]:
        """Every job by id."""
        with session(self.ctx.engine) as s:
            return {j.id: j for j in s.exec(select(Job))}

    def live_attempts(self) -> list[Attempt]:
        """Attempts not ended."""
        with session(self.ctx.engine) as s:
            return list(s.exec(select(Attempt).where(Attempt.state != AttemptState.ENDED)))

    def events(self, kind: str) -> list[Event]:
        """Events of one kind, in order."""
        with session(self.ctx.engine) as s:
            return list(s.exec(select(Event).where(Event.kind == kind).order_by(Event.id)))

    def close(self) -> None:
        """Stop the market and its instances."""
        self.server.shutdown()
        self.server.server_close()
        self.market.close()
        self.ctx.engine.dispose()
        kill_leftovers(self.root / "market")
