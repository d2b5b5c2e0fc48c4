"""Multi-node attempts on the daemon side: a group launch in one pool, nodes.json, a lost node
replaced alone (the rendezvous moving off a lost host), a refused replacement moving the whole
job, an elastic job carrying on, per-instance booking. Real market, processes, store, SQLite;
the instances run a node stand-in (daemon_nodes_helpers) instead of torchrun."""

from __future__ import annotations

from pathlib import Path

import pytest
from daemon_nodes_helpers import (beating, events, finish, listed, node_rig, nodes_doc, state,
                               ticked)
from polling import wait_for
from sqlmodel import select

from spotrun.db import SpendEntry, session
from spotrun.ui.views import status_view
from spotrun.states import AttemptState, EndReason, JobState, NodeState

pytestmark = pytest.mark.slow


def _all_beating(ctx, job_id: str, attempt: int, n: int) -> dict[int, str] | None:
    members = listed(ctx, job_id, attempt)
    if len(members) == n and all(beating(ctx, job_id, attempt, i) for i in members.values()):
        return members
    return None


def _run_until(runner, check, what: str, timeout_s: float = 60.0):
    return wait_for(lambda: ticked(runner, check), timeout_s, what, interval_s=0.1)


def test_lost_nodes_are_replaced_alone_and_the_rendezvous_moves(tmp_home: Path,
                                                                tmp_path: Path) -> None:
    with node_rig(tmp_home, tmp_path, "2") as (ctx, runner, job_id):
        first = _run_until(runner, lambda: _all_beating(ctx, job_id, 1, 2), "2 nodes beating")
        job, [att], nodes = state(ctx, job_id)
        assert att.state is AttemptState.RUNNING and att.instance_id is None and att.nodes == 2
        assert {(n.zone, n.instance_type) for n in nodes[att.id]} == {(att.zone, att.instance_type)}
        doc = nodes_doc(ctx, job_id, 1)
        assert doc["nnodes"] == 2 and doc["rdzv_id"] == job_id and doc["rdzv_host_rank"] == 0
        host0, port0 = doc["rdzv_endpoint"].split(":")
        assert host0 == "127.0.0.1" and int(port0) > 0

        # Node 1 reclaimed: one replacement for rank 1, node 0 untouched, host unchanged.
        ctx.provider.interrupt([first[1]], notice_s=0.0)
        second = _run_until(runner, lambda: (m := _all_beating(ctx, job_id, 1, 2))
                            and m[1] != first[1] and m, "node 1 replaced")
        assert second[0] == first[0]
        doc = nodes_doc(ctx, job_id, 1)
        assert doc["rdzv_host_rank"] == 0 and doc["rdzv_endpoint"] == f"{host0}:{port0}"
        assert doc["version"] >= 3      # listed, node 1 removed, its replacement added

        # Node 0 (the rendezvous host) reclaimed: the rendezvous moves to rank 1, a new port.
        ctx.provider.interrupt([second[0]], notice_s=0.0)
        moved = _run_until(runner, lambda: (d := nodes_doc(ctx, job_id, 1))
                           and d["rdzv_host_rank"] == 1 and d, "rendezvous moved")
        assert moved["rdzv_endpoint"] != f"{host0}:{port0}"
        third = _run_until(runner, lambda: (m := _all_beating(ctx, job_id, 1, 2))
                           and m[0] != second[0] and m, "node 0 replaced")
        assert third[1] == second[1]
        _, [att], nodes = state(ctx, job_id)
        assert att.state is AttemptState.RUNNING and len(nodes[att.id]) == 4
        lost = [n for n in nodes[att.id] if n.state is NodeState.ENDED]
        assert [n.end_reason for n in lost] == [EndReason.RECLAIMED, EndReason.RECLAIMED]

        before = nodes_doc(ctx, job_id, 1)
        finish(ctx, job_id)
        job = _run_until(runner, lambda: (j := state(ctx, job_id)[0]).state.is_terminal() and j,
                         "job done")
        assert job.state is JobState.SUCCEEDED
        # Nodes finishing one after the other never see the membership (or rendezvous) move.
        assert nodes_doc(ctx, job_id, 1) == before
        _, [att], nodes = state(ctx, job_id)
        assert att.end_reason is EndReason.COMPLETED
        assert len(events(ctx, job_id, "node_replaced")) == 2
        # Every instance booked on its own.
        ids = {n.instance_id for n in nodes[att.id]}
        _run_until(runner, lambda: _booked(ctx, job_id) >= ids, "every node booked")
        view = status_view(ctx.settings, job_id, engine=ctx.engine)
        [a1] = view["attempts"]
        assert sorted(view["instance_ids"]) == sorted(ids) and len(ids) == 4
        assert [(n["node_rank"], n["end_reason"]) for n in a1["nodes"]] == [
            (0, "reclaimed"), (0, "completed"), (1, "reclaimed"), (1, "completed")]
        assert all(n["zone"] == att.zone and n["launched_at"] and n["ended_at"]
                   for n in a1["nodes"])


def _booked(ctx, job_id: str) -> set[str]:
    with session(ctx.engine) as s:
        rows = s.exec(select(SpendEntry).where(SpendEntry.job_id == job_id,
                                               SpendEntry.kind == "compute"))
        return {r.instance_id for r in rows if r.billed_seconds > 0}


def test_refused_replacement_moves_the_whole_job(tmp_home: Path, tmp_path: Path) -> None:
    with node_rig(tmp_home, tmp_path, "2") as (ctx, runner, job_id):
        first = _run_until(runner, lambda: _all_beating(ctx, job_id, 1, 2), "2 nodes beating")
        ctx.provider.client.faults(capacity_fraction=1.0)
        ctx.provider.interrupt([first[1]], notice_s=0.0)
        _run_until(runner, lambda: state(ctx, job_id)[1][0].state is AttemptState.ENDED,
                   "attempt 1 ended")
        _, [att], nodes = state(ctx, job_id)
        assert att.end_reason is EndReason.MOVED and "no capacity" in att.detail
        assert all(n.state is NodeState.ENDED for n in nodes[att.id])   # survivor terminated
        assert events(ctx, job_id, "node_replacement_refused")
        ctx.provider.client.faults(capacity_fraction=0.0)
        again = _run_until(runner, lambda: _all_beating(ctx, job_id, 2, 2), "attempt 2 up")
        assert not set(again.values()) & set(first.values())


def test_elastic_job_runs_on_fewer_nodes_until_the_replacement_arrives(
        tmp_home: Path, tmp_path: Path) -> None:
    with node_rig(tmp_home, tmp_path, "1-2") as (ctx, runner, job_id):
        first = _run_until(runner, lambda: _all_beating(ctx, job_id, 1, 2), "2 nodes beating")
        assert nodes_doc(ctx, job_id, 1)["nnodes_min"] == 1
        ctx.provider.client.faults(capacity_fraction=1.0)
        ctx.provider.interrupt([first[1]], notice_s=0.0)
        _run_until(runner, lambda: events(ctx, job_id, "node_replacement_waiting"),
                   "replacement waiting")
        for _ in range(5):   # a few refused tries: still running on node 0 alone
            runner.run_once()
        job, [att], _ = state(ctx, job_id)
        assert att.state is AttemptState.RUNNING and job.state is JobState.RUNNING
        assert listed(ctx, job_id, 1) == {0: first[0]}
        assert ctx.provider.client.fault_counts()["refused"] >= 2
        ctx.provider.client.faults(capacity_fraction=0.0)
        back = _run_until(runner, lambda: _all_beating(ctx, job_id, 1, 2), "back to 2 nodes")
        assert back[0] == first[0] and back[1] != first[1]


def test_a_node_reclaimed_after_its_completed_report_counts_as_completed(tmp_home: Path,
                                                                         tmp_path: Path) -> None:
    from spotrun import layout
    with node_rig(tmp_home, tmp_path, "2") as (ctx, runner, job_id):
        first = _run_until(runner, lambda: _all_beating(ctx, job_id, 1, 2), "2 nodes beating")
        finish(ctx, job_id, linger=True)
        wait_for(lambda: all(ctx.store.exists(layout.node_exit_key(job_id, 1, i))
                             for i in first.values()), 30, "both exit reports")
        ctx.provider.interrupt(list(first.values()), notice_s=0.0)   # then reclaimed
        job = _run_until(runner, lambda: (j := state(ctx, job_id)[0]).state.is_terminal() and j,
                         "job done")
        assert job.state is JobState.SUCCEEDED
        _, [att], nodes = state(ctx, job_id)
        assert len(nodes[att.id]) == 2 and not events(ctx, job_id, "node_replaced")
        assert all(n.end_reason is EndReason.COMPLETED and "reclaimed" in n.detail
                   and n.cause == "spot-reclaim" for n in nodes[att.id])


def test_a_silent_node_is_terminated_as_lost_and_replaced(tmp_home: Path, tmp_path: Path) -> None:
    with node_rig(tmp_home, tmp_path, "2", hb_timeout_s=3.0) as (ctx, runner, job_id):
        first = _run_until(runner, lambda: _all_beating(ctx, job_id, 1, 2), "2 nodes beating")
        ctx.store.put_bytes(f"jobs/{job_id}/test-silent-{first[1]}", b"{}")
        again = _run_until(runner, lambda: (m := _all_beating(ctx, job_id, 1, 2))
                           and m[1] != first[1] and m, "silent node 1 replaced")
        assert again[0] == first[0]
        _, [att], nodes = state(ctx, job_id)
        [lost] = [n for n in nodes[att.id] if n.instance_id == first[1]]
        assert lost.end_reason is EndReason.LOST and "no heartbeat" in lost.detail
        [gone] = ctx.provider.describe(instance_ids=[first[1]])
        assert gone.state.is_terminal()     # terminated by the daemon, not left running


def test_a_notice_on_one_node_marks_the_attempt_then_a_cancel_ends_every_node(
        tmp_home: Path, tmp_path: Path) -> None:
    import json

    from spotrun import layout
    from spotrun.jobs import request_cancel
    with node_rig(tmp_home, tmp_path, "2") as (ctx, runner, job_id):
        first = _run_until(runner, lambda: _all_beating(ctx, job_id, 1, 2), "2 nodes beating")
        # What node 1's agent writes when its IMDS shows the interruption notice.
        ctx.store.put_bytes(layout.node_notice_key(job_id, 1, first[1]), json.dumps(
            {"action": "terminate", "time": "2026-01-01T00:02:00Z"}).encode())
        _run_until(runner, lambda: state(ctx, job_id)[1][0].notice_at is not None, "notice_at")
        _, [att], nodes = state(ctx, job_id)
        noticed = {n.instance_id: n.notice_at for n in nodes[att.id]}
        assert noticed[first[1]] is not None and noticed[first[0]] is None
        [ev] = events(ctx, job_id, "notice")
        assert "node 1" in ev.detail and "whole job" in ev.detail

        request_cancel(ctx.engine, job_id)
        job = _run_until(runner, lambda: (j := state(ctx, job_id)[0]).state.is_terminal() and j,
                         "job cancelled")
        assert job.state is JobState.CANCELLED
        _, [att], nodes = state(ctx, job_id)
        assert att.end_reason is EndReason.CANCELLED and len(nodes[att.id]) == 2
        assert all(n.end_reason is EndReason.CANCELLED for n in nodes[att.id])
        assert all(i.state.is_terminal() for i in ctx.provider.describe(job_id=job_id))
        assert not events(ctx, job_id, "node_replaced")


def test_a_budget_stop_terminates_every_node_after_the_grace(tmp_home: Path, tmp_path: Path,
                                                             monkeypatch) -> None:
    from spotrun.daemon import reconcile
    from spotrun.db import Job
    # The stand-ins ignore control.json, so the daemon waits out the whole stop grace
    # (SAVE_WINDOW_S, 20 s) before it terminates: any window proves that, 0.5 s as well as 20.
    monkeypatch.setattr(reconcile, "SAVE_WINDOW_S", 0.5)
    with node_rig(tmp_home, tmp_path, "2") as (ctx, runner, job_id):
        _run_until(runner, lambda: _all_beating(ctx, job_id, 1, 2), "2 nodes beating")
        with session(ctx.engine) as s:   # what the spend loop sets when the budget is near
            j = s.get(Job, job_id)
            j.budget_stop_requested = True
            s.add(j)
            s.commit()
        job = _run_until(runner, lambda: (j := state(ctx, job_id)[0]).state.is_terminal() and j,
                         "budget stop", timeout_s=90.0)
        assert job.state is JobState.BUDGET_EXHAUSTED
        _, [att], nodes = state(ctx, job_id)
        assert att.end_reason is EndReason.BUDGET
        assert all(n.state is NodeState.ENDED for n in nodes[att.id]) and len(nodes[att.id]) == 2
        assert all(i.state.is_terminal() for i in ctx.provider.describe(job_id=job_id))
