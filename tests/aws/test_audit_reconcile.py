"""`spotrun audit --reconcile` against Cost Explorer on moto, and PriceLoop on moto's injected prices.

moto serves ce:GetCostAndUsage from a queue of results set through its
/moto-api/static/ce/cost-and-usage-results endpoint; a denied caller is a tiny server on
127.0.0.1 answering with the real JSON-protocol error.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlmodel import select

from spotrun.cli import cli
from spotrun.daemon.price_loop import PriceLoop
from spotrun.db import Attempt, Job, PricePoint, SpendEntry, open_db, session
from spotrun.states import AttemptState, EndReason, JobState, Market

from .moto_fixtures import ACCOUNT

NOW = datetime.now(timezone.utc)


def _home(tmp_path: Path, endpoint: str, monkeypatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "spotrun.toml").write_text(
        f'provider = "aws"\n[aws]\nendpoint_url = "{endpoint}"\nretry_attempts = 1\n'
        'spot_advisor_url = ""\n')
    monkeypatch.setenv("SPOTRUN_HOME", str(home))
    monkeypatch.delenv("SPOTRUN_DB_URL", raising=False)
    return home


def _job(eng, job_id: str, ended: datetime, usd: float) -> None:
    """A finished job: one spot attempt of 2 h ending at `ended`, its ledger rows."""
    start = ended - timedelta(hours=2)
    with session(eng) as s:
        s.add(Job(id=job_id, name=job_id, state=JobState.SUCCEEDED,
                  spec_json=json.dumps({"name": job_id}), store_uri="s3://b/x",
                  checkpoint_uri="s3://b/x/c"))
        s.flush()
        s.add(Attempt(job_id=job_id, number=1, market=Market.SPOT, instance_type="p3.2xlarge",
                      zone="us-east-1a", price_usd_per_hour=0.9, client_token=f"t-{job_id}",
                      started_at=start, ended_at=ended, end_reason=EndReason.COMPLETED,
                      state=AttemptState.ENDED))
        s.flush()
        s.add(SpendEntry(job_id=job_id, attempt_id=1, kind="compute", start=start, end=ended,
                         billed_seconds=7200, price_usd_per_hour=usd / 2, usd=usd * 0.9))
        s.add(SpendEntry(job_id=job_id, kind="volume", start=start, end=ended,
                         billed_seconds=7200, price_usd_per_hour=0, usd=usd * 0.1))
        s.add(SpendEntry(job_id=job_id, kind="storage", start=start, end=ended,
                         billed_seconds=0, price_usd_per_hour=0, usd=9.0))   # untagged: left out
        s.commit()


def _ce_results(url: str, results: list[dict]) -> None:
    from moto.ce.models import ce_backends
    backend = ce_backends[ACCOUNT]["global"]
    backend.cost_usage_results_queue.clear()
    backend.cost_usage_results.clear()
    req = urllib.request.Request(f"{url}/moto-api/static/ce/cost-and-usage-results",
                                 data=json.dumps({"results": results}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 201


def _group(job_id: str, usd: float) -> dict:
    return {"Keys": [f"spotrun:job${job_id}"],
            "Metrics": {"UnblendedCost": {"Amount": str(usd), "Unit": "USD"}}}


def test_reconcile_compares_ledger_with_cost_explorer(moto, tmp_path, monkeypatch):
    home = _home(tmp_path, moto.url, monkeypatch)
    eng = open_db(f"sqlite:///{home / 'spotrun.db'}")
    _job(eng, "old-a", NOW - timedelta(days=3), 1.40)
    _job(eng, "old-b", NOW - timedelta(days=3), 2.00)
    _job(eng, "fresh", NOW - timedelta(hours=1), 0.50)
    day = (NOW - timedelta(days=3)).date()
    _ce_results(moto.url, [{"ResultsByTime": [
        {"TimePeriod": {"Start": day.isoformat(), "End": (day + timedelta(days=1)).isoformat()},
         "Groups": [_group("old-a", 1.0), _group("someone-else", 7.0)], "Estimated": False},
        {"TimePeriod": {"Start": (day + timedelta(days=1)).isoformat(),
                        "End": (day + timedelta(days=2)).isoformat()},
         "Groups": [_group("old-a", 0.5), {"Keys": ["spotrun:job$"], "Metrics": {
             "UnblendedCost": {"Amount": "3.0", "Unit": "USD"}}}], "Estimated": True}],
        "DimensionValueAttributes": []}])
    res = CliRunner().invoke(cli, ["audit", "--reconcile", "--json"])
    assert res.exit_code == 0, res.output
    lines = {ln["id"]: ln for ln in json.loads(res.output)}
    a = lines["old-a"]
    assert a["ledger_usd"] == pytest.approx(1.40)           # instance + volume, not storage
    assert a["cost_explorer_usd"] == pytest.approx(1.50)
    assert a["difference_usd"] == pytest.approx(0.10)
    assert a["estimated"] is True and a["could_not_check"] is None
    assert lines["old-b"]["cost_explorer_usd"] is None
    assert lines["old-b"]["could_not_check"] == "no cost under tag spotrun:job=old-b"
    assert lines["fresh"]["could_not_check"].startswith("no data yet")
    table = CliRunner().invoke(cli, ["audit", "--reconcile"], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "could not check: no data yet" in table.output


class _Denied(BaseHTTPRequestHandler):
    """Cost Explorer for a caller without ce:GetCostAndUsage (JSON 1.1 protocol error)."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"__type": "AccessDeniedException",
                           "Message": "User is not authorized to perform: ce:GetCostAndUsage"})
        self.send_response(400)
        self.send_header("Content-Type", "application/x-amz-json-1.1")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args) -> None:
        pass


def test_denied_cost_explorer_says_why_per_job(tmp_path, monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Denied)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
            monkeypatch.setenv(k, v)
        home = _home(tmp_path, f"http://127.0.0.1:{server.server_address[1]}", monkeypatch)
        eng = open_db(f"sqlite:///{home / 'spotrun.db'}")
        _job(eng, "job-x", NOW - timedelta(days=2), 1.0)
        res = CliRunner().invoke(cli, ["audit", "--reconcile", "--json"])
    finally:
        server.shutdown()
    assert res.exit_code == 0, res.output
    [line] = json.loads(res.output)
    assert line["ledger_usd"] == pytest.approx(1.0) and line["cost_explorer_usd"] is None
    assert line["could_not_check"].startswith("access denied to Cost Explorer")


def test_reconcile_needs_the_aws_provider(tmp_home):
    res = CliRunner().invoke(cli, ["audit", "--reconcile"])
    assert res.exit_code == 2 and "--reconcile" in res.output


def test_price_loop_records_moto_injected_prices(moto, provider, tmp_path):
    now = provider.now()
    pts = [("p3.2xlarge", "us-east-1a", now - timedelta(hours=2), 0.91),
           ("p3.2xlarge", "us-east-1a", now - timedelta(minutes=30), 1.05),
           ("p3.2xlarge", "us-east-1b", now - timedelta(hours=1), 0.95)]
    moto.layer.set_prices(pts)
    eng = open_db(f"sqlite:///{tmp_path / 'spotrun.db'}")
    with session(eng) as s:
        s.add(Job(id="j", name="j", state=JobState.RUNNING, spec_json="{}",
                  store_uri="s3://b/x", checkpoint_uri="s3://b/x/c"))
        s.flush()
        s.add(Attempt(job_id="j", number=1, market=Market.SPOT, instance_type="p3.2xlarge",
                      zone="us-east-1a", price_usd_per_hour=0.9, client_token="t",
                      state=AttemptState.RUNNING))
        s.commit()
    loop = PriceLoop(eng, provider)
    assert loop.tick().points_added == 3
    assert loop.tick().points_added == 0
    with session(eng) as s:
        got = sorted((p.zone, p.price_usd_per_hour, p.source)
                     for p in s.exec(select(PricePoint)))
    assert got == [("us-east-1a", 0.91, "aws"), ("us-east-1a", 1.05, "aws"),
                   ("us-east-1b", 0.95, "aws")]
