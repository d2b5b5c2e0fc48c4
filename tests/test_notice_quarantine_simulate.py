"""Issue 40 in `spotrun simulate`: a reclaim in the trace is a notice in its pool at that tick.

The simulator closes the pool to launches for the provider's `notice_quarantine_s`, as the
daemon does after a notice (the policies are the daemon's, through the one `policy_step`),
and the hindsight optimum obeys the same rule, so it still replays to its own cost.

Market: one-minute rows; pool `a` at $1/h is up, reclaimed at row 5, back at row 6 (a
flapping pool, the soak's case); pool `b` at $2/h is always up.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import write_prices, write_trace

from spotrun.cli.simulate import simulate
from spotrun.decide.policy import Decision, JobProgress, MarketHistory, Mode, make_policy
from spotrun.decide.policy.base import policy_step
from spotrun.providers.local import FACTS as LOCAL_FACTS
from spotrun.simulate.engine import run_policy
from spotrun.simulate.model import SimModel
from spotrun.simulate.sweep import run_policies

TICK_S = 60.0
ROWS = 40
RECLAIM = 5
A = [1] * RECLAIM + [0] + [1] * (ROWS - RECLAIM - 1)
B = [1] * ROWS
WINDOW_S = LOCAL_FACTS.notice_quarantine_s          # the default provider's (local) window
CLOSED = int(WINDOW_S // TICK_S)                     # rows RECLAIM .. RECLAIM + CLOSED - 1


def _model(quarantine_s: float, *, work: int = 20, deadline: int = 30,
           changeover: int = 1) -> SimModel:
    up = np.array([A, B], dtype=bool).T
    price = np.tile([1.0, 2.0], (ROWS, 1))
    h = MarketHistory(["a", "b"], up, price, 3.0, TICK_S, notice_quarantine_s=quarantine_s)
    return SimModel(history=h, tick_values=np.arange(ROWS), work_ticks=work,
                    deadline_ticks=deadline, changeover_ticks=changeover)


def _launches(decisions: list[Decision], start: int) -> list[tuple[int, str]]:
    out, here = [], None
    for k, d in enumerate(decisions):
        where = d.pool if d.mode is Mode.SPOT else d.mode.value
        if d.mode is not Mode.IDLE and where != here:
            out.append((start + k, where))
        here = None if d.mode is Mode.IDLE else where
    return out


def test_after_a_reclaim_greedy_relaunches_elsewhere_until_the_window_ends():
    m = _model(WINDOW_S, work=8, deadline=20, changeover=0)
    # From row 0: a until its reclaim at 5 (a lost tick), then b, not a back at row 6.
    run = run_policy(m, make_policy("greedy"), 0, record=True)
    assert run.reclaims == 1
    assert _launches(run.decisions, 0) == [(0, "a"), (6, "b")]
    # A run starting in the window takes b; the row the window ends, a again.
    last_closed = RECLAIM + CLOSED - 1
    assert _launches(run_policy(m, make_policy("greedy"), last_closed, record=True)
                     .decisions, last_closed)[0] == (last_closed, "b")
    assert _launches(run_policy(m, make_policy("greedy"), last_closed + 1, record=True)
                     .decisions, last_closed + 1)[0] == (last_closed + 1, "a")
    # Without a quarantine (a provider that declares none): straight back into a.
    bare = run_policy(_model(0.0, work=8, deadline=20, changeover=0), make_policy("greedy"), 0,
                      record=True)
    assert _launches(bare.decisions, 0) == [(0, "a"), (6, "a")]


@pytest.mark.parametrize("changeover", [0, 1])
def test_the_optimum_never_launches_into_a_closed_pool_and_replays_to_its_cost(changeover):
    m = _model(WINDOW_S, changeover=changeover)
    res = run_policies(m, np.array([0, 3, 6]), ["optimal", "greedy", "reserve", "spotrun"],
                       record=True)
    for name, runs in res.runs.items():
        for start, decs in zip(res.start_rows, runs.decisions or []):
            moves = _launches(decs, int(start))
            assert all(not (RECLAIM <= row < RECLAIM + CLOSED and pool == "a")
                       for row, pool in moves), (name, start, moves)
        assert runs.deadline_met.all(), name
    # Closing a pool only takes options away: never cheaper than without the rule.
    free = run_policies(_model(0.0, changeover=changeover), np.array([0, 3, 6]), ["optimal"])
    assert (res.runs["optimal"].costs_usd >= free.runs["optimal"].costs_usd - 1e-9).all()


def test_a_job_on_a_closed_pool_stays_there():
    # The daemon's case: another attempt's notice closes the pool this job runs on. Staying
    # is not a launch.
    m = _model(0.0)
    view = m.history.view(8)
    on_a = JobProgress(work_total_s=600.0, work_done_s=0.0, time_left_s=1800.0, elapsed_s=0.0,
                       changeover_s=0.0, tick_s=TICK_S, mode=Mode.SPOT, pool="a")
    assert policy_step(make_policy("greedy"), on_a, view, closed={"a"}) == Decision(Mode.SPOT,
                                                                                     "a")
    idle = on_a._replace(mode=Mode.IDLE, pool=None)
    assert policy_step(make_policy("greedy"), idle, view, closed={"a"}) == Decision(Mode.SPOT,
                                                                                    "b")


def test_spotrun_simulate_applies_the_configured_providers_quarantine(tmp_path: Path,
                                                                       monkeypatch):
    # A user's run (docs/simulate.md): `spotrun simulate --decisions` on the flapping trace.
    monkeypatch.setenv("SPOTRUN_HOME", str(tmp_path / "home"))    # the default: local
    trace = write_trace(tmp_path / "trace.csv", {"a": A, "b": B}, TICK_S)
    prices = write_prices(tmp_path / "prices.csv", [("a", 0, 1.0), ("b", 0, 2.0)])
    out = tmp_path / "decisions.csv"
    res = CliRunner().invoke(simulate, [
        "--trace", str(trace), "--prices", str(prices), "--od-price", "3.0",
        "--work-hours", repr(8 * TICK_S / 3600.0), "--deadline-hours", repr(20 * TICK_S / 3600.0),
        "--changeover-hours", "0", "--t0", "0", "--policy", "greedy", "--decisions", str(out),
        "--json"])
    assert res.exit_code == 0, res.output
    with out.open() as fh:
        rows = [(int(r["tick"]), r["mode"], r["pool"]) for r in csv.DictReader(fh)]
    assert rows[RECLAIM] == (RECLAIM, "idle", "")              # the reclaimed tick
    assert rows[RECLAIM + 1] == (RECLAIM + 1, "spot", "b")     # a is closed: b
