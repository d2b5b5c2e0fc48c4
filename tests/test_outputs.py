"""Job outputs: the spec field, what the agent collects and uploads, and `spotrun pull` errors.

Fast and torch-free except the export test; the daemon round trip is tests/test_outputs_e2e.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from spotrun import layout
from spotrun.agent.outputs import OutputUploader, collect
from spotrun.catalog import load_catalog
from spotrun.cli import cli
from spotrun.errors import SpecError
from spotrun.spec import parse_spec, spec_from_dict
from spotrun.store.file import FileStore


def parse(raw):
    return parse_spec(raw, base_dir=Path("/"), instance_types=load_catalog().names(),
                      zones=["us-east-1a"])


def test_spec_outputs_parse_and_survive_storage():
    spec = parse({"name": "a", "command": "x", "outputs": ["model/*.pt", "metrics.json"]})
    assert spec.outputs == ("model/*.pt", "metrics.json")
    assert spec_from_dict(json.loads(json.dumps(spec.to_dict()))).outputs == spec.outputs
    assert parse({"name": "a", "command": "x"}).outputs == ()


@pytest.mark.parametrize("bad,field", [("model.pt", "outputs"), ([3], "outputs"),
                                       (["/etc/passwd"], "outputs[0]"),
                                       (["ok", "../up/*.pt"], "outputs[1]"), (["~/x"], "outputs[0]")])
def test_spec_outputs_bad_input_names_the_field(bad, field):
    with pytest.raises(SpecError) as err:
        parse({"name": "a", "command": "x", "outputs": bad})
    assert err.value.field == field and err.value.exit_code == 2


def test_submit_with_bad_outputs_exits_2_and_writes_nothing(tmp_home: Path, tmp_path: Path):
    spec = tmp_path / "job.yaml"
    spec.write_text("name: a\ncommand: python x.py\noutputs: ['../secrets']\n")
    out = CliRunner().invoke(cli, ["submit", str(spec)])
    assert out.exit_code == 2 and "outputs[0]" in out.output
    assert "Traceback" not in out.output
    assert not (tmp_home / "spotrun.db").exists()


def test_collect_globs_folders_and_stays_inside_the_job_dir(tmp_path: Path):
    job = tmp_path / "job"
    (job / "final").mkdir(parents=True)
    (job / "final" / "model.safetensors").write_bytes(b"w")
    (job / "final" / ".tmp-partial").write_bytes(b"half")    # a store temp file: never taken
    (job / "metrics.json").write_text("{}")
    (job / "other.txt").write_text("no")
    (tmp_path / "outside.txt").write_text("secret")
    os.symlink(tmp_path / "outside.txt", job / "link.json")
    got = collect(job, ["final", "*.json"])
    assert sorted(got) == ["final/model.safetensors", "metrics.json"]


def test_uploader_sends_changed_files_and_keeps_earlier_attempts(tmp_path: Path):
    store = FileStore(tmp_path / "store")
    job = tmp_path / "job"
    job.mkdir()
    (job / "a.txt").write_text("one")
    first = OutputUploader(store, "j1", 1, job, ["*.txt"])
    first.upload("notice")
    (job / "b.txt").write_text("two")
    index = first.upload("exit")
    assert sorted(index["files"]) == ["a.txt", "b.txt"] and first.passes == 2
    assert index["files"]["a.txt"]["attempt"] == 1 and index["reason"] == "exit"
    # A later attempt on a new machine has only c.txt: a and b stay listed.
    job2 = tmp_path / "job2"
    job2.mkdir()
    (job2 / "c.txt").write_text("three")
    index = OutputUploader(store, "j1", 2, job2, ["*.txt"]).upload("exit")
    assert sorted(index["files"]) == ["a.txt", "b.txt", "c.txt"]
    assert store.get_bytes(f"{layout.outputs_prefix('j1')}/b.txt") == b"two"
    assert json.loads(store.get_bytes(layout.outputs_index_key("j1")))["attempt"] == 2


def test_pull_unknown_job_exits_2(tmp_home: Path):
    out = CliRunner().invoke(cli, ["pull", "no-such-job"])
    assert out.exit_code == 2 and "JOB" in out.output and "Traceback" not in out.output


def test_pull_help_explains():
    out = CliRunner().invoke(cli, ["pull", "--help"])
    assert out.exit_code == 0 and "state_dict" in out.output and "--to" in out.output


EXPORT_LOAD = r'''
import hashlib, sys, torch
model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
model.load_state_dict(torch.load(sys.argv[1], weights_only=True))   # strict: every key
h = hashlib.sha256()
for k, v in sorted(model.state_dict().items()):
    h.update(k.encode()); h.update(v.numpy().tobytes())
assert not [m for m in sys.modules if m.split(".")[0] == "spotrun"]
print(h.hexdigest())
'''


def test_checkpointer_checkpoint_exports_to_a_plain_state_dict(tmp_path: Path):
    torch = pytest.importorskip("torch")
    import hashlib
    import subprocess
    import sys
    from spotrun.checkpoints import latest_verified
    from spotrun.integrations.export import export
    from spotrun.torch import Checkpointer, RuntimeOptions
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    opt = torch.optim.Adam(model.parameters())
    store = FileStore(tmp_path / "ckpt")
    ckpt = Checkpointer(model=model, optimizer=opt, store=store,
                        runtime=RuntimeOptions(install_signal=False))
    for step in range(3):
        opt.zero_grad()
        model(torch.randn(5, 4)).sum().backward()
        opt.step()
    ckpt.finish(3)
    ckpt.close()
    written = export(store, latest_verified(store), tmp_path / "out")
    assert written[0] == "model.pt"
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.numpy().tobytes())
    res = subprocess.run([sys.executable, "-I", "-c", EXPORT_LOAD, str(tmp_path / "out" / "model.pt")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == h.hexdigest()


def test_big_files_log_their_upload_progress(tmp_path: Path, monkeypatch):
    import structlog.testing

    import spotrun.agent.outputs as outputs
    monkeypatch.setattr(outputs, "BIG_FILE_BYTES", 1)
    job = tmp_path / "job"
    job.mkdir()
    (job / "model.bin").write_bytes(b"x" * 1000)
    with structlog.testing.capture_logs() as logs:
        # A fresh logger: the module's may be cached (cache_logger_on_first_use) with the
        # output of whichever test in this process used it first.
        monkeypatch.setattr(outputs, "log", structlog.get_logger("spotrun.agent"))
        OutputUploader(FileStore(tmp_path / "store"), "j1", 1, job, ["model.bin"]).upload("exit")
    progress = [e for e in logs if e["event"] == "outputs_progress"]
    assert progress and progress[-1]["bytes_total"] == 1000 and progress[-1]["path"] == "model.bin"


def test_pull_with_nothing_yet_exits_1_in_one_line(tmp_home: Path, tmp_path: Path):
    from daemon_helpers import submit_job
    spec = tmp_path / "job.yaml"
    spec.write_text("name: nothing\ncommand: python x.py\npolicy: {market: spot}\n")
    job_id = submit_job(tmp_home, spec)
    out = CliRunner().invoke(cli, ["pull", job_id, "--to", str(tmp_path / "dest")])
    assert out.exit_code == 1 and "nothing to pull yet" in out.output
    assert "Traceback" not in out.output and len(out.output.strip().splitlines()) == 1


def test_a_notice_written_before_the_callback_existed_is_seen(tmp_path):
    """The agent writes SPOTRUN_NOTICE_FILE before it signals: a framework still importing
    when the signal came (no handler yet) learns of the notice from the file."""
    from spotrun.integrations._common import Notice
    path = tmp_path / "notice.json"
    path.write_text('{"action": "terminate"}')
    notice = Notice(install=False, notice_file=str(path))
    assert notice.pending
    notice.clear()
    assert not notice.pending              # the same write is one notice, not a stream
    fresh = Notice(install=False, notice_file=str(tmp_path / "none.json"))
    assert not fresh.pending


def test_a_notice_signalled_before_its_file_was_read_is_one_notice(tmp_path):
    """The agent writes the notice file, then signals; when the signal is handled before
    anything looked at the file, the file is still that notice: one emergency save, not two."""
    from spotrun.integrations._common import Notice
    path = tmp_path / "notice.json"
    path.write_text('{"action": "terminate"}')
    notice = Notice(install=False, notice_file=str(path))
    notice.set()                           # what the SIGUSR1 handler does
    assert notice.pending
    notice.clear()                         # the emergency save
    assert not notice.pending
    os.utime(path, (1.0, 1.0))             # a later write of the file is a new notice
    assert notice.pending


def test_pull_on_a_fresh_home_writes_nothing(tmp_home: Path):
    out = CliRunner().invoke(cli, ["pull", "no-such-job"])
    assert out.exit_code == 2 and "Traceback" not in out.output
    assert sorted(p.name for p in tmp_home.iterdir()) == []    # no database was created


def test_pull_outputs_reports_bytes_as_they_arrive(tmp_path: Path):
    from spotrun.pulls import pull_outputs
    store = FileStore(tmp_path / "store")
    job = tmp_path / "job"
    job.mkdir()
    (job / "big.bin").write_bytes(b"x" * 300_000)
    OutputUploader(store, "j1", 1, job, ["*.bin"]).upload("exit")
    seen: list[tuple[str, int, int]] = []
    got = pull_outputs(store, "j1", tmp_path / "dest",
                       progress=lambda rel, done, total: seen.append((rel, done, total)))
    assert [o["path"] for o in got] == ["big.bin"]
    assert seen and seen[-1] == ("big.bin", 300_000, 300_000)
    assert (tmp_path / "dest" / "big.bin").read_bytes() == b"x" * 300_000
