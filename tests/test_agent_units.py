"""Agent parts in-process: IMDSv2 client, dead-man switch, log shipper, progress, env."""

from __future__ import annotations

import os
import sys

import json
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import pytest

from agent_helpers import imds, make_config  # noqa: F401 (fixture)
from spotrun.agent.child import child_env, exit_code_of
from spotrun.agent.config import AgentConfig
from spotrun.agent.deadman import DeadmanSwitch
from spotrun.agent.imds import INSTANCE_ACTION, REBALANCE, ImdsClient, endpoint_for
from spotrun.agent.logship import LogShipper
from spotrun.agent.notice import NoticeWatcher, notice_poll_interval_wall_s
from spotrun.agent.progress_file import ProgressReader
from spotrun.agent.attempt import notice_outcome
from spotrun.agent.storeio import Reporter
from spotrun.agent.userdata import config_from_user_data, embed_config
from spotrun.errors import ConfigError, StoreError
from spotrun.secrets import Redactor
from spotrun.store.file import FileStore


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, wall: float = 1_800_000_000.0) -> None:
        self.wall = wall
        self.mono = 100.0

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def advance(self, s: float) -> None:
        self.wall += s
        self.mono += s


# ------------------------------------------------------------ IMDS

def test_imds_requires_token_and_client_renews_it_before_expiry(imds):
    req = urllib.request.Request(imds.url + "/latest/meta-data/spot/instance-action")
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(req, timeout=2)
    assert ei.value.code == 401

    clock = FakeClock()
    client = ImdsClient(imds.url, token_ttl_s=300, monotonic=clock.monotonic)
    assert client.get(INSTANCE_ACTION) is None          # 404: no notice
    assert client.get(INSTANCE_ACTION) is None and imds.token_puts == 1
    clock.advance(200)                                   # within TTL minus margin: reuse
    client.get(REBALANCE)
    assert imds.token_puts == 1
    clock.advance(50)                                    # 250 s >= 300 - 60: renew
    client.get(REBALANCE)
    assert imds.token_puts == 2
    imds.arm_notice("stop", "2030-01-01T00:00:00Z")
    assert json.loads(client.get(INSTANCE_ACTION)) == {"action": "stop",
                                                       "time": "2030-01-01T00:00:00Z"}


def test_imds_client_recovers_from_revoked_token(imds):
    client = ImdsClient(imds.url, token_ttl_s=300)
    client.get(INSTANCE_ACTION)
    imds.revoke_tokens()                                  # e.g. IMDS restarted
    assert client.get(INSTANCE_ACTION) is None
    assert imds.rejected == 1 and imds.token_puts == 2


def test_endpoint_env_overrides_config(monkeypatch):
    monkeypatch.setenv("SPOTRUN_IMDS_ENDPOINT", "http://127.0.0.1:1234/")
    assert endpoint_for("http://169.254.169.254") == "http://127.0.0.1:1234"
    monkeypatch.delenv("SPOTRUN_IMDS_ENDPOINT")
    assert endpoint_for("http://169.254.169.254") == "http://169.254.169.254"


@pytest.mark.parametrize("poll_s,scale,expected", [
    (5.0, 1.0, 5.0),       # AWS: every 5 s
    (30.0, 1.0, 12.0),     # never slower than 12 market seconds
    (5.0, 50.0, 0.1),      # a 50x market polls 50x as often in wall time
    (30.0, 60.0, 0.2),
])
def test_notice_poll_interval(poll_s, scale, expected):
    cfg = AgentConfig(job_id="j", attempt=1, store_uri="file:///x", checkpoint_uri="file:///y",
                      command="true", notice_poll_interval_s=poll_s, time_scale=scale)
    assert notice_poll_interval_wall_s(cfg) == pytest.approx(expected)


def test_notice_watcher_reports_rebalance_once_then_notice(imds):
    seen: list[tuple[str, dict]] = []
    watcher = NoticeWatcher(ImdsClient(imds.url), 1.0, lambda i: seen.append(("notice", i)),
                            lambda i: seen.append(("rebalance", i)))
    assert watcher.poll_once() is False and seen == []
    imds.arm_rebalance("2030-01-01T00:00:00Z")
    assert watcher.poll_once() is False and watcher.poll_once() is False
    imds.arm_notice()
    assert watcher.poll_once() is True
    assert seen == [("rebalance", {"noticeTime": "2030-01-01T00:00:00Z"}),
                    ("notice", {"action": "terminate", "time": "2030-01-01T00:02:00Z"})]


def test_notice_watcher_survives_dead_imds():
    watcher = NoticeWatcher(ImdsClient("http://127.0.0.1:9", timeout_s=0.5), 1.0,
                            lambda i: None, lambda i: None)
    assert watcher.poll_once() is False and watcher.errors == 1


# ------------------------------------------------------------ dead-man switch

def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat()


def test_deadman_counts_from_start_when_daemon_never_seen():
    clock = FakeClock()
    dm = DeadmanSwitch(60, clock)
    dm.observe(None)
    clock.advance(59)
    assert not dm.expired()
    clock.advance(2)
    assert dm.expired()


def test_deadman_ages_first_copy_then_trusts_changes():
    clock = FakeClock()
    dm = DeadmanSwitch(60, clock)
    dm.observe({"ts": _iso(clock.wall - 50)})      # 50 s old at boot
    clock.advance(11)
    assert dm.expired()
    dm.observe({"ts": _iso(clock.wall - 3600)})    # changed: a sign of life, whatever its clock
    assert not dm.expired()
    clock.advance(59)
    dm.observe({"ts": _iso(clock.wall - 3600 - 59)})   # same ts as before: no news
    assert not dm.expired()
    clock.advance(2)
    assert dm.expired()


def test_deadman_ignores_garbage_and_naive_timestamps_are_utc():
    clock = FakeClock()
    dm = DeadmanSwitch(60, clock)
    dm.observe({"ts": "yesterday"})
    dm.observe({"nots": 1})
    naive = datetime.fromtimestamp(clock.wall - 100, timezone.utc).replace(tzinfo=None)
    dm.observe({"ts": naive.isoformat()})
    assert dm.expired() and dm.silent_s() == pytest.approx(100)


# ------------------------------------------------------------ log shipping

class FlakyStore(FileStore):
    """A real file store whose next `fail` writes raise, like a store outage."""

    fail = 0

    def put_bytes(self, key: str, data: bytes) -> None:
        if self.fail > 0:
            self.fail -= 1
            raise StoreError("injected outage", field="key", value=key)
        super().put_bytes(key, data)


def test_log_shipper_uploads_only_new_bytes_as_ordered_segments(tmp_path):
    store = FileStore(tmp_path / "store")
    log = tmp_path / "out.log"
    shipper = LogShipper(Reporter(store), "logs/0001", log, Redactor(["pw123"]),
                         max_segment_bytes=8)
    assert shipper.flush() == 0                       # no file yet
    log.write_bytes(b"hello ")
    assert shipper.flush() == 1
    assert shipper.flush() == 0                       # nothing new: no empty segment
    with open(log, "ab") as f:
        f.write(b"pw123 and more text")
    shipper.flush(final=True)
    keys = [o.key for o in store.list("logs/0001/")]
    assert keys == [f"logs/0001/{i:06d}.log" for i in range(len(keys))] and len(keys) >= 3
    assert b"".join(store.get_bytes(k) for k in keys) == b"hello *** and more text"
    assert all(len(store.get_bytes(k)) <= 8 for k in keys[:-1])


def test_log_shipper_retries_failed_segment_with_same_number_and_bytes(tmp_path):
    store = FlakyStore(tmp_path / "store")
    log = tmp_path / "out.log"
    shipper = LogShipper(Reporter(store, attempts=1), "logs", log, Redactor([]))
    log.write_bytes(b"first ")
    store.fail = 1
    assert shipper.flush() == 0 and shipper.seq == 0
    with open(log, "ab") as f:
        f.write(b"second")
    assert shipper.flush() == 2
    assert store.get_bytes("logs/000000.log") == b"first "
    assert store.get_bytes("logs/000001.log") == b"second"


def test_reporter_retries_then_gives_up_without_raising(tmp_path):
    store = FlakyStore(tmp_path / "store")
    rep = Reporter(store, attempts=3, wait_max_s=0.01)
    store.fail = 2
    assert rep.put_json("a.json", {"x": 1}) is True and json.loads(store.get_bytes("a.json"))
    store.fail = 5
    assert rep.put_json("b.json", {"x": 1}) is False and rep.failed_writes == 1
    assert not store.exists("b.json")


# ------------------------------------------------------------ progress, env, user data

def test_progress_reader_keeps_last_good_copy(tmp_path):
    p = tmp_path / "progress.json"
    reader = ProgressReader(p)
    assert reader.read() == {}
    p.write_text(json.dumps({"step": 7, "total_steps": 10, "extra": 1}))
    assert reader.read()["step"] == 7 and "extra" not in reader.read()
    p.write_text('{"step": 8, "tot')                  # a non-atomic writer, mid-write
    assert reader.read()["step"] == 7


def test_child_env_layers_and_contract_variables(tmp_path):
    cfg = make_config(tmp_path, "http://127.0.0.1:9", env={"A": "job", "SPOTRUN_JOB_ID": "x"},
                      total_steps=None, checkpoint_interval_s=None, gpus=8, attempt=3)
    env = child_env(cfg, base={"A": "os", "PATH": "/bin", "SPOTRUN_TOTAL_STEPS": "stale"},
                    secrets={"TOKEN": "v"}, resume_checkpoint=None,
                    progress_file=Path("rel/progress.json"))
    assert env["A"] == "job" and env["TOKEN"] == "v"
    # The agent's own interpreter comes first on PATH, so `python` in the command is it.
    assert env["PATH"] == f"{Path(sys.executable).parent}{os.pathsep}/bin"
    assert env["SPOTRUN_JOB_ID"] == cfg.job_id and env["SPOTRUN_ATTEMPT"] == "3"
    assert env["SPOTRUN_GPUS"] == "8" and env["SPOTRUN_RESUME_CHECKPOINT"] == ""
    assert "SPOTRUN_TOTAL_STEPS" not in env and "SPOTRUN_CHECKPOINT_INTERVAL_S" not in env
    assert Path(env["SPOTRUN_PROGRESS_FILE"]).is_absolute()
    assert exit_code_of(-15) == 143 and exit_code_of(3) == 3


def test_user_data_json_or_marker_line(tmp_path):
    cfg = make_config(tmp_path, "http://127.0.0.1:9")
    assert config_from_user_data(cfg.to_json()) == cfg
    script = embed_config("#!/bin/bash\nexec spotrun agent --user-data-imds\n", cfg)
    assert script.startswith("#!/bin/bash\n# spotrun-agent-config: {")
    assert config_from_user_data(script) == cfg
    with pytest.raises(ConfigError):
        config_from_user_data("#!/bin/bash\necho nothing\n")
    with pytest.raises(ConfigError):
        config_from_user_data('{"job_id": "j", "bogus": 1}')


def test_agent_config_round_trips_new_fields():
    cfg = AgentConfig(job_id="j", attempt=2, store_uri="file:///s", checkpoint_uri="file:///c",
                      command="true", shutdown_command="sudo shutdown -h now", stop_grace_s=3.0)
    assert AgentConfig.from_json(cfg.to_json()) == cfg
    assert AgentConfig(job_id="j", attempt=1, store_uri="file:///s", checkpoint_uri="file:///c",
                       command="true").shutdown_command is None


def test_a_save_signal_sent_the_moment_the_job_starts_does_not_kill_it(tmp_path: Path) -> None:
    # The agent may signal at once (a budget stop already requested, an early notice): the
    # shell must not die of SIGUSR1 before it had a chance to ignore it.
    import signal

    from spotrun.agent.child import signal_group, spawn
    from polling import wait_for
    log = tmp_path / "job.log"
    proc = spawn("echo started; sleep 30", cwd=tmp_path, env=dict(os.environ), log_path=log)
    try:
        assert signal_group(proc, signal.SIGUSR1)
        wait_for(lambda: "started" in log.read_text(), timeout_s=30, what="the command's output")
        assert proc.poll() is None, proc.returncode
    finally:
        signal_group(proc, signal.SIGKILL)
        proc.wait()


@pytest.mark.parametrize("notice, said, ended, expected", [
    # The job's library words it: kept as it is.
    ({"emergency_checkpoint_step": 7, "emergency_save_s": 0.4},
     "emergency checkpoint at step 7 in 0.31 s", None, "emergency checkpoint at step 7 in 0.31 s"),
    # A library that reports only the step (a framework callback): the agent words it.
    ({"emergency_checkpoint_step": 7, "emergency_save_s": 0.4}, None, None,
     "emergency checkpoint at step 7 in 0.40 s"),
    # Still waiting, the library's reason; once the job is gone, final with how it ended.
    ({"emergency_checkpoint_step": None}, "no emergency checkpoint: a training step is under way",
     None, "no emergency checkpoint: a training step is under way"),
    ({"emergency_checkpoint_step": None}, "no emergency checkpoint: a training step is under way",
     "the job ended: cancelled, exit code 143",
     "no emergency checkpoint: a training step is under way; the job ended: cancelled, "
     "exit code 143"),
    # Nothing from the job at all: never silence.
    ({"emergency_checkpoint_step": None, "outcome": None}, None, None,
     "no emergency checkpoint: the job has not reported one yet"),
    ({"emergency_checkpoint_step": None}, None, "the job ended: error, exit code 1",
     "no emergency checkpoint: the job ended: error, exit code 1, reporting none"),
])
def test_every_notice_gets_an_outcome(notice, said, ended, expected):
    assert notice_outcome(notice, said, ended) == expected
