"""The simulation model: a trace turned into whole ticks, prices and the job's size.

Rules (BRIEF section 4): the tick is the median gap between rows; work rounds up,
the deadline down and the changeover to the nearest whole tick. Spot needs the pool
available (>= `nodes` instances) at that tick; a launch also needs it not closed by a
reclaim within the notice quarantine (a reclaim of the trace is a notice in its pool).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from spotrun.errors import BadInputError
from spotrun.decide.policy.history import MarketHistory
from spotrun.decide.policy.moves import CloudMoves
from spotrun.traces import PriceBook, Trace

# Guards ceil/floor against float noise such as 886.0000000001 ticks.
_ROUND_EPS = 1e-9


@dataclass
class SimModel:
    """Everything a run needs: market history, job size and deadline in ticks."""

    history: MarketHistory
    tick_values: np.ndarray      # the trace's `tick` column (for --t0 and --decisions)
    work_ticks: int
    deadline_ticks: int
    changeover_ticks: int
    moves: CloudMoves | None = None   # pools in several clouds (simulate/clouds.py)

    @property
    def tick_s(self) -> float:
        """Seconds per tick."""
        return self.history.tick_s

    @property
    def tick_h(self) -> float:
        """Hours per tick."""
        return self.history.tick_s / 3600.0

    @property
    def pools(self) -> list[str]:
        """Pools the job may use."""
        return self.history.pools

    def on_demand_cost_usd(self) -> float:
        """Cost of launching on-demand at the start and staying: the baseline."""
        return (self.work_ticks + self.changeover_ticks) * self.tick_h * \
            self.history.od_price_usd_per_hour

    def last_start_row(self) -> int:
        """The last row at which a whole deadline window fits in the trace."""
        return len(self.history) - self.deadline_ticks


def build_model(trace: Trace, prices: PriceBook | None, *, spot_price_usd_per_hour: float | None,
                od_price_usd_per_hour: float, work_hours: float, deadline_hours: float,
                changeover_hours: float = 0.2, nodes: int = 1,
                notice_quarantine_s: float = 0.0) -> SimModel:
    """Validate the inputs and turn hours into ticks; raises BadInputError naming the flag.

    notice_quarantine_s: how long a reclaim of the trace closes its pool to launches (the
    provider's fact, as the daemon applies it to a notice; 0: never).
    """
    for flag, value in (("--od-price", od_price_usd_per_hour), ("--work-hours", work_hours),
                        ("--deadline-hours", deadline_hours)):
        if not (value > 0 and math.isfinite(value)):
            raise BadInputError("must be a positive number", field=flag, value=value)
    if not (changeover_hours >= 0 and math.isfinite(changeover_hours)):
        raise BadInputError("must be >= 0", field="--changeover-hours", value=changeover_hours)
    if spot_price_usd_per_hour is not None and not (spot_price_usd_per_hour >= 0
                                                    and math.isfinite(spot_price_usd_per_hour)):
        raise BadInputError("must be >= 0", field="--spot-price", value=spot_price_usd_per_hour)
    if nodes < 1:
        raise BadInputError("must be >= 1", field="--nodes", value=nodes)
    if len(trace) < 2:
        raise BadInputError("the trace needs at least two rows", field="--trace", value=trace.source)
    tick_s = trace.tick_s
    if not tick_s > 0:
        raise BadInputError("rows must be increasing in time", field="--trace", value=trace.source)
    work = math.ceil(work_hours * 3600.0 / tick_s - _ROUND_EPS)
    deadline = math.floor(deadline_hours * 3600.0 / tick_s + _ROUND_EPS)
    changeover = math.floor(changeover_hours * 3600.0 / tick_s + 0.5)
    if deadline < work + changeover:
        raise BadInputError(
            f"deadline {deadline_hours:g} h is too short for {work_hours:g} h of work + "
            f"{changeover_hours:g} h of changeover (counted in the trace's {tick_s:g} s steps)",
            field="--deadline-hours", value=deadline_hours)
    if deadline > len(trace):
        span_h = len(trace) * tick_s / 3600.0
        raise BadInputError(f"deadline {deadline_hours:g} h is longer than the trace's "
                            f"{_hours(span_h)} h", field="--deadline-hours", value=deadline_hours)
    if prices is not None:
        price = prices.matrix(trace)
        if spot_price_usd_per_hour is not None:
            price = np.where(np.isnan(price), spot_price_usd_per_hour, price)
        missing = [p for j, p in enumerate(trace.pools) if np.isnan(price[:, j]).any()]
        if missing:
            raise BadInputError(f"no spot price for pool(s) {', '.join(missing)}",
                                field="--prices", hint="add --spot-price as a fallback")
    elif spot_price_usd_per_hour is not None:
        price = np.full((len(trace), len(trace.pools)), float(spot_price_usd_per_hour))
    else:
        raise BadInputError("give --prices CSV or --spot-price USD", field="--spot-price")
    history = MarketHistory(trace.pools, trace.up(nodes), price, od_price_usd_per_hour, tick_s,
                            notice_quarantine_s=notice_quarantine_s)
    return SimModel(history=history, tick_values=trace.ticks, work_ticks=work,
                    deadline_ticks=deadline, changeover_ticks=changeover)


def _hours(h: float) -> str:
    """Hours for a message: one decimal, no trailing .0."""
    return f"{round(h, 1):g}"


def pick_starts(model: SimModel, *, starts: int | None, seed: int,
                t0: list[int] | None) -> np.ndarray:
    """Row indices of the runs' starts: the --t0 ticks, or `starts` seeded random rows."""
    last = model.last_start_row()
    if t0:
        rows = []
        for tick in t0:
            hit = np.flatnonzero(model.tick_values == tick)
            if hit.size == 0:
                raise BadInputError("not a tick of the trace", field="--t0", value=tick)
            row = int(hit[0])
            if row > last:
                raise BadInputError(f"the deadline window does not fit after it (last start: "
                                    f"tick {int(model.tick_values[last])})", field="--t0",
                                    value=tick)
            rows.append(row)
        return np.asarray(rows, dtype=np.int64)
    n = 100 if starts is None else starts
    if n < 1:
        raise BadInputError("must be >= 1", field="--starts", value=n)
    rng = np.random.default_rng(seed)
    return rng.integers(0, last + 1, size=n).astype(np.int64)
