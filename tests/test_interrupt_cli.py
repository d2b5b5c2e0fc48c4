"""`spotrun interrupt`: a reclaim sent on purpose through the provider reaches the job's
instance(s); the daemon replaces the interrupted node alone. Bad input: one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from daemon_nodes_helpers import beating, listed, node_rig, state, ticked
from polling import wait_for

from spotrun.cli import cli
from spotrun.states import EndReason, NodeState

pytestmark = pytest.mark.slow


def _cli(home: Path, *args: str):
    return CliRunner().invoke(cli, list(args), env={"SPOTRUN_HOME": str(home)})


def test_interrupt_one_node_then_bad_input(tmp_home: Path, tmp_path: Path) -> None:
    with node_rig(tmp_home, tmp_path, "2") as (ctx, runner, job_id):
        first = wait_for(lambda: ticked(runner, lambda: len(m := listed(ctx, job_id, 1)) == 2
                                        and all(beating(ctx, job_id, 1, i) for i in m.values())
                                        and m), 60, "2 nodes", interval_s=0.1)
        res = _cli(tmp_home, "interrupt", job_id, "--node", "1", "--notice-s", "30", "--json")
        assert res.exit_code == 0, res.output
        out = json.loads(res.output)
        assert [(i["node_rank"], i["instance_id"]) for i in out["instances"]] == [(1, first[1])]
        assert out["instances"][0]["already_noticed"] is False
        [seen] = ctx.provider.describe(instance_ids=[first[1]])
        assert seen.notice_at is not None          # notice first, the reclaim after it
        wait_for(lambda: ticked(runner, lambda: (m := listed(ctx, job_id, 1)).get(1)
                                not in (None, first[1]) and m[0] == first[0]), 60,
                 "node 1 replaced", interval_s=0.1)
        _, [att], nodes = state(ctx, job_id)
        lost = [n for n in nodes[att.id] if n.state is NodeState.ENDED]
        assert [(n.node_rank, n.end_reason) for n in lost] == [(1, EndReason.RECLAIMED)]

        res = _cli(tmp_home, "status", job_id, "--wide")
        assert res.exit_code == 0 and "2 nodes:" in res.output, res.output
        res = _cli(tmp_home, "status", job_id, "--json")
        view = json.loads(res.output)
        assert first[0] in view["instance_ids"] and first[1] in view["instance_ids"]
        assert len(view["instance_ids"]) == 3 and len(view["attempts"][0]["nodes"]) == 3

        for args, field in ((("nope-123",), "job"), ((job_id, "--node", "7"), "--node"),
                            ((job_id, "--notice-s", "-1"), "--notice-s")):
            res = _cli(tmp_home, "interrupt", *args)
            assert res.exit_code == 2, res.output
            assert field in res.output and len(res.output.strip().splitlines()) == 1
            assert "Traceback" not in res.output
