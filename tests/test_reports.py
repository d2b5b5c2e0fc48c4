"""Agent reports are declared once (spotrun/reports.py): the agent writes them, the daemon reads
the same types back, leniently (a wrong-typed field reads as absent, never a crash)."""

from __future__ import annotations

import json
from pathlib import Path

from spotrun.reports import ExitReport, Heartbeat, Notice, dump, parse_report, read_report
from spotrun.store.file import FileStore

# The keys the agent wrote before the types existed: the daemon of either side reads them.
HEARTBEAT_KEYS = {"ts", "attempt", "phase", "step", "total_steps", "steps_per_s",
                  "last_checkpoint_step", "checkpoint_save_s", "checkpoint_failures",
                  "checkpoint_error_step", "checkpoint_error", "notice", "rebalance",
                  "resumed_from"}
NOTICE_KEYS = {"ts", "action", "time", "signalled_at", "emergency_checkpoint_step",
               "emergency_save_s"}


def test_written_form_keeps_the_old_keys_and_reads_back_equal():
    beat = Heartbeat(ts="2026-01-01T00:00:00+00:00", attempt=2, phase="running", step=40,
                     total_steps=100, steps_per_s=3.5, last_checkpoint_step=30,
                     checkpoint_failures=0, notice=False, resumed_from=10)
    assert set(dump(beat)) == HEARTBEAT_KEYS
    assert parse_report(json.dumps(dump(beat)).encode(), Heartbeat) == beat
    notice = Notice(ts="t", action="terminate", time="t2", emergency_checkpoint_step=7)
    assert set(dump(notice)) == NOTICE_KEYS
    assert parse_report(json.dumps(dump(notice)).encode(), Notice) == notice
    done = ExitReport(ts="t", exit_code=0, reason="completed", step=100)
    assert parse_report(json.dumps(dump(done)).encode(), ExitReport) == done


def test_wrong_typed_fields_read_as_absent_and_unknown_keys_are_ignored():
    raw = {"step": "40", "steps_per_s": 2, "checkpoint_failures": True, "phase": "running",
           "total_steps": 100, "from_a_newer_agent": {"x": 1}}
    beat = parse_report(json.dumps(raw).encode(), Heartbeat)
    assert (beat.step, beat.steps_per_s, beat.checkpoint_failures) == (None, 2.0, None)
    assert (beat.phase, beat.total_steps) == ("running", 100)


def test_unreadable_reports_are_none(tmp_path: Path):
    store = FileStore(tmp_path)
    assert read_report(store, "jobs/j/attempts/1/heartbeat.json", Heartbeat) is None
    store.put_bytes("a/exit.json", b"[1, 2]")
    store.put_bytes("b/exit.json", b"{not json")
    assert read_report(store, "a/exit.json", ExitReport) is None
    assert read_report(store, "b/exit.json", ExitReport) is None
    store.put_bytes("c/exit.json", json.dumps({"exit_code": 3, "reason": "error"}).encode())
    assert read_report(store, "c/exit.json", ExitReport) == ExitReport(exit_code=3,
                                                                       reason="error")
