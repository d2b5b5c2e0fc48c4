"""The instance side on GCE: the metadata client, and the real `spotrun agent` process taking
`instance/preempted` and the soft-off SIGTERM as the interruption notice."""

from __future__ import annotations

import json
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import agent_helpers
from agent_helpers import WORKLOAD, make_config, read_json
from polling import wait_for
from spotrun import layout
from spotrun.agent.imds import ImdsClient, open_metadata
from spotrun.bundle import make_bundle
from spotrun.checkpoints import checkpoint_name, verify
from spotrun.errors import ConfigError, ProviderError
from spotrun.providers.gcp import PREEMPTION_WINDOW_S
from spotrun.providers.gcp.metadata import GceMetadata
from spotrun.store import open_store

from .metadata_server import MetadataServer

JOB = "job-gce"
NAME = "sr-us-central1-a-0123456789ab"


@pytest.fixture()
def metadata():
    server = MetadataServer(NAME, "us-central1-a").start()
    yield server
    server.stop()


@pytest.fixture()
def store_dir(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    work = tmp_path / "workdir"
    work.mkdir()
    (work / "train.py").write_text(WORKLOAD)
    bundle = tmp_path / "bundle.tar.gz"
    make_bundle(work, bundle)
    open_store(root.as_uri()).put_file(layout.bundle_key(JOB), bundle)
    return root


@pytest.fixture()
def reap():
    started: list = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def _gce_config(store_dir: Path, metadata: MetadataServer, **kw):
    # What the gcp provider's agent_extras give the agent: the GCE instance side.
    return make_config(store_dir, metadata.url, job_id=JOB, instance_side="gcp", time_scale=1.0,
                       notice_poll_interval_s=0.2, **kw)


def _agent(tmp_path, cfg, metadata, reap):
    proc, stderr = agent_helpers.start_agent(tmp_path, cfg,
                                             env={"GCE_METADATA_HOST": metadata.host})
    reap.append(proc)
    return proc, stderr


# ------------------------------------------------------------ the metadata client

def test_preempted_is_long_polled_and_seen_at_once(metadata):
    client = GceMetadata(metadata.url, wait_s=20)
    assert client.interruption() is None                  # FALSE now, and its ETag kept
    assert client.instance_id() == NAME
    threading.Timer(0.3, metadata.preempt).start()
    began = time.monotonic()
    notice = client.interruption()                        # blocks until the flag changes
    took = time.monotonic() - began
    assert notice is not None and notice["action"] == "preempted" and 0.2 < took < 5.0
    end = time.time() + PREEMPTION_WINDOW_S
    got = datetime_epoch(notice["time"])
    assert abs(got - end) < 5.0
    waited = [q for p, q in metadata.requests if p.endswith("/instance/preempted")]
    assert waited[-1]["wait_for_change"] == "true" and waited[-1]["last_etag"]
    assert metadata.refused == 0 and client.rebalance() is None


def test_a_preemption_before_the_first_poll_is_not_missed(metadata):
    metadata.preempt()
    began = time.monotonic()
    assert GceMetadata(metadata.url, wait_s=20).interruption() is not None
    assert time.monotonic() - began < 2.0   # a plain read first: no wait for a change


def test_an_answer_without_the_flavor_header_is_not_the_metadata_server():
    class Plain(BaseHTTPRequestHandler):
        def do_GET(self):   # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"TRUE")

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Plain)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        client = GceMetadata(f"http://127.0.0.1:{srv.server_address[1]}")
        with pytest.raises(ProviderError, match="Metadata-Flavor"):
            client.interruption()
        assert client.instance_id() is None
    finally:
        srv.shutdown()
        srv.server_close()


def test_the_config_names_the_instance_side(tmp_path, metadata):
    cfg = _gce_config(tmp_path, metadata)
    gce = open_metadata(cfg, environ={"GCE_METADATA_HOST": metadata.host})
    assert isinstance(gce, GceMetadata) and gce.base_url == metadata.url
    assert gce.soft_off_notice_s == PREEMPTION_WINDOW_S
    ec2 = open_metadata(make_config(tmp_path, "http://127.0.0.1:9"), environ={})
    assert isinstance(ec2, ImdsClient) and ec2.soft_off_notice_s is None
    with pytest.raises(ConfigError, match="instance_side"):
        open_metadata(make_config(tmp_path, "http://x", instance_side="nowhere"), environ={})


def datetime_epoch(text: str) -> float:
    from datetime import datetime
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# ------------------------------------------------------------ the agent on a GCE VM

def test_preempted_flag_is_the_notice_and_the_save_lands(tmp_path, metadata, store_dir, reap):
    cfg = _gce_config(store_dir, metadata, total_steps=100000,
                      env={"WORKLOAD_STEP_S": "0.02"})
    proc, stderr = _agent(tmp_path, cfg, metadata, reap)
    hb = store_dir / layout.heartbeat_key(JOB, 1)
    wait_for(lambda: ((read_json(hb) or {}).get("step") or 0) > 5, 30, "the job to run")
    metadata.preempt()
    notice = wait_for(lambda: (n := read_json(store_dir / layout.notice_key(JOB, 1)))
                      and n["emergency_checkpoint_step"] and n, 20,
                      "the emergency save the notice asked for")
    assert notice["action"] == "preempted" and notice["emergency_save_s"] < PREEMPTION_WINDOW_S
    step = notice["emergency_checkpoint_step"]
    assert verify(open_store(cfg.checkpoint_uri), checkpoint_name(step)).step == step
    # The soft-off follows (systemd's SIGTERM): the agent stops the job well inside the window.
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=PREEMPTION_WINDOW_S)
    assert time.monotonic() - began < PREEMPTION_WINDOW_S - 5
    report = read_json(store_dir / layout.exit_key(JOB, 1))
    assert report["reason"] == "signal" and code != 0, stderr.read_text()[-2000:]


def test_soft_off_alone_is_a_notice_save_then_stop(tmp_path, metadata, store_dir, reap):
    # The ACPI soft-off can reach the agent before it has read instance/preempted.
    cfg = _gce_config(store_dir, metadata, total_steps=100000,
                      env={"WORKLOAD_STEP_S": "0.02"})
    proc, stderr = _agent(tmp_path, cfg, metadata, reap)
    hb = store_dir / layout.heartbeat_key(JOB, 1)
    wait_for(lambda: ((read_json(hb) or {}).get("step") or 0) > 5, 30, "the job to run")
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=PREEMPTION_WINDOW_S)
    took = time.monotonic() - began
    notice = read_json(store_dir / layout.notice_key(JOB, 1))
    assert notice is not None, stderr.read_text()[-2000:]
    assert notice["action"] == "soft-off" and notice["emergency_checkpoint_step"]
    assert took < PREEMPTION_WINDOW_S - 5 and code != 0
    assert read_json(store_dir / layout.exit_key(JOB, 1))["reason"] == "signal"
    step = notice["emergency_checkpoint_step"]
    assert verify(open_store(cfg.checkpoint_uri), checkpoint_name(step)).step == step
    log = json.dumps([line for line in stderr.read_text().splitlines() if "soft_off" in line])
    assert "soft_off_notice" in log
