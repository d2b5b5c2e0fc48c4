"""A multi-node attempt in the ledger and the audit: every instance booked on its own (its own
minimum and free-reclaim rule), per-node audit lines, and `node_replacement` = the survivors'
paid time from a node's loss until its replacement runs (hand-worked)."""

from __future__ import annotations

import pytest
from sqlmodel import select

from spotrun.audit import audit_jobs
from spotrun.catalog import catalog_od_price
from spotrun.daemon.spend import SpendLoop
from spotrun.db import Attempt, AttemptNode, SpendEntry, session
from spotrun.providers.billing_rules import SpendKind
from spotrun.states import AttemptState, EndReason, JobState, Market, NodeState

from test_ledger_support import P3, ZONE, PriceFeed, at, make_job, new_db

OD = catalog_od_price("us-east-1")


def _node(eng, att: Attempt, rank: int, iid: str, start, end, reason, *, running=None,
          replaces: int | None = None) -> AttemptNode:
    n = AttemptNode(attempt_id=att.id, job_id=att.job_id, node_rank=rank, client_token=iid,
                    instance_id=iid, market=Market.SPOT, instance_type=P3, zone=ZONE,
                    price_usd_per_hour=0.9, launched_at=start, ended_at=end, end_reason=reason,
                    running_at=running, replaces=replaces, state=NodeState.ENDED,
                    cause="spot-reclaim" if reason is EndReason.RECLAIMED else "user")
    with session(eng) as s:
        s.add(n)
        s.commit()
        s.refresh(n)
    return n


def test_nodes_are_booked_one_by_one_and_the_replacement_wait_is_its_own_cause(tmp_path):
    eng = new_db(tmp_path)
    make_job(eng, state=JobState.SUCCEEDED, work={"total_steps": 1000}, last_step=1000)
    att = Attempt(job_id="job-1", number=1, market=Market.SPOT, instance_type=P3, zone=ZONE,
                  price_usd_per_hour=0.9, client_token="job-1-1", nodes=2,
                  started_at=at(0), ended_at=at(120), end_reason=EndReason.COMPLETED,
                  state=AttemptState.ENDED, last_step=1000, running_at=at(5))
    with session(eng) as s:
        s.add(att)
        s.commit()
        s.refresh(att)
    # Rank 0 runs 2 h; rank 1 is reclaimed at 60 min (charged: after its first hour); its
    # replacement launches at 70, joins at 80 and runs to 120.
    _node(eng, att, 0, "i-0", at(0), at(120), EndReason.COMPLETED)
    lost = _node(eng, att, 1, "i-1", at(0), at(60), EndReason.RECLAIMED)
    _node(eng, att, 1, "i-1b", at(70), at(120), EndReason.COMPLETED, running=at(80),
          replaces=lost.id)
    feed = PriceFeed()
    feed.set_prices(P3, ZONE, [(at(-60), 0.9)])
    feed.clock = at(121)
    SpendLoop(eng, feed, storage_interval_s=1e9).tick(at(121))
    with session(eng) as s:
        rows = list(s.exec(select(SpendEntry).where(
            SpendEntry.job_id == "job-1", SpendEntry.kind.in_(SpendKind.instance_kinds()))))
    by_iid = {}
    for r in rows:
        by_iid[r.instance_id] = by_iid.get(r.instance_id, 0.0) + r.usd
        assert r.attempt_id == att.id
    assert by_iid == pytest.approx({"i-0": 1.8, "i-1": 0.9, "i-1b": 0.75})
    with session(eng) as s:
        [ja] = audit_jobs(s, ["job-1"], od_price=OD)
    assert ja.actual_usd == pytest.approx(3.45)
    assert ja.causes_total_usd() == pytest.approx(3.45, abs=1e-9)
    # Survivor rank 0 paid from the loss (60) to the replacement joining (80): 20 min of the
    # attempt's 230 node-minutes.
    repl = ja.causes["node_replacement"]
    assert repl.hours == pytest.approx(20 / 60)
    assert repl.usd == pytest.approx(3.45 * 20 / 230)
    assert ja.waste["node_replacement"].usd == pytest.approx(repl.usd)
    assert ja.preemptions == 1
    [aa] = ja.attempts
    assert sum(w.usd for w in aa.causes.values()) == pytest.approx(aa.instance_usd)
    assert [(n["node_rank"], n["instance_id"], n["end_reason"]) for n in aa.nodes] == [
        (0, "i-0", "completed"), (1, "i-1", "reclaimed"), (1, "i-1b", "completed")]
    assert [round(n["usd"], 6) for n in aa.nodes] == [1.8, 0.9, 0.75]
    assert aa.to_dict()["nodes"][2]["used_s"] == pytest.approx(50 * 60)


def test_a_node_reclaimed_in_its_first_hour_is_free_on_its_own(tmp_path):
    eng = new_db(tmp_path)
    make_job(eng, state=JobState.RUNNING)
    att = Attempt(job_id="job-1", number=1, market=Market.SPOT, instance_type=P3, zone=ZONE,
                  price_usd_per_hour=0.9, client_token="job-1-1", nodes=2, started_at=at(0),
                  state=AttemptState.RUNNING)
    with session(eng) as s:
        s.add(att)
        s.commit()
        s.refresh(att)
    _node(eng, att, 0, "i-0", at(0), at(90), EndReason.COMPLETED)
    _node(eng, att, 1, "i-1", at(0), at(10), EndReason.RECLAIMED)
    feed = PriceFeed()
    feed.set_prices(P3, ZONE, [(at(-60), 0.9)])
    feed.clock = at(91)
    SpendLoop(eng, feed, storage_interval_s=1e9).tick(at(91))
    with session(eng) as s:
        rows = list(s.exec(select(SpendEntry).where(SpendEntry.job_id == "job-1")))
    total = {}
    for r in rows:
        total[r.instance_id] = total.get(r.instance_id, 0.0) + r.usd
    assert total["i-0"] == pytest.approx(1.35) and total["i-1"] == pytest.approx(0.0, abs=1e-12)
