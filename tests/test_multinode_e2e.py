"""Issue 16's acceptance on the local provider, end to end: daemon + market + real agents +
real torchrun (2 nodes x 1 gloo process, tiny model, `python -m torch.distributed.run` with
the SPOTRUN_* env). A node is reclaimed on purpose through `spotrun interrupt` while every
rank holds: node 1 at step 12 (checkpoint 10, or a deferred later one, is in), then node 0
(the rendezvous host) at step 18 of the same run. Each time exactly one new instance is
launched, the other node keeps its instance, and the job succeeds with the same final weights
as an uninterrupted 2-node run. An elastic "1-2" job trains on one node while the market
refuses the replacement, then on two again."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

import pytest
from click.testing import CliRunner
from polling import wait_for

from spotrun import layout
from spotrun.cli import cli
from spotrun.config import load_settings
from spotrun.daemon.app import build_context, build_runner
from spotrun.db import Job, attempts_of, nodes_of, session
from spotrun.jobs import submit, validate_submission
from spotrun.states import EndReason, JobState

from load import BusyLoad
from conftest import kill_leftovers, write_trace

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]   # torch warms up on first use
JOB_SCRIPT = Path(__file__).parent / "torch_jobs" / "multinode_gloo.py"
STEPS, HOLD_AT = 24, 12
TORCHRUN = (f"{sys.executable} -m torch.distributed.run --nnodes=$SPOTRUN_NNODES "
            "--nproc-per-node=$SPOTRUN_GPUS --rdzv-backend=c10d "
            "--rdzv-endpoint=$SPOTRUN_RDZV_ENDPOINT --rdzv-id=$SPOTRUN_RDZV_ID train.py")
# Dead peers leave the rendezvous after 2 s instead of 15 s (the agent adds is_host); an
# elastic round starts 1 s (not 30 s) after it has its minimum, as in multinode_helpers.
JOB_ENV = ("{PET_RDZV_CONF: 'keep_alive_interval=1,keep_alive_max_attempt=%d,join_timeout=120,"
           "last_call_timeout=1', OMP_NUM_THREADS: '1'}")
TOML = """
[local]
trace = "{trace}"
time_scale = 60.0
[daemon]
schedule_interval_s = 0.2
reconcile_interval_s = 0.2
heartbeat_interval_s = 0.2
spend_interval_s = 1.0
heartbeat_timeout_s = 300.0
[agent]
heartbeat_interval_s = 0.2
log_flush_interval_s = 0.5
"""


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    """One daemon (in-process loops) and market for the module's jobs."""
    mp = pytest.MonkeyPatch()
    root = tmp_path_factory.mktemp("mn-e2e")
    home = root / "home"
    home.mkdir()
    mp.setenv("SPOTRUN_HOME", str(home))
    mp.delenv("SPOTRUN_DB_URL", raising=False)
    trace = write_trace(root / "trace.csv", {"zone-a": [1] * 50, "zone-b": [1] * 50},
                        tick_s=600.0)
    (home / "spotrun.toml").write_text(TOML.format(trace=trace))
    code = root / "code"
    code.mkdir()
    (code / "train.py").write_text(JOB_SCRIPT.read_text())
    (code / "train2.py").write_text(two_holds(JOB_SCRIPT.read_text()))
    ctx = build_context(load_settings(str(home)))
    runner = build_runner(ctx)
    runner.start()
    try:
        with BusyLoad():   # a loaded machine, as users' and CI's are
            yield ctx, root, home
    finally:
        runner.stop(wait=True)
        kill_leftovers(home / "market")
        mp.undo()


def two_holds(script: str) -> str:
    """The job script holding at HOLD_AT and again at HOLD_AT + 6 (release-N, held-N-RANK)."""
    swaps = [('release = Path(args.hold_dir or ".", "release")',
              'release = Path(args.hold_dir or ".", f"release-{step}")'),
             ("if args.hold_at and step == args.hold_at and not release.exists():",
              "if args.hold_at and step in (args.hold_at, args.hold_at + 6) "
              "and not release.exists():"),
             ('Path(args.hold_dir, f"held-{rank}")', 'Path(args.hold_dir, f"held-{step}-{rank}")')]
    for old, new in swaps:
        assert old in script, old
        script = script.replace(old, new)
    return script


def _submit(rig, name: str, nodes: str, hold: bool, script: str = "train.py",
            keep_alive_tries: int = 2, extra: str = "") -> tuple[str, Path, Path]:
    ctx, root, _ = rig
    out, hold_dir = root / f"out-{name}", root / f"hold-{name}"
    out.mkdir()
    hold_dir.mkdir()
    args = f"--steps {STEPS} --out {out}" + (f" --hold-at {HOLD_AT} --hold-dir {hold_dir}"
                                              if hold else "")
    spec = root / f"{name}.yaml"
    spec.write_text(f"name: {name}\ncommand: {TORCHRUN.replace('train.py', script)} {args}\n"
                    "workdir: code\n"
                    f"resources: {{nodes: {nodes if nodes.isdigit() else repr(nodes)}}}\n"
                    f"env: {JOB_ENV % keep_alive_tries}\nwork: {{total_steps: {STEPS}}}\n"
                    "policy: {market: spot}\n" + extra)
    job = submit(validate_submission(spec, ctx.settings), ctx.engine)
    return job.id, out, hold_dir


def _done(ctx, job_id: str, timeout_s: float = 300.0) -> Job:
    def check():
        with session(ctx.engine) as s:
            job = s.get(Job, job_id)
            return job if job.state.is_terminal() else None
    return wait_for(check, timeout_s, f"{job_id} to finish", interval_s=0.2)


def _nodes(ctx, job_id: str):
    with session(ctx.engine) as s:
        atts = attempts_of(s, job_id)
        return atts, {a.id: nodes_of(s, a.id) for a in atts}


def _members(ctx, job_id: str) -> dict[int, str]:
    try:
        doc = json.loads(ctx.store.get_bytes(layout.nodes_key(job_id, 1)))
    except Exception:
        return {}
    return {n["rank"]: n["instance_id"] for n in doc["nodes"]}


def _held(hold_dir: Path, step: int | None = None, ranks=(0, 1)) -> bool:
    names = [f"held-{r}" if step is None else f"held-{step}-{r}" for r in ranks]
    return all((hold_dir / n).exists() for n in names)


def _node_output(ctx, job_id: str, iid: str) -> str:
    prefix = layout.node_log_prefix(job_id, 1, iid) + "/"
    return "".join(ctx.store.get_bytes(o.key).decode() for o in ctx.store.list(prefix))


def _interrupt(job_id: str, node: int) -> None:
    res = CliRunner().invoke(cli, ["interrupt", job_id, "--node", str(node), "--notice-s", "0",
                                   "--json"])
    assert res.exit_code == 0, res.output


@pytest.fixture(scope="module")
def uninterrupted(rig) -> Callable[[], tuple[Job, str]]:
    """An uninterrupted 2-node run through the daemon: the job relying on the notice for its
    saves (its own test), whose final weights a resumed run must end with (the script's saves
    every 5 steps go on either way, and no save changes the weights). Submitted at once, it
    runs beside the test that asks for it first; the call waits for its end."""
    job_id, out, _ = _submit(rig, "notice-only", "2", hold=False,
                             extra="checkpoint: {interval_minutes: 600}\n")
    ended: list[tuple[Job, str]] = []

    def result() -> tuple[Job, str]:
        if not ended:
            sha = out / "final-params.sha256"
            job = _done(rig[0], job_id)
            ended.append((job, sha.read_text().strip() if sha.exists() else ""))
        return ended[0]
    return result


def test_reclaimed_nodes_are_replaced_alone_and_the_weights_match(rig, uninterrupted):
    """Node 1 is reclaimed at the first hold, then node 0 (the rendezvous host) at the second:
    each time exactly one new instance is launched, the other node keeps its instance, the new
    one resumes from the newest checkpoint, and the job ends with the uninterrupted weights.
    One job for both losses: each would cost a whole 2-node start as a job of its own."""
    ctx = rig[0]
    second = HOLD_AT + 6   # why: past the first resume's periodic save (every 5 steps)
    job_id, out, hold = _submit(rig, "losses", "2", hold=True, script="train2.py")
    wait_for(lambda: _held(hold, HOLD_AT), 300, "both ranks at the hold", interval_s=0.2)
    # The newest whole checkpoint at the hold: 10, unless a loaded box deferred that periodic
    # save to a later step (a save waits while the previous one still persists).
    saved = [_checkpointed(ctx, job_id)]
    assert 0 < saved[0] <= HOLD_AT, saved
    first = _members(ctx, job_id)
    assert len(first) == 2
    _interrupt(job_id, 1)
    (hold / f"release-{HOLD_AT}").write_text("")
    wait_for(lambda: _held(hold, second), 300, "both ranks, with node 1's replacement, at the "
             "2nd hold", interval_s=0.2)
    then = _members(ctx, job_id)
    assert then[0] == first[0] and then[1] not in first.values()   # node 0 kept its instance
    saved.append(_checkpointed(ctx, job_id))
    assert saved[0] < saved[1] <= second, saved
    _interrupt(job_id, 0)
    (hold / f"release-{second}").write_text("")
    job = _done(ctx, job_id)
    assert job.state is JobState.SUCCEEDED, job.reason
    [att], nodes = _nodes(ctx, job_id)
    rows = nodes[att.id]
    assert len(rows) == 4                      # exactly one new instance per loss
    assert len(ctx.provider.describe(job_id=job_id)) == 4     # as the provider counts them
    by_rank = {r: [n.instance_id for n in rows if n.node_rank == r] for r in (0, 1)}
    # Node 1's replacement kept its instance through the loss of node 0.
    assert by_rank[1] == [first[1], then[1]]
    assert len(by_rank[0]) == 2 and by_rank[0][0] == first[0]
    new0 = by_rank[0][1]
    for lost in (first[0], first[1]):
        [row] = [n for n in rows if n.instance_id == lost]
        assert row.end_reason is EndReason.RECLAIMED
    assert att.end_reason is EndReason.COMPLETED
    base_job, base_sha = uninterrupted()
    assert base_job.state is JobState.SUCCEEDED, base_job.reason
    assert (out / "final-params.sha256").read_text().strip() == base_sha
    for new, step in ((then[1], saved[0]), (new0, saved[1])):
        wait_for(lambda new=new, step=step: f"start step {step}" in _node_output(ctx, job_id, new),
                 60, f"{new} resumed from checkpoint {step}", interval_s=0.2)
    # The ledger books the four instances, each on its own.
    wait_for(lambda: _booked(ctx, job_id) == {n.instance_id for n in rows}, 60,
             "four instances booked", interval_s=0.2)


def _checkpointed(ctx, job_id: str) -> int:
    """The step of the job's newest checkpoint that verifies (where a new node resumes)."""
    with session(ctx.engine) as s:
        uri = s.get(Job, job_id).checkpoint_uri
    return ctx.checkpointed_step(job_id, uri, -1)


def _booked(ctx, job_id: str) -> set[str]:
    from sqlmodel import select
    from spotrun.db import SpendEntry
    with session(ctx.engine) as s:
        return {r.instance_id for r in s.exec(select(SpendEntry).where(
            SpendEntry.job_id == job_id, SpendEntry.kind == "compute"))}


def test_elastic_job_trains_on_one_node_while_the_replacement_is_refused(rig):
    ctx = rig[0]
    # A survivor whose torchrun agent misses keep-alives on a loaded machine would be dropped
    # from the rendezvous and the replacement would start a world of its own: 10 s of slack.
    job_id, out, hold = _submit(rig, "elastic", "1-2", hold=True, script="train2.py",
                                keep_alive_tries=10)
    wait_for(lambda: _held(hold, HOLD_AT), 300, "both ranks at the first hold", interval_s=0.2)
    first = _members(ctx, job_id)
    ctx.provider.client.faults(capacity_fraction=1.0)
    _interrupt(job_id, 1)
    (hold / f"release-{HOLD_AT}").write_text("")
    # The survivor's torchrun goes on alone (world size 1) from checkpoint 10 to the 2nd hold.
    second = HOLD_AT + 6
    wait_for(lambda: _held(hold, second, ranks=(0,)), 300, "the survivor training alone",
             interval_s=0.2)
    wait_for(lambda: "rank 0/1" in _node_output(ctx, job_id, first[0]), 60,
             "the survivor's log: a world of 1", interval_s=0.2)
    assert _members(ctx, job_id) == {0: first[0]}
    assert ctx.provider.client.fault_counts()["refused"] >= 1
    [att], _ = _nodes(ctx, job_id)
    assert att.state.value == "running"
    ctx.provider.client.faults(capacity_fraction=0.0)
    back = wait_for(lambda: len(m := _members(ctx, job_id)) == 2 and m, 120, "two nodes again",
                    interval_s=0.2)
    assert back[0] == first[0] and back[1] != first[1]
    # Both nodes train together again: rank 1 of a world of 2 reaches the second hold.
    wait_for(lambda: _held(hold, second, ranks=(1,)), 300, "two nodes at the 2nd hold",
             interval_s=0.2)
    (hold / f"release-{second}").write_text("")
    job = _done(ctx, job_id)
    assert job.state is JobState.SUCCEEDED, job.reason
    wait_for(lambda: "/2 node" in _node_output(ctx, job_id, back[1]), 60,
             "the replacement's log: a world of 2", interval_s=0.2)
    assert (out / "final-params.sha256").exists()


def test_a_two_node_job_relying_on_the_notice_launches_and_finishes(uninterrupted):
    """checkpoint.interval_minutes: 600 (no periodic save in the run): the progress model
    counts the emergency save on the notice, so the job is launched, not queued forever."""
    done, _ = uninterrupted()
    assert done.state is JobState.SUCCEEDED, done.reason
