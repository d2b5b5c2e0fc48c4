"""Multi-node agents with real torchrun (2 nodes x 1 gloo process on 127.0.0.1), no daemon:
the test writes nodes.json as the daemon would and kills instances as a reclaim does."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable, Iterator

import pytest

from spotrun import layout
from spotrun.checkpoints import checkpoint_name, read_manifest
from spotrun.store import open_store

from multinode_helpers import Cluster, free_port
from multinode_reference import UninterruptedRun
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
def uninterrupted(tmp_path_factory) -> Iterator[Callable[[], str]]:
    """Final weights of an uninterrupted run of the job on two ranks (one for the session),
    started at once beside the first test that asks; the call waits for them."""
    run = UninterruptedRun(tmp_path_factory, f"--steps {STEPS}")
    yield run.sha
    run.close()


def _held(c: Cluster) -> bool:
    return all((c.root / "hold" / f"held-{r}").exists() for r in (0, 1))


def _endpoint(c: Cluster) -> str:
    """The endpoint of the newest nodes.json."""
    return json.loads((c.store_dir / layout.nodes_key(c.job_id, 1)).read_text())["rdzv_endpoint"]


def _resumed_at(out: str) -> list[int]:
    """The steps the node's workers started from, in order."""
    return [int(m) for m in re.findall(r"start step (\d+)", out)]


def _lose(c: Cluster, ranks: dict[int, str], lost_rank: int, new: str, release: str) -> None:
    """Node `lost_rank` vanishes while every rank holds (released by the file `release`); the
    instance `new` replaces it in `ranks`."""
    c.kill(ranks[lost_rank])
    (c.root / "hold" / release).write_text("")
    # The daemon's two writes: the loss (the host's loss moves the rendezvous to the
    # survivor, on a new port), then the replacement once it is launched.
    host_rank = 1 if lost_rank == 0 else 0
    endpoint = f"127.0.0.1:{free_port()}" if lost_rank == 0 else _endpoint(c)
    survivors = {r: i for r, i in ranks.items() if r != lost_rank}
    c.write_nodes(survivors, endpoint=endpoint, host_rank=host_rank)
    c.start(new)
    ranks[lost_rank] = new
    c.write_nodes(ranks, endpoint=endpoint, host_rank=host_rank)


def test_lost_nodes_are_replaced_the_survivor_keeping_its_torchrun_unless_the_host_is_lost(
        clusters, uninterrupted):
    """Node 1 is lost at the first hold: the survivor keeps its agent and torchrun. Then node 0,
    the rendezvous host, at the second: the rendezvous moves and the survivor restarts its
    command. One job for both (each loss is a node start fewer than a job of its own)."""
    second = HOLD_AT + 6   # why: past the first resume's periodic save (every 5 steps)
    c = clusters("losses", args=f"--hold-at {HOLD_AT} --hold-also {second} "
                                "--hold-dir {root}/hold")
    (c.root / "hold").mkdir()
    ranks = {0: "i-0a", 1: "i-0b"}
    c.start("i-0a")
    c.start("i-0b")
    c.write_nodes(ranks, endpoint=f"127.0.0.1:{free_port()}", host_rank=0)
    wait_for(lambda: _held(c), 120, "both ranks to reach the hold")
    survivor_pid = c.agents["i-0a"].pid
    _lose(c, ranks, 1, "i-0c", "release")
    # Node 0 and the replacement train on together in a world of 2, to the second hold.
    wait_for(lambda: _held_in(c, second, 0) == "2" and _held_in(c, second, 1) == "2", 120,
             "both ranks, with the replacement, at the second hold")
    # torchrun re-ran the rendezvous itself: the survivor's agent never restarted its command.
    assert c.agents["i-0a"].poll() is None and c.agents["i-0a"].pid == survivor_pid
    assert c.report(layout.node_heartbeat_key, "i-0a")["command_restarts"] == 0
    assert c.report(layout.node_exit_key, "i-0b") is None
    # The survivor's torchrun restarted its worker; both nodes resumed from the checkpoint
    # rank 0 found (the periodic saves of a loaded box may be deferred, so not always step 10).
    starts = wait_for(lambda: len(s := _resumed_at(c.output("i-0a"))) >= 2 and s, 30,
                      "the survivor's log of its restarted worker")
    assert starts[0] == 0 and 0 < starts[-1] <= HOLD_AT, c.output("i-0a")[-3000:]
    wait_for(lambda: _resumed_at(c.output("i-0c")), 30, "the replacement's log")
    assert _resumed_at(c.output("i-0c"))[-1] == starts[-1], c.output("i-0c")[-3000:]

    survivor_pid = c.agents["i-0c"].pid
    _lose(c, ranks, 0, "i-0d", f"release-{second}")
    for iid in ("i-0c", "i-0d"):
        body = c.wait_exit(iid)
        assert body["reason"] == "completed" and body["exit_code"] == 0, c.stderr(iid)
    # The rendezvous moved: the survivor's agent restarted its command, once.
    assert c.agents["i-0c"].pid == survivor_pid and c.agents["i-0c"].returncode == 0
    assert c.report(layout.node_exit_key, "i-0c")["command_restarts"] == 1
    assert c.report(layout.node_exit_key, "i-0a") is None
    later = _resumed_at(c.output("i-0c"))
    assert starts[-1] < later[-1] <= second, c.output("i-0c")[-3000:]
    assert _resumed_at(c.output("i-0d"))[-1] == later[-1]
    assert c.final_sha() == uninterrupted()


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


def test_a_notice_on_one_node_checkpoints_every_rank_of_the_job_at_one_step(clusters,
                                                                          uninterrupted):
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
        beat = c.report(layout.node_heartbeat_key, iid)
        assert beat and beat["instance_id"] == c.iid(iid) and beat["node_rank"] in (0, 1)
    assert not (c.store_dir / layout.exit_key(c.job_id, 1)).exists()   # per node only
    assert "start step 0" in c.output("i-0a") and "start step 0" in c.output("i-0b")
    # Node 1's agent saw the save in its own node's progress file: every rank saved step 13.
    notice = c.report(layout.node_notice_key, "i-0b")
    assert notice["emergency_checkpoint_step"] == HOLD_AT + 1, notice
    assert c.report(layout.node_notice_key, "i-0a") is None
    store = open_store(c.ckpt_uri)
    assert read_manifest(store, checkpoint_name(HOLD_AT + 1)).step == HOLD_AT + 1
    assert c.final_sha() == uninterrupted()
