"""The market `plan` and `submit --dry-run` decide on: one function, so they pick alike.

By default both read the market the daemon will read (a running local market, or its
trace at the start row without starting it; EC2's prices on AWS). `plan --offline` uses
the packaged catalog's prices instead. A market that cannot be read (no cloud
credentials, say) falls back to the catalog's prices, and both verbs say so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spotrun.catalog import Catalog
from spotrun.config import Settings
from spotrun.decide import Placement
from spotrun.decide.market import MarketSnapshot
from spotrun.errors import BadInputError
from spotrun.spec import JobSpec
from spotrun.zones import known_zones
from spotrun.decide.from_settings import decide_for_cli, live_market, offline_market


@dataclass(frozen=True)
class MarketView:
    """The market a CLI decision used, the provider behind it (None: catalog), and why."""

    market: MarketSnapshot
    provider: Any = None
    offline: bool = False            # --offline: catalog prices on purpose
    unreadable: str | None = None    # why the provider's market could not be read

    def prices_text(self) -> str:
        """One line naming the prices the decision used (headers of plan and dry-run)."""
        if self.unreadable is not None:
            return "catalog prices (the provider's market could not be read: see the warning)"
        if self.offline:
            return ("catalog prices (--offline: the packaged snapshot, not the market the "
                    "daemon reads)")
        return self.market.source

    def warnings(self) -> list[str]:
        """What the reader must know about these prices (empty when they are the market's)."""
        if self.unreadable is None:
            return []
        return [f"{self.unreadable}: catalog prices stand in; the daemon reads that market, "
                "so its pick may differ"]

    def annotate(self, placement: dict[str, Any]) -> dict[str, Any]:
        """A placement's JSON with the prices named (`prices.summary`) and their warning."""
        out = dict(placement)
        out["prices"] = {**out["prices"], "summary": self.prices_text()}
        out["warnings"] = self.warnings() + list(out.get("warnings") or [])
        return out


def decide_on_market(spec: JobSpec, settings: Settings, catalog: Catalog,
                     zones: list[str] | None, *, offline: bool = False,
                     ) -> tuple[MarketView, Placement]:
    """The decision on the market the daemon will read (nothing started, nothing written).

    zones: the zones to consider (None: every zone the provider offers). offline: the
    catalog's prices. A job that can never run raises its refusal (exit 2) either way.
    """
    if not offline:
        try:
            market, provider = live_market(settings, catalog, zones)
            # A cloud's prices may be fetched per pool while deciding: decide inside the try.
            placed = decide_for_cli(spec, settings, catalog, market, provider=provider)
            return MarketView(market, provider=provider), placed
        except BadInputError:
            raise
        except Exception as exc:  # noqa: BLE001 - an unreadable market still leaves a plan
            reason = (f"the {settings.provider} market could not be read "
                      f"({type(exc).__name__}: {str(exc)[:160]})")
            view = MarketView(offline_market(settings, catalog, zones or known_zones(settings)),
                              unreadable=reason)
            return view, decide_for_cli(spec, settings, catalog, view.market)
    view = MarketView(offline_market(settings, catalog, zones or known_zones(settings)),
                      offline=True)
    return view, decide_for_cli(spec, settings, catalog, view.market)
