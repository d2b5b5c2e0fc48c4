"""The agent's multi-node mode with a torch-free command: membership, env, restarts, removal."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from spotrun import layout
from spotrun.agent.config import AgentConfig
from spotrun.agent.nodes import Membership, is_multi_node, node_env, rdzv_change_wait_s
from spotrun.bundle import make_bundle
from spotrun.providers.local.market import imds as imds_mod
from spotrun.store import open_store

import agent_helpers
from polling import wait_for

NODES = {"version": 3, "nnodes": 2, "nnodes_min": 1, "rdzv_id": "job-1",
         "rdzv_endpoint": "127.0.0.1:41234", "rdzv_host_rank": 0,
         "nodes": [{"rank": 0, "instance_id": "i-0a", "host": "127.0.0.1"},
                   {"rank": 1, "instance_id": "i-0b", "host": "127.0.0.1"}]}


def test_membership_gives_rank_nnodes_and_the_host_flag():
    m = Membership.parse(NODES)
    assert m is not None and m.rank_of("i-0b") == 1 and m.rank_of("i-0z") is None
    assert m.nnodes_text() == "1:2"          # torchrun's elastic syntax
    env = node_env(m, "i-0b", {})
    assert env["SPOTRUN_NNODES"] == "1:2" and env["SPOTRUN_NODE_RANK"] == "1"
    assert env["SPOTRUN_RDZV_ENDPOINT"] == "127.0.0.1:41234" and env["SPOTRUN_RDZV_ID"] == "job-1"
    assert env["PET_RDZV_CONF"] == "is_host=0" and env["SPOTRUN_RDZV_IS_HOST"] == "0"
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1" and env["PET_MAX_RESTARTS"] == "100"
    assert node_env(m, "i-0a", {})["PET_RDZV_CONF"] == "is_host=1"


def test_the_users_torchrun_settings_win_and_is_host_joins_their_rendezvous_config():
    m = Membership.parse(NODES)
    assert m is not None
    env = node_env(m, "i-0a", {"PET_MAX_RESTARTS": "3", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0",
                               "PET_RDZV_CONF": "join_timeout=60"})
    assert env["PET_MAX_RESTARTS"] == "3" and env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "0"
    assert env["PET_RDZV_CONF"] == "join_timeout=60,is_host=1"
    mine = node_env(m, "i-0a", {"PET_RDZV_CONF": "is_host=0,join_timeout=60"})
    assert mine["PET_RDZV_CONF"] == "is_host=0,join_timeout=60"


@pytest.mark.parametrize("raw", [None, {}, {"nnodes": 2}, {**NODES, "nodes": [{"rank": "x"}]}])
def test_a_malformed_membership_is_none(raw):
    assert Membership.parse(raw) is None


def test_single_node_configs_are_not_multi_node():
    base = dict(job_id="j", attempt=1, store_uri="file:///x", checkpoint_uri="file:///y",
                command="true")
    assert not is_multi_node(AgentConfig(**base))
    assert is_multi_node(AgentConfig(**base, nodes=2))
    assert is_multi_node(AgentConfig(**base, nodes=2, nodes_min=1))
    assert rdzv_change_wait_s(AgentConfig(**base)) >= 30.0
    assert AgentConfig.from_json(AgentConfig(**base, nodes=4, nodes_min=2).to_json()).nodes_min == 2


# ------------------------------------------------------------------ real agent processes

@pytest.fixture
def node(tmp_path: Path):
    """One multi-node agent (instance i-0a, its own IMDS) on a file:// store; cleaned up."""
    store_dir = tmp_path / "store"
    work = tmp_path / "code"
    work.mkdir()
    (work / "train.py").write_text(agent_helpers.WORKLOAD)
    make_bundle(work, tmp_path / "b.tar.gz")
    store = open_store(store_dir.as_uri())
    store.put_file(layout.bundle_key("job-test"), tmp_path / "b.tar.gz")
    server = imds_mod.ImdsServer("i-0a").start()
    procs = []

    def write(version: int, endpoint: str, ids: tuple[str, ...] = ("i-0a", "i-0b"),
              nnodes_min: int = 1) -> None:
        body = {**NODES, "version": version, "rdzv_id": "job-test", "rdzv_endpoint": endpoint,
                "nnodes_min": nnodes_min,
                "nodes": [{"rank": r, "instance_id": i, "host": "127.0.0.1"}
                          for r, i in enumerate(ids)]}
        store.put_bytes(layout.nodes_key("job-test", 1), json.dumps(body).encode())

    def start(agent_env: dict[str, str] | None = None, **overrides):
        cfg = agent_helpers.make_config(store_dir, "http://127.0.0.1:9", nodes=2, **overrides)
        proc, stderr = agent_helpers.start_agent(tmp_path, cfg, env={
            "SPOTRUN_IMDS_ENDPOINT": server.url, **(agent_env or {})})
        procs.append(proc)
        return proc

    def report(kind: str) -> dict | None:
        fn = {"heartbeat": layout.node_heartbeat_key, "exit": layout.node_exit_key,
              "notice": layout.node_notice_key}[kind]
        return agent_helpers.read_json(store_dir / fn("job-test", 1, "i-0a"))

    def output() -> str:
        prefix = store_dir / layout.node_log_prefix("job-test", 1, "i-0a")
        return "".join(p.read_text() for p in sorted(prefix.glob("*.log")))

    yield SimpleNamespace(write=write, start=start, report=report, output=output, imds=server)
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    server.stop()


def _envs(out: str) -> list[dict]:
    return [json.loads(line[4:]) for line in out.splitlines() if line.startswith("ENV ")]


def test_an_agent_waits_for_its_listing_then_gets_the_node_env(node):
    proc = node.start(total_steps=5)
    wait_for(lambda: (node.report("heartbeat") or {}).get("phase") == "waiting", 30,
             "the agent to wait for nodes.json")
    node.write(1, "127.0.0.1:41001")
    assert proc.wait(timeout=60) == 0
    done = node.report("exit")
    assert done["reason"] == "completed" and done["node_rank"] == 0, done
    (env,) = _envs(node.output())
    assert env["SPOTRUN_NODE_RANK"] == "0" and env["SPOTRUN_NNODES"] == "1:2"
    assert env["SPOTRUN_RDZV_ENDPOINT"] == "127.0.0.1:41001" and env["SPOTRUN_INSTANCE_ID"] == "i-0a"


def test_an_endpoint_change_restarts_the_command_not_the_agent(node):
    node.write(1, "127.0.0.1:41001")
    proc = node.start(total_steps=100000, env={"WORKLOAD_STEP_S": "0.01"}, stop_grace_s=2.0)
    wait_for(lambda: _envs(node.output()), 60, "the first start")
    node.write(2, "127.0.0.1:41002")   # the host was lost: the rendezvous moved
    wait_for(lambda: len(_envs(node.output())) == 2, 60, "the restart")
    assert proc.poll() is None
    assert [e["SPOTRUN_RDZV_ENDPOINT"] for e in _envs(node.output())] == \
        ["127.0.0.1:41001", "127.0.0.1:41002"]
    wait_for(lambda: (node.report("heartbeat") or {}).get("command_restarts") == 1, 30, "a beat")
    node.write(3, "127.0.0.1:41002", ids=("i-0b",))   # removed from the job: stop
    proc.wait(timeout=60)
    assert node.report("exit")["reason"] == "removed"


def test_a_failed_command_waits_for_a_rewrite_of_the_membership(node):
    node.write(1, "127.0.0.1:41001")
    cmd = (f'[ "$SPOTRUN_RDZV_ENDPOINT" = 127.0.0.1:41002 ] && exit 0; '
           f'{sys.executable} -c "import sys; sys.exit(3)"')
    proc = node.start(command=cmd)
    wait_for(lambda: (node.report("heartbeat") or {}).get("phase") == "waiting", 60,
             "the failed command to wait for the daemon")
    assert node.report("exit") is None
    node.write(2, "127.0.0.1:41002")
    assert proc.wait(timeout=60) == 0
    done = node.report("exit")
    assert done["reason"] == "completed" and done["command_restarts"] == 1, done


def test_the_worked_example_runs_the_documented_command_on_the_tested_script():
    import yaml
    repo = Path(__file__).resolve().parents[1]
    path = repo / "configs" / "jobs" / "multinode-gloo.yaml"
    spec = yaml.safe_load(path.read_text())
    from multinode_helpers import JOB_SCRIPT, TORCHRUN
    assert spec["command"].startswith(TORCHRUN.replace(" train.py", " multinode_gloo.py"))
    assert (path.parent / spec["workdir"] / "multinode_gloo.py").resolve() == JOB_SCRIPT.resolve()
    assert spec["resources"]["nodes"] == 2 and spec["outputs"] == ["final-params.sha256"]
    assert "## Multi-node" in (repo / "docs" / "job-spec.md").read_text()


def test_a_notice_is_reported_per_node_and_reaches_the_command_as_a_file(node, tmp_path):
    node.write(1, "127.0.0.1:41001")
    proc = node.start(total_steps=100000, env={"WORKLOAD_STEP_S": "0.01"})
    wait_for(lambda: _envs(node.output()), 60, "the command to start")
    node.imds.arm_notice()
    notice = wait_for(lambda: node.report("notice"), 30, "the per-node notice report")
    assert notice["action"] == "terminate"
    body = wait_for(lambda: agent_helpers.read_json(
        tmp_path / "agent-instance" / "spotrun-agent" / "notice.json"), 30, "the notice file")
    assert body["action"] == "terminate"
    assert not (tmp_path / "store" / layout.notice_key("job-test", 1)).exists()
    proc.terminate()
    proc.wait(timeout=60)
    assert node.report("exit")["reason"] == "signal"


def test_checkpoint_and_stop_also_asks_through_the_notice_file(node, tmp_path):
    node.write(1, "127.0.0.1:41001")
    proc = node.start(total_steps=100000, env={"WORKLOAD_STEP_S": "0.01"}, stop_grace_s=2.0)
    wait_for(lambda: _envs(node.output()), 60, "the command to start")
    store = open_store((tmp_path / "store").as_uri())
    store.put_bytes(layout.control_key("job-test"), json.dumps(
        {"checkpoint_and_stop": True, "reason": "budget", "attempts": [1]}).encode())
    proc.wait(timeout=60)
    assert node.report("exit")["reason"] == "budget"
    body = agent_helpers.read_json(tmp_path / "agent-instance" / "spotrun-agent" / "notice.json")
    assert body is not None and body["action"] == "stop"   # torchrun's workers read this


def _failing_until(endpoint: str) -> str:
    return (f'[ "$SPOTRUN_RDZV_ENDPOINT" = {endpoint} ] && exit 0; '
            f'{sys.executable} -c "import sys; sys.exit(3)"')


def test_a_failed_command_gives_up_after_the_wait_when_no_rewrite_comes(node):
    node.write(1, "127.0.0.1:41001")
    proc = node.start(command=_failing_until("127.0.0.1:41002"),
                      agent_env={"SPOTRUN_RDZV_CHANGE_WAIT_S": "0.5"})
    assert proc.wait(timeout=60) == 3
    assert node.report("exit")["reason"] == "error"


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_a_failed_command_keeps_waiting_while_nodes_are_missing(node):
    # Only this node is listed, of a minimum of two (the other's replacement is pending):
    # the wait goes on past SPOTRUN_RDZV_CHANGE_WAIT_S until the listing is whole again.
    node.write(1, "127.0.0.1:41001", ids=("i-0a",), nnodes_min=2)
    proc = node.start(command=_failing_until("127.0.0.1:41002"),
                      agent_env={"SPOTRUN_RDZV_CHANGE_WAIT_S": "0.5"})
    first = wait_for(lambda: (node.report("heartbeat") or {}).get("phase") == "waiting"
                     and node.report("heartbeat")["ts"], 60, "the wait")
    wait_for(lambda: _ts(node.report("heartbeat")["ts"]) - _ts(first) > 2.0, 60,
             "the agent to wait well past its 0.5 s")
    assert proc.poll() is None and node.report("exit") is None
    node.write(2, "127.0.0.1:41002", nnodes_min=2)   # the replacement is listed, the host moved
    assert proc.wait(timeout=60) == 0
    done = node.report("exit")
    assert done["reason"] == "completed" and done["command_restarts"] == 1, done
