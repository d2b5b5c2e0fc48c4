"""What the local market really offered: its trace, read back from the market's state dir.

The local market replays a trace on its own clock (market.clock); its state
database keeps the options (trace, prices, scale, start tick) and the clock's epoch, so
availability and prices at any provider time can be recomputed after the fact, with
the market stopped. On AWS nothing like this exists: the audit has only its own
observations (spotrun.audit.observed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from spotrun.providers.local.market.book import MarketBook
from spotrun.providers.local.market.clock import (CLOCK_FILE, MarketClock, SystemClock,
                                                 read_clock_file, to_dt)
from spotrun.providers.local.market.options import MarketOptions
from spotrun.providers.local.market.state import DB_FILE, MarketState


@dataclass
class LocalMarketTruth:
    """MarketTruth of a local market, from its book (trace + prices) and clock."""

    book: MarketBook
    clock: MarketClock
    name: str = "local market trace"

    @classmethod
    def from_state_dir(cls, state_dir: Path) -> "LocalMarketTruth | None":
        """Read options and epoch from a market's state dir; None if no market ran there."""
        if not (Path(state_dir) / DB_FILE).exists():
            return None
        state = MarketState(Path(state_dir))
        try:
            raw, epoch = state.get_meta("options"), state.get_meta("epoch_wall_s")
        finally:
            state.close()
        if not raw or epoch is None:
            return None
        options = MarketOptions.from_dict(json.loads(raw))
        book = options.load_book()
        paced = read_clock_file(Path(state_dir) / CLOCK_FILE, SystemClock())
        clock = MarketClock(float(epoch), options.time_scale, options.start_tick,
                            book.trace.tick_s, SystemClock(), paced.segments if paced else [])
        return cls(book=book, clock=clock)

    @classmethod
    def from_settings(cls, settings: Any) -> "LocalMarketTruth | None":
        """The truth of the market a local-provider daemon uses ($SPOTRUN_HOME/market)."""
        return cls.from_state_dir(settings.home_path / "market")

    def zones(self) -> list[str]:
        """The trace's zones."""
        return list(self.book.zones)

    def available(self, zone: str, at: datetime) -> bool:
        """The trace's availability at the position of `at`."""
        return self.book.available(zone, self.clock.position(at.timestamp()))

    def spot_price(self, instance_type: str, zone: str, at: datetime) -> float | None:
        """The market's price at the position of `at`."""
        return self.book.spot_price(instance_type, zone, self.clock.position(at.timestamp()))

    def provider_time(self, wall: datetime) -> datetime:
        """Market time at a wall time (the market's clock as it really ran)."""
        return to_dt(self.clock.market_s(wall.timestamp()))
