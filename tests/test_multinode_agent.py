"""Multi-node agents with real torchrun (2 nodes x 1 gloo process on 127.0.0.1), no daemon:
the test writes nodes.json as the daemon would and kills instances as a reclaim does."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from spotrun import layout
from spotrun.checkpoints import checkpoint_name, read_manifest
from spotrun.store import open_store

from multinode_helpers import Cluster, free_port
from polling import wait_for

pytestmark = pytest.mark.slow

STEPS = 24
HOLD_AT = 12   # every rank waits at step 12 (its last checkpoint whole) until released


@pytest.fixture
def clusters(tmp_path: Path):
    """Make Clusters; every process they started is killed at the end."""
    made: list[Cluster] = []

    def make(name: str, **kw) -> Cluster:
        c = Cluster(tmp_path / name, f"job-{name}", steps=STEPS, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> str:
    """Final weights of an uninterrupted 2-node run through two agents."""
    c = Cluster(tmp_path_factory.mktemp("mn") / "base", "job-base", steps=STEPS)
    try:
        c.start("i-0a")
        c.start("i-0b")
        c.write_nodes({0: "i-0a", 1: "i-0b"}, endpoint=f"127.0.0.1:{free_port()}", host_rank=0)
        for iid in ("i-0a", "i-0b"):
            assert c.wait_exit(iid)["reason"] == "completed", c.stderr(iid)
            beat = c.report(layout.node_heartbeat_key, iid)
            assert beat and beat["instance_id"] == iid and beat["node_rank"] in (0, 1)
        assert not (c.store_dir / layout.exit_key(c.job_id, 1)).exists()   # per node only
        assert "start step 0" in c.output("i-0a") and "start step 0" in c.output("i-0b")
        return c.final_sha()
    finally:
        c.close()


def _held(c: Cluster) -> bool:
    return all((c.root / "hold" / f"held-{r}").exists() for r in (0, 1))


def _endpoint(c: Cluster) -> str:
    """The endpoint of the newest nodes.json."""
    return json.loads((c.store_dir / layout.nodes_key(c.job_id, 1)).read_text())["rdzv_endpoint"]


def _run_with_a_loss(make, lost_rank: int) -> tuple[Cluster, str]:
    """Two nodes train to HOLD_AT; node `lost_rank` vanishes; a third instance replaces it."""
    c = make(f"loss{lost_rank}", args=f"--hold-at {HOLD_AT} --hold-dir {{root}}/hold")
    (c.root / "hold").mkdir()
    ranks = {0: "i-0a", 1: "i-0b"}
    c.start("i-0a")
    c.start("i-0b")
    c.write_nodes(ranks, endpoint=f"127.0.0.1:{free_port()}", host_rank=0)
    wait_for(lambda: _held(c), 120, "both ranks to reach the hold")
    lost, survivor = ranks.pop(lost_rank), ranks[1 - lost_rank]
    survivor_pid = c.agents[survivor].pid
    c.kill(lost)
    (c.root / "hold" / "release").write_text("")
    # The daemon's two writes: the loss (the host's loss moves the rendezvous to the
    # survivor, on a new port), then the replacement once it is launched.
    host_rank = 1 - lost_rank if lost_rank == 0 else 0
    endpoint = f"127.0.0.1:{free_port()}" if lost_rank == 0 else _endpoint(c)
    c.write_nodes(ranks, endpoint=endpoint, host_rank=host_rank)
    c.start("i-0c")
    c.write_nodes({**ranks, lost_rank: "i-0c"}, endpoint=endpoint, host_rank=host_rank)
    for iid in (survivor, "i-0c"):
        body = c.wait_exit(iid)
        assert body["reason"] == "completed" and body["exit_code"] == 0, c.stderr(iid)
    assert c.agents[survivor].pid == survivor_pid and c.agents[survivor].returncode == 0
    assert c.report(layout.node_exit_key, lost) is None
    return c, survivor


def _resumed_at(out: str) -> list[int]:
    """The steps the node's workers started from, in order."""
    return [int(m) for m in re.findall(r"start step (\d+)", out)]


def test_a_lost_node_is_replaced_and_the_survivor_keeps_its_agent_and_torchrun(clusters,
                                                                              baseline):
    c, survivor = _run_with_a_loss(clusters, lost_rank=1)
    # torchrun re-ran the rendezvous itself: the survivor's agent never restarted its command.
    assert c.report(layout.node_exit_key, survivor)["command_restarts"] == 0
    # The survivor's torchrun restarted its worker; both nodes resumed from the checkpoint
    # rank 0 found (the periodic saves of a loaded box may be deferred, so not always step 10).
    starts = _resumed_at(c.output(survivor))
    assert starts[0] == 0 and 0 < starts[-1] <= HOLD_AT, c.output(survivor)[-3000:]
    assert _resumed_at(c.output("i-0c"))[-1] == starts[-1]
    assert c.final_sha() == baseline


def test_a_lost_rendezvous_host_moves_the_rendezvous_and_the_survivor_restarts_its_command(
        clusters, baseline):
    c, survivor = _run_with_a_loss(clusters, lost_rank=0)
    assert c.report(layout.node_exit_key, survivor)["command_restarts"] == 1
    starts = _resumed_at(c.output(survivor))
    assert starts[0] == 0 and 0 < starts[-1] <= HOLD_AT, c.output(survivor)[-3000:]
    assert _resumed_at(c.output("i-0c"))[-1] == starts[-1]
    assert c.final_sha() == baseline


def _held_in(c: Cluster, step: int, rank: int) -> str | None:
    """The world size rank `rank` saw while held at `step`, or None."""
    try:
        return (c.root / "hold" / f"held-{step}-{rank}").read_text().strip()
    except OSError:
        return None


def test_an_elastic_job_trains_on_the_survivor_alone_and_grows_back_when_the_replacement_comes(
        clusters):
    alone_at = 18
    c = clusters("elastic", nodes_min=1,
                 args=f"--hold-at {HOLD_AT} --hold-also {alone_at} --hold-dir {{root}}/hold")
    (c.root / "hold").mkdir()
    c.start("i-0a")
    c.start("i-0b")
    endpoint = f"127.0.0.1:{free_port()}"
    c.write_nodes({0: "i-0a", 1: "i-0b"}, endpoint=endpoint, host_rank=0)
    wait_for(lambda: _held(c), 120, "both ranks to reach the hold")
    survivor_pid = c.agents["i-0a"].pid
    c.kill("i-0b")
    c.write_nodes({0: "i-0a"}, endpoint=endpoint, host_rank=0)   # the replacement is pending
    (c.root / "hold" / "release").write_text("")
    wait_for(lambda: _held_in(c, alone_at, 0) == "1", 120, "the survivor to train on alone")
    c.start("i-0c")
    c.write_nodes({0: "i-0a", 1: "i-0c"}, endpoint=endpoint, host_rank=0)
    wait_for(lambda: _held_in(c, alone_at, 0) == "2" and _held_in(c, alone_at, 1) == "2", 120,
             "the job to grow back to two nodes")
    (c.root / "hold" / f"release-{alone_at}").write_text("")
    for iid in ("i-0a", "i-0c"):
        body = c.wait_exit(iid)
        assert body["reason"] == "completed" and body["exit_code"] == 0, c.stderr(iid)
    assert c.agents["i-0a"].pid == survivor_pid and body["command_restarts"] == 0
    assert c.report(layout.node_exit_key, "i-0a")["command_restarts"] == 0
    worlds = re.findall(r"rank \d+/(\d+) node", c.output("i-0a"))
    assert worlds[0] == "2" and "1" in worlds and worlds[-1] == "2", worlds


def test_a_notice_on_one_node_checkpoints_every_rank_of_the_job_at_one_step(clusters, baseline):
    c = clusters("notice", args=f"--hold-at {HOLD_AT} --hold-dir {{root}}/hold",
                 checkpoint_keep=10)
    (c.root / "hold").mkdir()
    c.start("i-0a")
    c.start("i-0b")
    c.write_nodes({0: "i-0a", 1: "i-0b"}, endpoint=f"127.0.0.1:{free_port()}", host_rank=0)
    wait_for(lambda: _held(c), 120, "both ranks to reach the hold")
    c.imds["i-0b"].arm_notice()            # the notice reaches node 1 only
    wait_for(lambda: c.report(layout.node_notice_key, "i-0b"), 30, "node 1's notice report")
    (c.root / "hold" / "release").write_text("")
    for iid in ("i-0a", "i-0b"):
        assert c.wait_exit(iid)["reason"] == "completed", c.stderr(iid)
    # Node 1's agent saw the save in its own node's progress file: every rank saved step 13.
    notice = c.report(layout.node_notice_key, "i-0b")
    assert notice["emergency_checkpoint_step"] == HOLD_AT + 1, notice
    assert c.report(layout.node_notice_key, "i-0a") is None
    store = open_store(c.ckpt_uri)
    assert read_manifest(store, checkpoint_name(HOLD_AT + 1)).step == HOLD_AT + 1
    assert c.final_sha() == baseline
