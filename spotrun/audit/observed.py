"""A finished job's hindsight model: the market it could have used, as far as it is known.

Builds the simulator's SimModel (spotrun.simulate.model) over the job's window so
`spotrun.simulate.optimal` can price the best schedule in hindsight:

- pools: the zones of the job's main instance type (the one it ran longest on): every
  zone the market offered when its truth is known, else the zones it ran in or was offered;
- window: from the first attempt's start to the job's deadline, or to its actual finish
  when it had no deadline (or missed it); one tick = `tick_s` provider seconds (60);
- availability per tick: the market's truth where there is one (the local market's trace,
  spotrun.providers.local.truth), else "unknown = unavailable" plus what the daemon saw:
  a pool is up during its own spot attempts; a reclaim, a refused launch and a "waiting"
  event make it down at that moment (these override the trace too: a forced reclaim is real);
- prices: recorded PricePoint rows, else the truth's price, else the attempts' launch prices;
- work: the job's productive time (steps kept / measured training speed, boot and
  checkpoint stalls excluded); changeover: the mean measured boot-to-training overhead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Callable

import numpy as np
from sqlmodel import Session, select

from spotrun.providers.base import MarketTruth
from spotrun.db import Attempt, Event, Job, JobRows, PricePoint, attempts_of
from spotrun.providers.base import pools_from_json
from spotrun.states import EndReason, JobState, Market
from spotrun.decide.policy.history import MarketHistory
from spotrun.simulate.model import SimModel

TICK_S = 60.0
MAX_TICKS = 5000            # longer windows get a coarser tick (the DP is ticks x slack)
OdPrice = Callable[[str], "float | None"]


@dataclass
class ObservedModel:
    """The model plus where its parts came from (for notes)."""

    model: object               # spotrun.simulate.model.SimModel
    t0: datetime
    instance_type: str
    sources: list[str] = field(default_factory=list)


def _aware(t: datetime) -> datetime:
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t


def build_observed_model(s: Session, job: Job, *, od_price: OdPrice,
                         truth: MarketTruth | None = None, tick_s: float = TICK_S,
                         rows: JobRows | None = None) -> ObservedModel | None:
    """The job's hindsight SimModel (row 0 = its first start); None when it cannot be built.

    rows: the job's rows read in bulk (spotrun.db.rows_by_job); None reads them here.
    """
    if rows is None:
        rows = JobRows(attempts=attempts_of(s, job.id))
    atts = [a for a in rows.attempts if a.started_at is not None]
    if not atts or any(a.ended_at is None for a in atts):
        return None
    itype = _main_type(atts)
    work_s = _work_s(job, atts)
    if work_s is None or work_s <= 0:
        return None
    od = od_price(itype)
    if od is None:
        ods = [a.price_usd_per_hour for a in atts if a.market is Market.ON_DEMAND]
        if not ods:
            return None
        od = ods[0]
    t0 = min(_aware(a.started_at) for a in atts)
    finish = max(_aware(a.ended_at) for a in atts)
    to_provider = truth.provider_time if truth is not None else _aware
    end = finish
    deadline = (job.spec.get("policy") or {}).get("deadline")
    if deadline:
        d = to_provider(_aware(datetime.fromisoformat(str(deadline).replace("Z", "+00:00"))))
        end = max(end, d)
    span_s = (end - t0).total_seconds()
    if span_s / tick_s > MAX_TICKS:
        tick_s = math.ceil(span_s / MAX_TICKS / 60.0) * 60.0
    overheads = [(_aware(a.running_at) - _aware(a.started_at)).total_seconds()
                 for a in atts if a.running_at is not None]
    changeover = int(math.floor(max(float(np.mean(overheads)), 0.0) / tick_s + 0.5)) \
        if overheads else 0
    work = max(1, math.ceil(work_s / tick_s - 1e-9))
    n = max(int(math.floor(span_s / tick_s + 1e-9)), work + changeover)
    pools = _pools(atts, itype, truth)
    times = [t0 + timedelta(seconds=k * tick_s) for k in range(n)]
    sources = []
    up = _availability(s, job, rows, atts, itype, pools, times, tick_s, truth, to_provider,
                       sources)
    price = _prices(s, rows, atts, itype, pools, times, truth, od, sources)
    history = MarketHistory(pools, up, price, od, tick_s)
    model = SimModel(history=history, tick_values=np.arange(n), work_ticks=work,
                     deadline_ticks=n, changeover_ticks=changeover)
    return ObservedModel(model=model, t0=t0, instance_type=itype, sources=sources)


def _main_type(atts: list[Attempt]) -> str:
    used: dict[str, float] = {}
    for a in atts:
        used[a.instance_type] = used.get(a.instance_type, 0.0) + \
            (_aware(a.ended_at) - _aware(a.started_at)).total_seconds()
    return max(sorted(used), key=lambda t: used[t])


def _work_s(job: Job, atts: list[Attempt]) -> float | None:
    """Productive provider-seconds the job needed: steps kept / measured training speed."""
    steps = secs = 0.0
    for a in atts:
        if a.running_at is None:
            continue
        gained = a.last_step - a.start_step
        train = (_aware(a.ended_at) - _aware(a.running_at)).total_seconds() - \
            (a.checkpoint_stall_s or 0.0)
        if gained > 0 and train > 0:
            steps += gained
            secs += train
    if steps <= 0:
        return None
    kept = (job.total_steps or job.last_step) if job.state is JobState.SUCCEEDED \
        else job.last_step
    kept = kept or max(a.last_step for a in atts)
    return kept / (steps / secs)


def _pools(atts: list[Attempt], itype: str, truth: MarketTruth | None) -> list[str]:
    if truth is not None:
        return sorted(truth.zones())
    zones = {a.zone for a in atts if a.instance_type == itype and a.market is Market.SPOT}
    for a in atts:
        zones.update(p.zone for p in pools_from_json(a.candidates)
                     if p.instance_type == itype and p.market is Market.SPOT)
    return sorted(zones)


def _index(times: list[datetime], t0: datetime, tick_s: float, at: datetime) -> int | None:
    k = int(math.floor((at - t0).total_seconds() / tick_s))
    return k if 0 <= k < len(times) else None


def _availability(s: Session, job: Job, rows: JobRows, atts: list[Attempt], itype: str,
                  pools: list[str], times: list[datetime], tick_s: float,
                  truth: MarketTruth | None,
                  to_provider: Callable[[datetime], datetime],
                  sources: list[str]) -> np.ndarray:
    n, t0 = len(times), times[0]
    col = {z: j for j, z in enumerate(pools)}
    if truth is not None:
        up = np.array([[truth.available(z, t) for z in pools] for t in times], dtype=bool)
        sources.append(f"availability: {truth.name} and the daemon's observations")
    else:
        up = np.zeros((n, len(pools)), dtype=bool)
        sources.append("availability: the daemon's own attempts only (unobserved = unavailable)")
    for a in atts:   # a pool was up for every whole tick one of our spot instances ran in it
        if a.market is Market.SPOT and a.instance_type == itype and a.zone in col:
            k0 = math.ceil((_aware(a.started_at) - t0).total_seconds() / tick_s - 1e-9)
            k1 = math.floor((_aware(a.ended_at) - t0).total_seconds() / tick_s + 1e-9)
            up[max(k0, 0):min(k1, n), col[a.zone]] = True
    for a in atts:
        if a.market is Market.SPOT and a.end_reason is EndReason.RECLAIMED and a.zone in col:
            k = _index(times, t0, tick_s, _aware(a.ended_at))
            if k is not None:
                up[k, col[a.zone]] = False
    for a in rows.attempts:   # launch failures never started: not in atts
        if a.end_reason is EndReason.LAUNCH_FAILED and a.market is Market.SPOT and a.zone in col:
            k = _index(times, t0, tick_s, to_provider(_aware(a.created_at)))
            if k is not None:
                up[k, col[a.zone]] = False
    waiting = rows.waiting if rows.waiting is not None else \
        s.exec(select(Event).where(Event.job_id == job.id, Event.kind == "waiting"))
    for ev in waiting:
        k = _index(times, t0, tick_s, to_provider(_aware(ev.ts)))
        if k is not None:
            up[k, :] = False
    return up


def _prices(s: Session, rows: JobRows, atts: list[Attempt], itype: str, pools: list[str],
            times: list[datetime], truth: MarketTruth | None, od: float,
            sources: list[str]) -> np.ndarray:
    out = np.full((len(times), len(pools)), np.nan)
    stamps = np.array([t.timestamp() for t in times])
    used = set()
    for j, zone in enumerate(pools):
        points = rows.prices.of(s, itype, zone) if rows.prices is not None else \
            list(s.exec(select(PricePoint).where(PricePoint.instance_type == itype,
                                                 PricePoint.zone == zone)
                        .order_by(PricePoint.ts)))
        if points:
            ts = np.array([_aware(r.ts).timestamp() for r in points])
            ps = np.array([r.price_usd_per_hour for r in points])
            idx = np.clip(np.searchsorted(ts, stamps, side="right") - 1, 0, len(points) - 1)
            out[:, j] = ps[idx]
            used.add("recorded PricePoints")
        elif truth is not None:
            out[:, j] = [truth.spot_price(itype, zone, t) or np.nan for t in times]
            used.add(truth.name)
    spot = [a for a in atts if a.market is Market.SPOT and a.instance_type == itype]
    for j, zone in enumerate(pools):
        if np.isnan(out[:, j]).any():
            here = [a.price_usd_per_hour for a in spot if a.zone == zone] or \
                [a.price_usd_per_hour for a in spot]
            out[:, j] = np.where(np.isnan(out[:, j]), float(np.mean(here)) if here else od,
                                 out[:, j])
            used.add("attempts' launch prices")
    sources.append("prices: " + ", ".join(sorted(used)))
    return out
