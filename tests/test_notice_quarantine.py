"""Issue 40: a notice in a pool is news; the decision does not launch into it for a while.

A 26-hour soak sent 3 of 60 launches into a pool reclaimed within 120 market seconds, one 42 s
after the daemon's own instance in that zone got its interruption notice. These tests hold
the decision (`spotrun.decide`) to the rule: a spot pool (type + zone) with a notice less than
the provider's `notice_quarantine_s` ago is rejected (kind `now`, with the notice and when the
pool opens); after the window it is a candidate again. The notices are read from the state
database (SQLite, real rows) as the daemon and `spotrun plan` read them.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import write_prices, write_trace

from spotrun.catalog import load_catalog
from spotrun.cli import cli
from spotrun.config import load_settings
from spotrun.costmodel import NoHistory
from spotrun.db import Attempt, Job, open_db, session
from spotrun.decide import MarketSnapshot, catalog_snapshot, decide, refusal
from spotrun.decide.deadline import first_decision
from spotrun.decide.market import snapshot_fingerprint
from spotrun.decide.policy import Mode
from spotrun.decide.quarantine import PoolNotice, Quarantine, recent_notices
from spotrun.decide.waitkind import NOTICE_QUARANTINE, reason_kind
from spotrun.providers.aws import FACTS as AWS_FACTS
from spotrun.providers.facts import FACTS
from spotrun.spec import JobSpec, parse_spec
from spotrun.states import AttemptState, EndReason, Market

CAT = load_catalog()
P3 = "p3.2xlarge"
ZONES = ["za", "zb"]
PRICES = {"za": 1.0, "zb": 2.0}          # za is the cheaper pool: today's first launch
T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
WINDOW_S = AWS_FACTS.notice_quarantine_s


def _spec(market: str = "spot", deadline: bool = False) -> JobSpec:
    policy: dict = {"market": market}
    if deadline:
        policy["deadline_hours"] = 48
    body = {"name": "q", "command": "python train.py", "resources": {"instance_types": [P3]},
            "work": {"reference_hours": 2.0, "reference_instance": P3}, "policy": policy}
    return parse_spec(body, base_dir=Path("."), instance_types=CAT.names(), zones=ZONES, now=T0)


def _market(now: datetime, *notices: PoolNotice) -> MarketSnapshot:
    market = catalog_snapshot(CAT, "us-east-1", ZONES, now, types=[P3])
    for z, price in PRICES.items():
        market.spot[(P3, z)] = price
    return replace(market, quarantine=Quarantine(WINDOW_S, notices))


def _decide(spec: JobSpec, market: MarketSnapshot, hours_left: float | None = None):
    return decide(spec, catalog=CAT, market=market, history=NoHistory(), hours_left=hours_left)


def test_a_pool_with_a_notice_42_s_ago_is_not_chosen_and_is_again_1_s_after_the_window():
    spec = _spec()
    notice = PoolNotice(P3, "za", T0)
    assert _decide(spec, _market(T0 - timedelta(seconds=1))).first.zone == "za"   # before it

    placed = _decide(spec, _market(T0 + timedelta(seconds=42), notice))
    assert placed.first.zone == "zb"
    assert all(c.zone != "za" for c in placed.candidates)
    [why] = [r for r in placed.ranking.rejected if r.zone == "za"]
    until = T0 + timedelta(seconds=WINDOW_S)
    assert (why.kind, why.market) == ("now", "spot")
    assert why.reason == (f"interruption notice in za at 12:00:00: no spot launch there for "
                          f"{WINDOW_S:g} s (until {until:%H:%M:%S})")
    assert reason_kind(why.reason) == NOTICE_QUARANTINE
    # plan --json and submit --dry-run --json print the rejection as it is.
    assert placed.to_dict()["rejected"][0] == {"instance_type": P3, "zone": "za",
                                              "market": "spot", "kind": "now",
                                              "reason": why.reason}

    last = _decide(spec, _market(until - timedelta(seconds=1), notice))
    assert last.first.zone == "zb"
    again = _decide(spec, _market(until + timedelta(seconds=1), notice))
    assert again.first.zone == "za" and not again.ranking.rejected


def test_only_the_pool_of_the_notice_closes():
    # Another type's notice in za, or one in another zone, leaves p3.2xlarge in za open.
    now = T0 + timedelta(seconds=42)
    others = (PoolNotice("g5.xlarge", "za", T0), PoolNotice(P3, "zc", T0))
    assert _decide(_spec(), _market(now, *others)).first.zone == "za"
    # A notice dated after the decision's moment (another clock's) closes nothing.
    assert _decide(_spec(), _market(T0, PoolNotice(P3, "za", T0 + timedelta(hours=3)))
                   ).first.zone == "za"


def test_every_pool_quarantined_waits_with_the_reason_unless_on_demand_is_allowed():
    now = T0 + timedelta(seconds=42)
    market = _market(now, PoolNotice(P3, "za", T0),
                     PoolNotice(P3, "zb", T0 + timedelta(seconds=30)))
    spot = _decide(_spec(), market)
    first_open = T0 + timedelta(seconds=WINDOW_S)
    assert spot.candidates == []
    assert spot.wait_reason == (f"every spot pool that can take the job had an interruption "
                                f"notice in the last {WINDOW_S:g} s (2 pool(s)); the first "
                                f"opens at {first_open:%H:%M:%S}")
    assert reason_kind(spot.wait_reason) == NOTICE_QUARANTINE
    # Waiting, not refusing: the pools open again.
    assert refusal(_spec(), spot.ranking, catalog=CAT, market=market, history=NoHistory(),
                   hours_left=None) is None
    # `auto` without a deadline never pays on-demand: it waits for the same reason.
    auto = _decide(_spec("auto"), market)
    assert auto.candidates == [] and reason_kind(auto.wait_reason) == NOTICE_QUARANTINE
    # Under a deadline on-demand is allowed, and the ranking's next choice: it launches.
    late = _decide(_spec("auto", deadline=True), market, hours_left=48.0)
    assert late.candidates and {c.market for c in late.candidates} == {Market.ON_DEMAND}
    assert late.wait_reason is None


def test_a_deadline_jobs_policy_does_not_launch_into_a_closed_pool():
    # The deadline policy picks the zone (decide.deadline, as the daemon's placer does each
    # interval): with za closed it takes zb, then za once the window is over.
    spec = _spec("auto", deadline=True)
    notice = PoolNotice(P3, "za", T0)

    def first(now: datetime) -> tuple[Mode, str | None]:
        market = _market(now, notice)
        placed = _decide(spec, market, hours_left=48.0)
        decision, target = first_decision(spec, placed.ranking.candidates, market,
                                          policy_name="greedy", tick_s=300.0,
                                          changeover_s=600.0, now=now)
        return decision.mode, target.zone if target is not None else None

    assert first(T0 + timedelta(seconds=42)) == (Mode.SPOT, "zb")
    assert first(T0 + timedelta(seconds=WINDOW_S + 1)) == (Mode.SPOT, "za")


def test_a_notice_and_the_end_of_its_quarantine_change_the_standing_decision_key():
    notice = PoolNotice(P3, "za", T0)
    before = snapshot_fingerprint(_market(T0 + timedelta(seconds=42)))
    closed = snapshot_fingerprint(_market(T0 + timedelta(seconds=42), notice))
    opened = snapshot_fingerprint(_market(T0 + timedelta(seconds=WINDOW_S + 1), notice))
    assert closed != before and opened == before


def test_every_provider_declares_its_quarantine_in_its_facts(tmp_path: Path):
    settings = load_settings(str(tmp_path))
    for name, facts in FACTS.items():
        # Longer than the notice itself: the reclaim comes at the notice's end, and
        # capacity is still being taken back after it (docs/cost-model.md).
        assert facts.notice_quarantine_s > facts.notice_window_s(settings), name
    assert (FACTS["aws"].notice_quarantine_s, FACTS["gcp"].notice_quarantine_s) == (720.0, 630.0)


def _attempt(n: int, zone: str, *, notice_at: datetime | None = None,
             ended_at: datetime | None = None, end: EndReason | None = None,
             market: Market = Market.SPOT, itype: str = P3) -> Attempt:
    return Attempt(job_id="j1", number=n, state=AttemptState.ENDED if end else
                   AttemptState.RUNNING, market=market, instance_type=itype, zone=zone,
                   price_usd_per_hour=1.0, client_token=f"t{n}",
                   started_at=T0 - timedelta(hours=1), ended_at=ended_at, end_reason=end,
                   notice_at=notice_at)


def test_the_daemon_reads_notices_and_reclaims_without_one_from_every_attempt(tmp_path: Path):
    engine = open_db(f"sqlite:///{tmp_path / 'state.db'}")
    now = T0 + timedelta(minutes=20)
    recent, old = T0 + timedelta(minutes=15), T0 - timedelta(hours=1)
    with session(engine) as s:
        s.add(Job(id="j1", name="j1", spec_json="{}", store_uri="file:///x",
                  checkpoint_uri="file:///x/c"))
        s.flush()
        s.add_all([
            _attempt(1, "za", notice_at=recent),                        # running, noticed
            _attempt(2, "zb", ended_at=recent, end=EndReason.RECLAIMED),  # no notice recorded
            _attempt(3, "zc", notice_at=old, ended_at=old, end=EndReason.RECLAIMED),  # too old
            _attempt(4, "zd", ended_at=recent, end=EndReason.MOVED),      # the daemon's move
            _attempt(5, "ze", notice_at=recent, market=Market.ON_DEMAND),  # never reclaimed
            _attempt(6, "za", notice_at=recent, itype="g5.xlarge")])
        s.commit()
    q = recent_notices(engine, now, WINDOW_S)
    assert q.window_s == WINDOW_S
    assert sorted((n.instance_type, n.zone, n.at) for n in q.notices) == [
        ("g5.xlarge", "za", recent), (P3, "za", recent), (P3, "zb", recent)]
    assert q.closed(now) == {(P3, "za"), (P3, "zb"), ("g5.xlarge", "za")}
    assert recent_notices(engine, now, 0.0).notices == ()
    engine.dispose()


def test_plan_shows_the_quarantined_pool_with_its_reason(tmp_path: Path):
    # A user's view (docs/cost-model.md, "Notice quarantine"): the daemon recorded a notice
    # in za; `spotrun plan --json` lists za among the rejected pools, with the notice's time
    # and when the pool opens, and launches in zb.
    home = tmp_path / "home"
    home.mkdir()
    trace = write_trace(tmp_path / "trace.csv", {"za": [1] * 50, "zb": [1] * 50}, 600.0)
    prices = write_prices(tmp_path / "prices.csv", [("za", 0, 0.9), ("zb", 0, 1.2)])
    (home / "spotrun.toml").write_text(f'[local]\ntrace = "{trace}"\nprices = "{prices}"\n')
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: q\ncommand: python train.py\nresources: {{instance_types: [{P3}]}}\n"
                    f"work: {{reference_hours: 3, reference_instance: {P3}}}\n"
                    "policy: {market: spot}\n")

    def plan() -> dict:
        res = CliRunner().invoke(cli, ["plan", str(spec), "--json"],
                                 env={"SPOTRUN_HOME": str(home)})
        assert res.exit_code == 0, res.output
        return json.loads(res.output)

    first = [c for c in plan()["candidates"] if c["launch"]][0]
    assert (first["instance_type"], first["zone"]) == (P3, "za")
    engine = open_db(load_settings(str(home)).database_url)
    noticed = datetime.now(timezone.utc) - timedelta(seconds=42)
    with session(engine) as s:
        s.add(Job(id="j1", name="j1", spec_json="{}", store_uri="file:///x",
                  checkpoint_uri="file:///x/c"))
        s.flush()
        s.add(_attempt(1, "za", notice_at=noticed))
        s.commit()
    engine.dispose()
    out = plan()
    first = [c for c in out["candidates"] if c["launch"]][0]
    assert (first["instance_type"], first["zone"]) == (P3, "zb")
    [why] = [r for r in out["rejected"] if (r["instance_type"], r["zone"]) == (P3, "za")]
    assert why["kind"] == "now" and why["reason"].startswith(
        f"interruption notice in za at {noticed:%H:%M:%S}: no spot launch there for 720 s")


@pytest.mark.parametrize("text", [
    "interruption notice in us-east-1a at 10:00:42: no spot launch there for 720 s "
    "(until 10:12:42)",
    "interruption notice in za at 10:00:42: no spot launch there for 720 s (until 10:12:42); "
    "interruption notice in zb at 10:03:00: no spot launch there for 720 s (until 10:15:00)",
    "every spot pool that can take the job had an interruption notice in the last 720 s "
    "(3 pool(s)); the first opens at 10:12:42"])
def test_the_waiting_kind_of_a_quarantine_is_its_own(text: str):
    # One kind whatever the pools and times: a new notice records no new `waiting` event.
    assert reason_kind(text) == NOTICE_QUARANTINE
