"""`plan` and `submit --dry-run` over several clouds: each cloud decided on its own market as a
one-cloud daemon of it would, then one order (spotrun.decide.clouds.merge)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from spotrun.clouds import catalogs_of, cloud_settings, job_clouds
from spotrun.config import Settings
from spotrun.costmodel.egress import egress_rate
from spotrun.decide import Placement, hours_left
from spotrun.decide.clouds import NOWHERE, CheckpointAt, merge, spec_in_cloud
from spotrun.errors import BadInputError, SpotrunError
from spotrun.planning.market_view import MarketView, decide_on_market
from spotrun.providers.facts import catalog_for
from spotrun.spec import JobSpec
from spotrun.zones import known_zones


@dataclass(frozen=True)
class CloudsView(MarketView):
    """The markets a decision over several clouds used: each cloud's view, by cloud."""

    views: tuple[tuple[str, MarketView], ...] = ()

    def prices_text(self) -> str:
        """Each cloud's prices line, by cloud."""
        return "; ".join(f"{c}: {v.prices_text()}" for c, v in self.views)

    def warnings(self) -> list[str]:
        """Each cloud's price warnings, named by cloud."""
        return [f"{c}: {w}" for c, v in self.views for w in v.warnings()]


def checkpoint_at(settings: Settings, cloud: str | None, nbytes: int) -> CheckpointAt:
    """A resume checkpoint of nbytes in `cloud` (None: none), with every cloud's egress rate."""
    if cloud is None or nbytes <= 0:
        return NOWHERE
    cats = catalogs_of(settings)
    return CheckpointAt(cloud=cloud, nbytes=nbytes,
                        rates={c: egress_rate(c, cat) for c, cat in cats.items()})


def decide_across(spec: JobSpec, settings: Settings, zones: list[str] | None, *,
                  offline: bool = False, at: CheckpointAt = NOWHERE
                  ) -> tuple[MarketView, Placement]:
    """The decision over every cloud the job may use (one cloud: exactly decide_on_market's).

    A cloud that can never run the job is left out with its reason; when none can, the first
    cloud's refusal is raised (exit 2).
    """
    clouds = job_clouds(settings, spec.resources.clouds)
    if len(settings.clouds) == 1:
        view, placed = decide_on_market(spec, settings, catalog_for(settings), zones,
                                        offline=offline)
        return view, merge({clouds[0]: placed}, at, _left(spec))
    cats = catalogs_of(settings)
    views: list[tuple[str, MarketView]] = []
    placed: dict[str, Placement] = {}
    left_out: dict[str, str] = {}
    units: dict[str, float] = {}
    refusals: list[SpotrunError] = []
    for cloud in clouds:
        view_settings = cloud_settings(settings, cloud)
        own_zones = known_zones(view_settings)
        cut, why = spec_in_cloud(spec, cats[cloud], own_zones, cats)
        if cut is None:
            left_out[cloud] = why
            continue
        wanted = [z for z in zones if z in own_zones] if zones else None
        if zones and not wanted:
            left_out[cloud] = "none of the zones asked for is one of its zones"
            continue
        try:
            view, one = decide_on_market(cut.spec, view_settings, cats[cloud], wanted,
                                         offline=offline)
        except BadInputError:
            raise
        except SpotrunError as exc:   # this cloud can never run it: the others may
            refusals.append(exc)
            left_out[cloud] = str(exc)
            continue
        views.append((cloud, view))
        placed[cloud], units[cloud] = one, cut.unit
    if not placed:
        if refusals:
            raise refusals[0]
        raise SpotrunError("no configured cloud can run the job: "
                           + "; ".join(f"{c}: {w}" for c, w in left_out.items()),
                           field="resources.clouds", value=list(clouds))
    merged = merge(placed, at, _left(spec), left_out, units)
    first = merged.first
    provider: Any = None
    if first is not None:
        provider = dict(views)[first.cloud].provider
    return CloudsView(merged.market, provider=provider, offline=offline,
                      views=tuple(views)), merged


def _left(spec: JobSpec) -> float | None:
    return hours_left(spec.policy.deadline, datetime.now(timezone.utc))
