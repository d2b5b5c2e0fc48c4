"""End to end on GCP's fakes: daemon + gcp provider + gs:// store + agents on "VMs" + real torch.

The fake Compute Engine plays GCP's control plane on 127.0.0.1, fake-gcs-server the bucket, and
GceHost the VMs: each RUNNING Spot VM gets a local agent started from its metadata, with its own
GCE metadata server. `spotrun interrupt` (simulateMaintenanceEvent) preempts the VM with
GCP's 30 s window: `instance/preempted` turns TRUE and the agent gets the soft-off SIGTERM. The
emergency checkpoint must land in gs:// inside the window; the agent then stops and the VM is
gone (deleted, termination action DELETE). The daemon launches a new Spot VM that resumes from
gs:// and finishes with the same weights, bit for bit, as an uninterrupted run; the ledger books
both VMs and their disks by GCP's rules, and the audit's causes add up to the bill.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path
from typing import Iterator

import pytest
from sqlmodel import select
from daemon_helpers import all_booked
from test_e2e_local import _sha, finished, job_log, running_attempt, wait_for

from spotrun import layout
from spotrun.daemon.app import build_context, build_runner
from spotrun.db import SpendEntry, attempts_of, session
from spotrun.errors import ObjectNotFound, StoreError
from spotrun.jobs import submit, validate_submission
from spotrun.providers.billing_rules import SpendKind
from spotrun.providers.facts import rules_for
from spotrun.providers.gcp import PREEMPTION_WINDOW_S
from spotrun.providers.gcp.launch import zone_of
from spotrun.providers.gcp.provider import GcpProvider
from spotrun.states import EndReason, JobState, Market, TerminationCause
from spotrun.store import open_store
from spotrun.ui.views import audit_view

from cloud_host import FAST_AGENT as AGENT, FAST_DAEMON as DAEMON

from .compute_state import ComputeState
from .fake_compute import FakeCompute
from .gce_fixtures import gcp_settings
from .gcs_emulator import gcs_emulator  # noqa: F401  (fixture)
from .harness import POWEROFF_FILE, GceHost

REPO = Path(__file__).resolve().parents[2]
# Shorter than the other end-to-end tests' 2,500 steps, so the test stays near a minute under
# the suite's load; the replacement still has most of the run to do.
TRAIN_ARGS = "--steps 600 --hidden 64 --samples 2048 --log-every 200 --metrics metrics.csv"
TYPE = "g2-standard-4"


@pytest.fixture
def gcp_e2e(gcs_emulator, tmp_home: Path, tmp_path: Path, monkeypatch,  # noqa: F811
            cpu_load) -> Iterator[tuple]:
    """A daemon on the gcp provider (fake Compute Engine, 30 s preemption window), a gs://
    store in the emulator, and the host playing the VMs."""
    fake = FakeCompute(ComputeState(window_s=PREEMPTION_WINDOW_S)).start()
    for key, value in gcs_emulator.env.items():   # the daemon's gs:// client, in this process
        monkeypatch.setenv(key, value)
    bucket = gcs_emulator.make_bucket(f"e2e-{uuid.uuid4().hex[:8]}")
    settings = gcp_settings(fake, str(tmp_home), {"store_uri": f"gs://{bucket}/spotrun"})
    settings = dataclasses.replace(settings, daemon=DAEMON, agent=AGENT)
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text((REPO / "configs" / "demo" / "train.py").read_text())
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: e2e-gcp\ncommand: python train.py {TRAIN_ARGS}\nworkdir: code\n"
                    f"resources: {{instance_types: [{TYPE}]}}\n"
                    "work: {total_steps: 600}\ncheckpoint: {interval_minutes: 1}\n"
                    "policy: {market: spot}\n")
    ctx = build_context(settings, provider=GcpProvider.from_settings(settings),
                        store=open_store(settings.store_url))
    runner = build_runner(ctx)
    host = GceHost(fake.state, tmp_path / "vms", env=gcs_emulator.env).start()
    try:
        yield ctx, runner, host, fake, spec
    finally:
        runner.stop(wait=True)
        host.stop()
        fake.stop()


def notice_saved(store, job_id: str, number: int) -> dict | None:
    """The attempt's notice report once it names the emergency checkpoint."""
    try:
        notice = json.loads(store.get_bytes(layout.notice_key(job_id, number)))
    except (ObjectNotFound, StoreError, ValueError):   # not written yet
        return None
    return notice if notice.get("emergency_checkpoint_step") is not None else None


@pytest.mark.slow
def test_preempted_in_its_30_s_window_resumes_from_gs_bitwise_and_books_gcp(reference_runs,
                                                                           gcp_e2e):
    ctx, runner, host, fake, spec = gcp_e2e
    reference_runs.start(TRAIN_ARGS)   # overlaps the daemon's run; shared with other tests
    job = submit(validate_submission(spec, ctx.settings), ctx.engine)
    runner.start()
    first = running_attempt(ctx, job.id, 1, min_progress=30)
    vm = fake.state.get_instance(zone_of(first.instance_id), first.instance_id)
    # A Spot VM deleted on preemption, labelled with its job and attempt (disk too).
    assert vm["scheduling"]["provisioningModel"] == "SPOT"
    assert vm["scheduling"]["instanceTerminationAction"] == "DELETE"
    for labels in (vm["labels"], vm["disks"][0]["initializeParams"]["labels"]):
        assert labels["spotrun_job"] == job.id and labels["spotrun_attempt"] == "1"
    machine = host.machine(first.instance_id)
    assert machine is not None

    ctx.provider.interrupt([first.instance_id])   # `spotrun interrupt`: a simulated preemption
    notice = wait_for(lambda: notice_saved(ctx.store, job.id, 1), PREEMPTION_WINDOW_S,
                      "the emergency checkpoint, inside the window")
    saved_step = notice["emergency_checkpoint_step"]
    assert notice["emergency_save_s"] < PREEMPTION_WINDOW_S
    wait_for(lambda: first.instance_id not in fake.state.names(),
             PREEMPTION_WINDOW_S + 5, "the preempted VM to be gone")
    assert machine.metadata.values["instance/preempted"] == "TRUE"
    # The agent stopped inside the window: the guest halted before the hard-off.
    assert machine.exited_at is not None and machine.soft_off_at is not None
    assert machine.exited_at - machine.soft_off_at < PREEMPTION_WINDOW_S

    done = finished(ctx, job.id)
    # The daemon books each VM's last seconds once it is gone (a stopped runner runs no loop).
    wait_for(lambda: all_booked(ctx.engine), 60, "every VM's ledger closed")
    runner.stop(wait=True)
    assert done.state is JobState.SUCCEEDED, done.reason
    assert not host.errors, host.errors
    with session(ctx.engine) as s:
        atts = attempts_of(s, job.id)
        rows = list(s.exec(select(SpendEntry).where(SpendEntry.job_id == job.id)))
    assert [a.end_reason for a in atts] == [EndReason.RECLAIMED, EndReason.COMPLETED]
    assert atts[0].instance_cause == TerminationCause.SPOT_RECLAIM.value
    assert atts[0].notice_at is not None
    # The replacement is a new Spot VM that resumed from the notice's checkpoint in gs://.
    assert atts[1].instance_id != atts[0].instance_id and atts[1].market is Market.SPOT
    assert atts[1].start_step == saved_step > 0
    # The finished agent powered its VM off; GCE kept it stopped; spotrun deleted it.
    second = host.machine(atts[1].instance_id)
    assert (second.disk / POWEROFF_FILE).exists()
    wait_for(lambda: atts[1].instance_id not in fake.state.names(), 10,
             "the stopped VM to be deleted")
    assert _sha(job_log(ctx, done)) == reference_runs.sha(TRAIN_ARGS)

    # Booked by GCP's rules: per second with a minute's minimum, a reclaimed Spot VM free only
    # in its first minute; each VM's boot disk at the pd-balanced price.
    rules = rules_for("gcp")
    for att in atts:
        mine = [r for r in rows if r.attempt_id == att.id]
        compute = [r for r in mine if r.kind in SpendKind.instance_kinds()]
        used_s = (att.ended_at - att.started_at).total_seconds()
        billed = rules.billed_seconds(used_s, market=Market.SPOT,
                                      reclaimed_by_provider=att.end_reason is EndReason.RECLAIMED)
        assert abs(sum(r.billed_seconds for r in compute) - billed) < 1.5, (att.number, used_s)
        volume = sum(r.usd for r in mine if r.kind == SpendKind.VOLUME.value)
        vol_s = sum(r.billed_seconds for r in mine if r.kind == SpendKind.VOLUME.value)
        assert vol_s > 0 and abs(volume - rules.volume_usd(200.0, vol_s)) < 1e-9
    [audit] = audit_view(ctx.settings, [job.id])
    assert abs(audit.causes_total_usd() - audit.actual_usd) < 1e-4
    # The on-demand baseline is priced from GCP's catalog in the gcp region.
    assert audit.actual_usd > 0 and audit.baseline_on_demand_usd > 0
