"""End-to-end tests of `spotrun agent` as a real process on a file:// store."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

import agent_helpers
from agent_helpers import WORKLOAD, imds, make_config, read_json  # noqa: F401 (fixture)
from polling import wait_for
from spotrun import layout
from spotrun.agent.userdata import embed_config
from spotrun.bundle import make_bundle
from spotrun.checkpoints import checkpoint_name, put_checkpoint_files, verify
from spotrun.store import open_store

SECRET_VALUE = "s3cr3t-VALUE-7f1c"
JOB = "job-test"


@pytest.fixture()
def reap():
    """No agent (or its job) outlives a failed test."""
    started: list = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except Exception:
                proc.kill()
                proc.wait()


def start_agent(tmp_path, cfg, *, reap, **kw):
    proc, stderr = agent_helpers.start_agent(tmp_path, cfg, **kw)
    reap.append(proc)
    return proc, stderr


@pytest.fixture()
def store_dir(tmp_path: Path) -> Path:
    """A daemon store holding the job's bundle (the workload script)."""
    root = tmp_path / "store"
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    (workdir / "train.py").write_text(WORKLOAD)
    bundle = tmp_path / "bundle.tar.gz"
    make_bundle(workdir, bundle)
    open_store(root.as_uri()).put_file(layout.bundle_key(JOB), bundle)
    return root


def attempt_file(store_dir: Path, key_fn, attempt: int = 1) -> Path:
    return store_dir / key_fn(JOB, attempt)


def log_segments(store_dir: Path, attempt: int = 1) -> list[Path]:
    return sorted((store_dir / layout.log_prefix(JOB, attempt)).glob("*.log"))


def shipped_log(store_dir: Path) -> str:
    return b"".join(p.read_bytes() for p in log_segments(store_dir)).decode()


def finish(proc, timeout_s: float = 30.0) -> int:
    try:
        return proc.wait(timeout=timeout_s)
    except Exception:
        proc.kill()
        raise


def test_full_run_reports_redacts_and_completes(tmp_path, imds, store_dir, reap):
    cfg = make_config(store_dir, imds.url, total_steps=50, checkpoint_interval_s=30.0,
                      secrets={"API_TOKEN": "env:AGENT_SECRET_SRC"},
                      env={"JOBENV_MODE": "fast", "WORKLOAD_STEP_S": "0.02"})
    proc, stderr = start_agent(tmp_path, cfg, reap=reap,
                               env={"AGENT_SECRET_SRC": SECRET_VALUE})
    hb_path = attempt_file(store_dir, layout.heartbeat_key)
    running = wait_for(lambda: (hb := read_json(hb_path)) and hb["phase"] == "running"
                       and (hb["step"] or 0) >= 1 and hb, what="a running heartbeat")
    assert running["attempt"] == 1 and running["total_steps"] == 50 and running["notice"] is False
    assert finish(proc) == 0

    ex = read_json(attempt_file(store_dir, layout.exit_key))
    assert ex["reason"] == "completed" and ex["exit_code"] == 0 and ex["step"] == 50
    hb = read_json(hb_path)
    assert hb["phase"] == "exited" and hb["step"] == 50 and hb["steps_per_s"] == pytest.approx(50)

    segs = log_segments(store_dir)
    assert [p.name for p in segs] == [f"{i:06d}.log" for i in range(len(segs))]
    text = shipped_log(store_dir)
    assert "SECRET[***]" in text and "token=***" in text and text.rstrip().endswith("done")
    # The value appears nowhere the daemon or an operator can read it.
    for path in store_dir.rglob("*"):
        if path.is_file():
            assert SECRET_VALUE.encode() not in path.read_bytes(), path
    assert SECRET_VALUE not in stderr.read_text()

    env_line = next(ln for ln in text.splitlines() if ln.startswith("ENV "))
    env = json.loads(env_line[4:])
    assert env["SPOTRUN_JOB_ID"] == JOB and env["SPOTRUN_ATTEMPT"] == "1"
    assert env["SPOTRUN_GPUS"] == "1" and env["SPOTRUN_CHECKPOINT_KEEP"] == "3"
    assert env["SPOTRUN_CHECKPOINT_URI"] == cfg.checkpoint_uri
    assert env["SPOTRUN_CHECKPOINT_INTERVAL_S"] == "30.0" and env["SPOTRUN_TOTAL_STEPS"] == "50"
    assert env["SPOTRUN_RESUME_CHECKPOINT"] == ""
    progress = Path(env["SPOTRUN_PROGRESS_FILE"])
    assert progress.is_absolute() and progress.is_relative_to(tmp_path / "agent-instance")
    assert (tmp_path / "agent-instance" / "job" / "train.py").is_file()
    # Agent's own logs: structlog JSON lines.
    events = [json.loads(ln)["event"] for ln in stderr.read_text().splitlines()
              if ln.startswith("{")]
    assert "command_started" in events and "agent_exit" in events


def test_notice_signals_job_records_emergency_save_then_cancel(tmp_path, imds, store_dir, reap):
    # A shell that stays around (it must run `echo` after) must survive SIGUSR1.
    cfg = make_config(store_dir, imds.url, total_steps=1_000_000, imds_token_ttl_s=1,
                      command=f"{sys.executable} train.py; echo shell-went-on")
    proc, _ = start_agent(tmp_path, cfg, reap=reap)
    hb_path = attempt_file(store_dir, layout.heartbeat_key)
    wait_for(lambda: (read_json(hb_path) or {}).get("step"), what="steps")

    imds.arm_rebalance("2030-01-01T00:00:00Z")
    wait_for(lambda: (read_json(hb_path) or {}).get("rebalance"), what="rebalance in heartbeat")
    assert not attempt_file(store_dir, layout.notice_key).exists()   # a hint is not a notice
    # IMDSv2: the 1 s token is renewed while polling (the server rejects expired ones).
    wait_for(lambda: imds.token_puts >= 2, what="IMDS token renewal")

    imds.arm_notice("terminate", "2030-01-01T00:02:00Z")
    notice_path = attempt_file(store_dir, layout.notice_key)
    notice = wait_for(lambda: (n := read_json(notice_path)) and n["emergency_checkpoint_step"]
                      and n, what="emergency checkpoint step in notice.json")
    assert notice["action"] == "terminate" and notice["time"] == "2030-01-01T00:02:00Z"
    assert notice["signalled_at"] and 0 <= notice["emergency_save_s"] < 10
    # A job whose library reports no outcome of its own: the agent words it.
    assert notice["outcome"] == (f"emergency checkpoint at step {notice['emergency_checkpoint_step']}"
                                 f" in {notice['emergency_save_s']:.2f} s")
    step = notice["emergency_checkpoint_step"]
    ckpt_store = open_store(cfg.checkpoint_uri)
    assert verify(ckpt_store, checkpoint_name(step)).step == step   # SIGUSR1 reached the job
    wait_for(lambda: (read_json(hb_path) or {}).get("notice") is True, what="notice heartbeat")
    assert imds.action_polls_after_arm >= 1
    assert proc.poll() is None   # keeps running: the reclaim, not the agent, ends it

    (store_dir / layout.control_key(JOB)).write_text(json.dumps({"cancel": True}))
    assert finish(proc) == 128 + signal.SIGTERM
    ex = read_json(attempt_file(store_dir, layout.exit_key))
    assert ex["reason"] == "cancelled" and ex["exit_code"] == 143 and ex["step"] >= step
    assert f"EMERGENCY {step}" in shipped_log(store_dir)
    assert "shell-went-on" not in shipped_log(store_dir)


def test_agent_sigterm_forwards_then_kills_a_stubborn_job(tmp_path, imds, store_dir, reap):
    cfg = make_config(store_dir, imds.url, total_steps=1_000_000, stop_grace_s=0.5,
                      env={"WORKLOAD_IGNORE_TERM": "1"})
    proc, _ = start_agent(tmp_path, cfg, reap=reap)
    hb_path = attempt_file(store_dir, layout.heartbeat_key)
    wait_for(lambda: (read_json(hb_path) or {}).get("step"), what="steps")
    proc.send_signal(signal.SIGTERM)
    assert finish(proc) == 128 + signal.SIGKILL
    ex = read_json(attempt_file(store_dir, layout.exit_key))
    assert ex["reason"] == "signal" and ex["exit_code"] == 137
    assert read_json(hb_path)["phase"] == "exited"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")   # an unreaped zombie is dead for our purpose


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_job_dies_with_a_killed_agent(tmp_path, imds, store_dir, reap):
    cfg = make_config(store_dir, imds.url, total_steps=1_000_000)
    proc, _ = start_agent(tmp_path, cfg, reap=reap)
    hb_path = attempt_file(store_dir, layout.heartbeat_key)
    wait_for(lambda: (read_json(hb_path) or {}).get("step"), what="steps")
    pgid_file = tmp_path / "agent-instance" / "spotrun-agent" / "job.pgid"
    job_pid = int(pgid_file.read_text())
    assert _alive(job_pid)
    proc.kill()                      # the market's reclaim: no chance to clean up
    proc.wait(timeout=10)
    try:
        wait_for(lambda: not _alive(job_pid), timeout_s=10, what="the job to die with its agent")
    finally:
        if _alive(job_pid):
            os.kill(job_pid, signal.SIGKILL)


def test_deadman_stops_job_when_daemon_never_seen(tmp_path, imds, store_dir, reap):
    cfg = make_config(store_dir, imds.url, total_steps=1_000_000, deadman_timeout_s=1.0)
    proc, stderr = start_agent(tmp_path, cfg, reap=reap)
    assert finish(proc) == 128 + signal.SIGTERM
    ex = read_json(attempt_file(store_dir, layout.exit_key))
    assert ex["reason"] == "deadman"
    assert "daemon_silent" in stderr.read_text()


def test_fresh_daemon_keeps_job_alive_and_stale_one_stops_it(tmp_path, imds, store_dir, reap):
    from datetime import datetime, timedelta, timezone
    alive = store_dir / layout.DAEMON_ALIVE
    alive.parent.mkdir(parents=True, exist_ok=True)
    now = datetime.now(timezone.utc)
    alive.write_text(json.dumps({"ts": now.isoformat()}))
    cfg = make_config(store_dir, imds.url, total_steps=60, deadman_timeout_s=30.0,
                      env={"WORKLOAD_STEP_S": "0.01"})
    proc, _ = start_agent(tmp_path, cfg, reap=reap, name="fresh")
    assert finish(proc) == 0
    assert read_json(attempt_file(store_dir, layout.exit_key))["reason"] == "completed"

    alive.write_text(json.dumps({"ts": (now - timedelta(hours=1)).isoformat()}))
    cfg2 = make_config(store_dir, imds.url, attempt=2, total_steps=1_000_000,
                       deadman_timeout_s=30.0)
    proc2, _ = start_agent(tmp_path, cfg2, reap=reap, name="stale")
    assert finish(proc2) == 128 + signal.SIGTERM
    assert read_json(attempt_file(store_dir, layout.exit_key, 2))["reason"] == "deadman"


def test_resume_point_is_newest_verified_checkpoint(tmp_path, imds, store_dir, reap):
    cfg = make_config(store_dir, imds.url, total_steps=12)
    ckpts = open_store(cfg.checkpoint_uri)
    put_checkpoint_files(ckpts, 10, {"state.json": b'{"step": 10}'})
    put_checkpoint_files(ckpts, 20, {"state.json": b'{"step": 20}'})
    corrupt = Path(ckpts.root) / checkpoint_name(20) / "state.json"
    corrupt.write_bytes(b'{"step": 99}')          # same size, wrong bytes
    ckpts.put_bytes(f"{checkpoint_name(30)}/state.json", b"partial")   # no manifest
    proc, stderr = start_agent(tmp_path, cfg, reap=reap)
    assert finish(proc) == 0
    env = json.loads(next(ln for ln in shipped_log(store_dir).splitlines()
                          if ln.startswith("ENV "))[4:])
    assert env["SPOTRUN_RESUME_CHECKPOINT"] == checkpoint_name(10)
    assert "skipping checkpoint ckpt-000000000020" in stderr.read_text()
    ex = read_json(attempt_file(store_dir, layout.exit_key))
    assert ex["reason"] == "completed" and ex["step"] == 12


def test_unresolvable_secret_ends_attempt_without_running(tmp_path, imds, store_dir, reap):
    cfg = make_config(store_dir, imds.url, secrets={"DB_PASS": "env:SPOTRUN_TEST_UNSET_VAR"})
    proc, _ = start_agent(tmp_path, cfg, reap=reap)
    assert finish(proc) == 1
    ex = read_json(attempt_file(store_dir, layout.exit_key))
    assert ex["reason"] == "error" and ex["exit_code"] is None and "DB_PASS" in ex["message"]
    assert log_segments(store_dir) == []
    assert not (tmp_path / "agent-instance" / "spotrun-agent" / "progress.json").exists()


def test_failing_command_reports_error_with_its_exit_code(tmp_path, imds, store_dir, reap):
    marker = tmp_path / "shutdown-ran"
    cfg = make_config(store_dir, imds.url, bundle_key=None, command="echo about to fail; exit 3",
                      shutdown_command=f"touch {marker}")
    proc, _ = start_agent(tmp_path, cfg, reap=reap)
    assert finish(proc) == 3
    assert marker.exists()   # the instance shutdown hook ran after exit.json
    ex = read_json(attempt_file(store_dir, layout.exit_key))
    assert ex["reason"] == "error" and ex["exit_code"] == 3
    assert "about to fail" in shipped_log(store_dir)


def test_user_data_from_imds_boot_script(tmp_path, imds, store_dir, reap):
    cfg = make_config(store_dir, imds.url, bundle_key=None, imds_endpoint="http://127.0.0.1:9",
                      command="echo from-imds")
    imds.user_data = embed_config("#!/bin/bash\nspotrun agent --user-data-imds\n", cfg)
    instance = tmp_path / "imds-instance"
    instance.mkdir()
    env = dict(os.environ, SPOTRUN_IMDS_ENDPOINT=imds.url)
    import subprocess
    proc = subprocess.Popen([sys.executable, "-m", "spotrun", "agent", "--user-data-imds"],
                            cwd=instance, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    reap.append(proc)
    assert finish(proc) == 0
    assert read_json(attempt_file(store_dir, layout.exit_key))["reason"] == "completed"
    assert "from-imds" in shipped_log(store_dir)


def test_agent_rejects_bad_invocation(tmp_path):
    import subprocess
    r = subprocess.run([sys.executable, "-m", "spotrun", "agent"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and "user_data" in r.stderr
    bad = tmp_path / "ud.json"
    bad.write_text('{"job_id": "x"}')
    r = subprocess.run([sys.executable, "-m", "spotrun", "agent", "--user-data", str(bad),
                        "--dir", str(tmp_path / "i")], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "user_data" in r.stderr


JOB_DIR_PROBE = r'''
import json, os, pathlib
here = pathlib.Path.cwd()
print("JOBDIR " + json.dumps({"cwd": str(here), "env": os.environ.get("SPOTRUN_JOB_DIR"),
      "files": sorted(p.relative_to(here).as_posix() for p in here.rglob("*") if p.is_file()),
      "log": (here / "logs" / "metrics.csv").read_text(),
      "restored": os.environ.get("SPOTRUN_FILES_RESTORED"),
      "persist": json.loads(os.environ["SPOTRUN_PERSIST"])}), flush=True)
'''


def test_job_runs_in_the_providers_job_dir_emptied_then_restored(tmp_path, imds, store_dir, reap):
    """The job directory is the provider's path (same on every attempt): the agent empties it,
    extracts the bundle, puts back the resume checkpoint's persisted files, then starts."""
    from spotrun import jobfiles
    template = str(tmp_path / "jobs" / "{job_id}" / "node-{node_rank}")
    folder = tmp_path / "jobs" / JOB / "node-0"
    (folder / "logs").mkdir(parents=True)
    (folder / "stale.txt").write_text("left by an earlier attempt")
    (folder / "logs" / "metrics.csv").write_text("step,loss\n1,0.5\n2,0.4\n3,0.3\n")
    # The checkpoint of step 2 carries the log as it was at step 2.
    saved = tmp_path / "at-step-2"
    (saved / "logs").mkdir(parents=True)
    (saved / "logs" / "metrics.csv").write_text("step,loss\n1,0.5\n2,0.4\n")
    ckpt = open_store((store_dir / "jobs" / JOB / "checkpoints").as_uri())
    files = jobfiles.JobFiles(saved, ["logs"], env={})
    cap = files.capture(checkpoint=checkpoint_name(2))
    files.upload(ckpt, checkpoint_name(2), cap)
    put_checkpoint_files(ckpt, 2, {"state.json": b"{}",
                                   jobfiles.INDEX: ckpt.get_bytes(f"{checkpoint_name(2)}/files.json")})
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "train.py").write_text(JOB_DIR_PROBE)
    make_bundle(tmp_path / "work", tmp_path / "bundle.tar.gz")
    open_store(store_dir.as_uri()).put_file(layout.bundle_key(JOB), tmp_path / "bundle.tar.gz")

    cfg = make_config(store_dir, imds.url, job_dir=template, persist=["logs"])
    proc, _ = start_agent(tmp_path, cfg, reap=reap)
    assert finish(proc) == 0
    line = next(ln for ln in shipped_log(store_dir).splitlines() if ln.startswith("JOBDIR "))
    seen = json.loads(line[len("JOBDIR "):])
    assert seen["cwd"] == seen["env"] == str(folder.resolve())
    assert seen["files"] == ["logs/metrics.csv", "train.py"]   # stale.txt is gone
    assert seen["log"] == "step,loss\n1,0.5\n2,0.4\n"           # the checkpoint's, not step 3's
    assert seen["restored"] == checkpoint_name(2) and seen["persist"] == ["logs"]
