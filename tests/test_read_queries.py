"""Read views in a bounded number of queries (issue 24): `status --json`, `audit --json`, every
dashboard JSON route and `/metrics` run as many SQL statements at 200 jobs as at 10.

Homes are filled by bench/reads.py's `fill_home` through the product's own writers (submit,
the scheduler's attempt and node intents, the state moves, events, the spend loop's
booking) in six shapes that repeat: queued, running, succeeded after a reclaim, failed,
recovering, a running two-node attempt. Statements are counted with SQLAlchemy's
`before_cursor_execute` on every engine (the CLI opens its own).
"""

from __future__ import annotations

import json
import sys
import threading
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest
from click.testing import CliRunner
from sqlalchemy import event
from sqlalchemy.engine import Engine

from spotrun.cli import cli
from spotrun.config import load_settings
from spotrun.ui.server import make_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from reads import SHAPES, fill_home  # noqa: E402

SMALL, LARGE = 10, 200
FINISHED = SHAPES.index("succeeded")   # the job the per-job routes show


@contextmanager
def counting() -> Iterator[list[str]]:
    """Every SQL statement any engine runs inside the block."""
    seen: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)
    event.listen(Engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", count)


def _cli(home: Path, *args: str) -> Any:
    res = CliRunner().invoke(cli, [*args, "--json"], env={"SPOTRUN_HOME": str(home)})
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as r:
        assert r.status == 200
        return r.read().decode()


def _statements(home: Path) -> dict[str, int]:
    """Statements per read, each read once, on a fresh server (no audit kept yet)."""
    job = _cli(home, "status")[FINISHED]["id"]
    out: dict[str, int] = {}
    for name, args in (("status --json", ["status"]), ("audit --json", ["audit"]),
                       ("status --events --json", ["status", "--events"])):
        with counting() as seen:
            _cli(home, *args)
        out[name] = len(seen)
    server = make_server(load_settings(str(home)), port=0)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for route in ("/api/status", f"/api/status/{job}", "/api/audit", f"/api/audit/{job}",
                      f"/api/page/{job}", "/metrics", "/api/audit"):
            with counting() as seen:
                _get(base + route)
            out.setdefault(route.replace(job, "<id>"), len(seen))
    finally:
        server.shutdown()
        server.server_close()
    return out


@pytest.fixture(scope="module")
def homes(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("reads")
    for n in (SMALL, LARGE):
        fill_home(root / f"home-{n}", n)
    return {n: root / f"home-{n}" for n in (SMALL, LARGE)}


def test_every_read_runs_as_many_statements_at_200_jobs_as_at_10(homes):
    small, large = _statements(homes[SMALL]), _statements(homes[LARGE])
    assert all(n > 0 for n in small.values()), small   # the counter sees the reads
    grew = {k: (small[k], large[k]) for k in small if large[k] != small[k]}
    assert not grew, f"statements per read grew with the job count (10 -> 200 jobs): {grew}"


def test_bulk_views_equal_each_jobs_own_view(homes):
    # The list views read every job's rows at once; one job's view reads only its own.
    home = homes[SMALL]
    listed, audits = _cli(home, "status"), _cli(home, "audit")
    assert [j["state"] for j in listed[:len(SHAPES)]] == [
        "queued", "running", "succeeded", "failed", "recovering", "running"]
    assert sum(len(j["attempts"]) for j in listed) > len(listed) / 2
    assert sum(a["ledger_rows"] for a in audits) > 0
    for d, a in zip(listed, audits):
        one = _cli(home, "status", d["id"])
        for view in (d, one):
            view.pop("deadline_headroom_s_market")   # taken at the moment of the call
        one.pop("events")
        assert one == d
        assert _cli(home, "audit", d["id"]) == [a]


def test_a_long_id_list_reads_whole_tables_with_the_same_result(homes, monkeypatch):
    # Past MAX_IN_IDS ids a read drops the IN list (SQLite caps bound parameters) and picks
    # its jobs' rows out of the whole table: the audit must not change.
    import spotrun.db.queries as db
    from spotrun.ui.views import audit_view
    settings = load_settings(str(homes[SMALL]))
    ids = [j["id"] for j in _cli(homes[SMALL], "status")][1:6]
    want = [a.to_dict() for a in audit_view(settings, ids)]
    monkeypatch.setattr(db, "MAX_IN_IDS", 2)
    with counting() as seen:
        got = [a.to_dict() for a in audit_view(settings, ids)]
    assert got == want and [a["id"] for a in got] == ids
    assert not any(" IN (" in s for s in seen if "FROM attempt" in s)
