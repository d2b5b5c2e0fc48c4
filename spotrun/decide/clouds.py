"""The decision across clouds: each cloud's own decision, then one order by cost per progress
with the move of the checkpoint priced (docs/cost-model.md, "Moving between clouds").

Each cloud is decided exactly as a one-cloud daemon decides it (its catalog, market, notice,
risk, history): `decide` is not changed. Its candidates then carry their cloud and, where the
job's resume checkpoint lives in another cloud, the move: the source cloud's egress dollars
(added to expected_usd, and spread over the attempt in usd_per_reference_hour) and the copy's
hours (added to expected_hours, where a deadline sees them). Every cloud's candidates are
ranked together by the same key; one launch tries the first candidate's cloud only (the
checkpoint is copied before the launch, once per cloud).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping

from spotrun.catalog import Catalog
from spotrun.costmodel.egress import EgressRate, Throughput, move
from spotrun.costmodel.speed import default_scaling, instance_speed
from spotrun.decide.core import MAX_CANDIDATES, Placement
from spotrun.decide.market import MarketSnapshot
from spotrun.decide.rank import Candidate, Ranking, Rejection, rank_key, spec_scaling
from spotrun.spec import JobSpec

# Without remaining work to spread it over, a move's egress is spread over this many hours of
# the attempt (a spot pool's modelled hours to the next reclaim when shorter): the attempt
# that paid for the move is what benefits from it.
MOVE_HORIZON_H = 24.0


@dataclass(frozen=True)
class CheckpointAt:
    """Where the job's resume checkpoint is, and what moving it out costs."""

    cloud: str | None              # None: no checkpoint yet, or a store in no cloud (file://)
    nbytes: int = 0
    rates: Mapping[str, EgressRate] | None = None   # each cloud's egress rate, by cloud
    throughput: Throughput = Throughput()


NOWHERE = CheckpointAt(cloud=None)


@dataclass(frozen=True)
class CloudSpec:
    """The spec as one cloud decides it, and the factor that brings its figures to the job's
    own speed unit (1.0 when the work's reference type is in this cloud's catalog)."""

    spec: JobSpec
    unit: float = 1.0       # the job's reference type's speed over this cloud's stand-in's


def spec_in_cloud(spec: JobSpec, catalog: Catalog, zones: list[str],
                  catalogs: Mapping[str, Catalog]) -> tuple[CloudSpec | None, str]:
    """The spec as one cloud decides it: its instance types and zones cut to that cloud's;
    a work reference type of another cloud's catalog stands in as this catalog's own
    reference (every catalog's speeds are in V100 units), its figures rescaled to the job's
    unit by merge. (None, why) when the cloud can take none of the job.
    """
    res = spec.resources
    types = tuple(t for t in res.instance_types if t in catalog)
    if res.instance_types and not types:
        return None, "none of resources.instance_types is in its catalog"
    zs = tuple(z for z in res.zones if z in zones)
    if res.zones and not zs:
        return None, "none of resources.zones is one of its zones"
    work, unit = spec.work, 1.0
    ref = work.reference_instance
    if ref and ref not in catalog:
        home = next(c for c in catalogs.values() if ref in c)
        twin = str(catalog.meta.get("reference_instance") or catalog.names()[0])
        unit = _speed(spec, home, ref) / _speed(spec, catalog, twin)
        work = replace(work, reference_instance=twin,
                       reference_hours=None if work.reference_hours is None
                       else work.reference_hours * unit)
    return CloudSpec(replace(spec, resources=replace(res, instance_types=types, zones=zs),
                             work=work), unit), ""


def _speed(spec: JobSpec, catalog: Catalog, name: str) -> float:
    """A reference type's speed (V100 units) with the GPUs the job uses on it, as rank has it."""
    t = catalog.get(name)
    scaling = spec_scaling(spec) or default_scaling(catalog)
    return instance_speed(catalog, t, precision=spec.model.precision,
                          sharding=spec.model.sharding, scaling=scaling,
                          gpus=min(spec.resources.gpus, t.gpus))


def in_unit(c: Candidate, unit: float) -> Candidate:
    """A candidate's figures in the job's speed unit (unit: its reference over this cloud's)."""
    if unit == 1.0:
        return c
    return replace(c, speedup=c.speedup / unit,
                   usd_per_reference_hour=c.usd_per_reference_hour * unit)


def with_move(c: Candidate, cloud: str, at: CheckpointAt,
              hours_left: float | None) -> Candidate:
    """The candidate in `cloud`, with the move of the checkpoint to it priced in."""
    rate = (at.rates or {}).get(at.cloud or "")
    m = move(at.nbytes, at.cloud or cloud, cloud, rate, at.throughput)
    if not m.crosses or m.nbytes == 0:
        return replace(c, cloud=cloud)
    hours = (c.expected_hours or 0.0) + m.transfer_s / 3600.0
    horizon_h = c.expected_hours if c.expected_hours else MOVE_HORIZON_H
    if c.mtbf_h is not None and not math.isinf(c.mtbf_h) and c.mtbf_h > 0:
        horizon_h = min(horizon_h, c.mtbf_h / max(c.nodes, 1))
    progress = max(c.speedup * c.progress_fraction, 1e-9)
    share = m.usd / (max(horizon_h, 1e-6) * progress)
    return replace(
        c, cloud=cloud, egress_usd=m.usd, transfer_s=m.transfer_s,
        usd_per_reference_hour=c.usd_per_reference_hour + share,
        expected_usd=None if c.expected_usd is None else c.expected_usd + m.usd,
        expected_hours=None if c.expected_hours is None else hours,
        misses_deadline=c.misses_deadline or (
            hours_left is not None and c.expected_hours is not None and hours > hours_left))


def merge(placed: Mapping[str, Placement], at: CheckpointAt, hours_left: float | None,
          left_out: Mapping[str, str] | None = None,
          units: Mapping[str, float] | None = None) -> Placement:
    """One placement over every cloud's (in settings order; left_out: the clouds that could
    take no part, with why; units: each cloud's CloudSpec.unit): candidates ranked together,
    in one speed unit, with their moves priced; the launch tries the best candidate's cloud."""
    clouds = list(placed)
    units = units or {}

    def moved(c: Candidate, cloud: str) -> Candidate:
        return with_move(in_unit(c, units.get(cloud, 1.0)), cloud, at, hours_left)

    if len(clouds) == 1 and at.cloud in (None, clouds[0]):
        # One cloud holding the checkpoint: its own decision, in its own order (a deadline
        # policy's pick included), each candidate named with its cloud.
        one, cloud = placed[clouds[0]], clouds[0]
        ref = one.ranking.reference
        return replace(one, candidates=[replace(c, cloud=cloud) for c in one.candidates],
                       ranking=replace(one.ranking, candidates=[
                           replace(c, cloud=cloud) for c in one.ranking.candidates],
                           reference=ref and replace(ref, cloud=cloud)))
    ranked = sorted((moved(c, cloud) for cloud in clouds
                     for c in placed[cloud].ranking.candidates), key=rank_key)
    launchable = sorted((moved(c, cloud) for cloud in clouds
                         for c in placed[cloud].candidates), key=rank_key)
    first_cloud = launchable[0].cloud if launchable else None
    order = [c for c in launchable if c.cloud == first_cloud][:MAX_CANDIDATES]
    home = placed[clouds[0]]
    rejected = [replace(r, reason=f"{cloud}: {r.reason}") if len(clouds) > 1 else r
                for cloud in clouds for r in placed[cloud].ranking.rejected]
    rejected += [Rejection(instance_type="*", reason=f"{cloud}: {why}")
                 for cloud, why in (left_out or {}).items()]
    # The reference row is the job's reference type's, in the cloud whose catalog has it
    # (unit 1); another cloud's on-demand row stands in only when that cloud has none.
    refs = sorted(((units.get(c, 1.0) != 1.0, moved(r, c)) for c in clouds
                   if (r := placed[c].ranking.reference) is not None),
                  key=lambda x: (x[0], rank_key(x[1])))
    ranking = Ranking(candidates=ranked, rejected=rejected,
                      reference=refs[0][1] if refs else None,
                      reference_instance=home.ranking.reference_instance,
                      work_reference_hours=home.ranking.work_reference_hours,
                      # A stand-in reference's notes are about the stand-in, not the job's.
                      notes=[n for c in clouds if units.get(c, 1.0) == 1.0
                             for n in placed[c].ranking.notes])
    chosen = placed[first_cloud] if first_cloud else home
    wait = None if order else "; ".join(
        f"{c}: {placed[c].wait_reason}" if len(clouds) > 1 else str(placed[c].wait_reason)
        for c in clouds if placed[c].wait_reason)
    return Placement(candidates=order, ranking=ranking, market=merged_market(placed),
                     time_scale=home.time_scale, wait_reason=wait or None,
                     policy_decision=chosen.policy_decision,
                     warnings=[w for c in clouds for w in placed[c].warnings])


def merged_market(placed: Mapping[str, Placement]) -> MarketSnapshot:
    """Every cloud's market as one snapshot (its zones, prices, availability; the time and the
    quarantine of the first cloud: zones differ across clouds, so no pool is in two)."""
    markets = [p.market for p in placed.values()]
    if len(markets) == 1:
        return markets[0]
    first = markets[0]
    spot: dict[tuple[str, str], float | None] = {}
    avail: dict[tuple[str, str], bool] = {}
    od: dict[str, float | None] = {}
    for m in markets:
        spot.update(m.spot)
        avail.update(m.available)
        od.update(m.on_demand)
    return replace(first, zones=tuple(z for m in markets for z in m.zones), spot=spot,
                   available=avail, on_demand=od, fetch=None,
                   source="; ".join(f"{c}: {p.market.source}" for c, p in placed.items()))
