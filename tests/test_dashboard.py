"""`spotrun ui`: JSON routes = the CLI's --json, /metrics, token rules; a real headless browser."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from spotrun.cli import cli
from spotrun.config import load_settings
from spotrun.daemon.spend import SpendLoop
from spotrun.errors import BadInputError
from spotrun.states import EndReason, JobState, Market
from spotrun.store.file import FileStore
from spotrun.ui.server import check_bind, make_server

from test_ledger_support import OD_P3, P3, ZONE, PriceFeed, at, make_attempt, make_job, \
    new_db

JOB = "demo-mlp-0a1b2c"
ZONES = ["us-east-1a", "us-east-1d", "us-east-1c"]


def _demo_like_home(home: Path) -> None:
    """A finished job shaped like the demo's: two reclaims after notices, then on-demand."""
    eng = new_db(home)
    store = FileStore(home / "store")
    make_job(eng, JOB, state=JobState.SUCCEEDED, store_uri=store.uri, last_step=1500,
             work={"total_steps": 1500})
    spans = [(0, 10, 0, 602, EndReason.RECLAIMED), (11, 23, 515, 1414, EndReason.RECLAIMED),
             (24, 90, 1323, 1500, EndReason.COMPLETED)]
    feed = PriceFeed()
    for n, (s, e, r, last, why) in enumerate(spans, start=1):
        od = why is EndReason.COMPLETED
        a = make_attempt(eng, JOB, n, start=at(s), end=at(e), reason=why, start_step=r,
                         last_step=last, running_at=at(s + 2),
                         market=Market.ON_DEMAND if od else Market.SPOT,
                         price=OD_P3 if od else 0.9)
        if why is EndReason.RECLAIMED:
            from spotrun.db import Attempt, session
            with session(eng) as ses:
                row = ses.get(Attempt, a.id)
                row.zone, row.notice_at = ZONES[n - 1], at(e - 2)
                ses.add(row)
                ses.commit()
        feed.set_prices(P3, ZONES[n - 1] if n < 3 else ZONE, [(at(-60), 0.9 + 0.1 * n)])
    store.put_bytes(f"jobs/{JOB}/logs/0001/000000.log", b"start step 0/1500\nstep 100/1500\n")
    feed.clock = at(91)
    SpendLoop(eng, feed, storage_interval_s=1e9).tick(at(91))


@pytest.fixture
def served(tmp_home: Path):
    _demo_like_home(tmp_home)
    server = make_server(load_settings(str(tmp_home)), port=0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", tmp_home
    server.shutdown()
    server.server_close()


def _get(url: str, headers: dict | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _cli_json(home: Path, *args: str):
    res = CliRunner().invoke(cli, [*args, "--json"], env={"SPOTRUN_HOME": str(home)})
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_json_routes_are_the_cli_json_views(served):
    url, home = served
    for route, args in (("/api/status", ["status"]), (f"/api/status/{JOB}", ["status", JOB]),
                        ("/api/audit", ["audit"]), (f"/api/audit/{JOB}", ["audit", JOB])):
        code, body = _get(url + route)
        assert code == 200, body
        web, cli_view = json.loads(body), _cli_json(home, *args)
        if "status" in route:   # the deadline headroom is taken at the moment of the call
            for d in (web if isinstance(web, list) else [web]) + \
                    (cli_view if isinstance(cli_view, list) else [cli_view]):
                d.pop("deadline_headroom_s_market")
        assert web == cli_view, route
    code, body = _get(url + "/api/status/nope")
    assert code == 404 and "no such job" in body
    req = urllib.request.Request(url + "/api/status", method="POST", data=b"{}")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=30)
    assert err.value.code == 405


def test_metrics_in_prometheus_text(served):
    url, home = served
    code, text = _get(url + "/metrics")
    assert code == 200
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    samples = {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in lines}
    [audit] = _cli_json(home, "audit")
    assert samples['spotrun_jobs{state="succeeded"}'] == 1
    assert samples['spotrun_jobs{state="running"}'] == 0
    assert samples[f'spotrun_job_spend_usd{{job="{JOB}"}}'] == pytest.approx(audit["actual_usd"])
    assert samples[f'spotrun_job_saved_usd{{job="{JOB}"}}'] == pytest.approx(audit["saved_usd"])
    assert samples[f'spotrun_job_reclaims{{job="{JOB}"}}'] == 2
    assert "# TYPE spotrun_job_checkpoint_age_wall_seconds gauge" in text


def test_other_addresses_need_a_token(tmp_home):
    with pytest.raises(BadInputError) as err:
        check_bind("0.0.0.0", None)
    assert err.value.field == "--host"
    res = CliRunner().invoke(cli, ["ui", "--host", "0.0.0.0", "--port", "0"],
                             env={"SPOTRUN_HOME": str(tmp_home)})
    assert res.exit_code == 2 and "--token" in res.output
    token = "t" * 24
    server = make_server(load_settings(str(tmp_home)), host="127.0.0.1", port=0, token=token)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/api/status"
        assert _get(url)[0] == 401
        assert _get(url, {"Authorization": "Bearer wrong-token-wrong"})[0] == 401
        assert _get(url, {"Authorization": f"Bearer {token}"})[0] == 200
        assert _get(url + f"?token={token}")[0] == 200
    finally:
        server.shutdown()
        server.server_close()


CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


def _wait(driver, timeout_s: float):
    """A WebDriverWait that reads an element again when the live page swapped it meanwhile
    (an element read while being replaced is stale, not wrong)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait
    return WebDriverWait(driver, timeout_s, ignored_exceptions=(StaleElementReferenceException,))


def _browser():
    """Headless Chromium from the system's packages, or a skip saying what is missing."""
    if not CHROMIUM or not DRIVER:
        pytest.skip("chromium and chromium-driver are not installed "
                    "(apt-get install chromium chromium-driver; .ci/run does it)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed "
                                    "(pip install -e '.[dev]')")
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 f"--user-data-dir={tempfile.mkdtemp(prefix='spotrun-chromium-')}",
                 "--window-size=1000,1300"):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(DRIVER), options=opts)


@pytest.mark.slow
def test_browser_lists_the_job_its_timeline_and_spend_chart(served, tmp_path):
    from selenium.webdriver.common.by import By
    url, home = served
    status = _cli_json(home, "status", JOB)
    [audit] = _cli_json(home, "audit", JOB)
    driver = _browser()
    try:
        def ready(d):
            return d.execute_script("return document.body.dataset.ready === '1'")
        driver.get(url + "/")
        _wait(driver, 60).until(ready)
        row = driver.find_element(By.CSS_SELECTOR, f'#jobs tr[data-job="{JOB}"]')
        assert JOB in row.text and "succeeded" in row.text

        driver.get(url + f"/job/{JOB}")
        _wait(driver, 60).until(ready)
        rects = driver.find_elements(By.CSS_SELECTOR, "#timeline rect.attempt")
        got = sorted((int(r.get_attribute("data-attempt")), r.get_attribute("data-pool"),
                      r.get_attribute("class").split()[-1]) for r in rects)
        want = sorted((a["number"], f"{a['instance_type']} {a['zone']} {a['market']}",
                       a["market"]) for a in status["attempts"])
        assert got == want
        assert {m for _n, _p, m in got} == {"spot", "on-demand"}   # both colours drawn
        assert len(driver.find_elements(By.CSS_SELECTOR, "#timeline line.reclaim")) == 2
        assert len(driver.find_elements(By.CSS_SELECTOR, "#timeline path.notice")) == 2
        last = driver.execute_script(
            "const d = window.spotrun.spendChart.data; return d[1][d[1].length - 1];")
        assert last == pytest.approx(audit["actual_usd"], abs=1e-9)
        assert driver.find_element(By.ID, "causes-total").text.strip() != ""
        shot = tmp_path / "dashboard.png"
        driver.save_screenshot(str(shot))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        driver.quit()


@pytest.mark.slow
def test_browser_follows_a_running_job_live(tmp_home):
    from selenium.webdriver.common.by import By
    from spotrun.db import Job, add_event, session
    eng = new_db(tmp_home)
    make_job(eng, "live-job", state=JobState.RUNNING, last_step=10, work={"total_steps": 100})
    make_attempt(eng, "live-job", 1, start=at(0), start_step=0, last_step=10,
                 running_at=at(1))
    server = make_server(load_settings(str(tmp_home)), port=0)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    driver = _browser()
    try:
        driver.get(f"http://127.0.0.1:{server.server_address[1]}/job/live-job")
        _wait(driver, 60).until(
            lambda d: d.find_element(By.ID, "job-state").text == "running")
        assert "live" in driver.find_element(By.ID, "live").text
        with session(eng) as s:   # the job moves on while the page is open
            job = s.get(Job, "live-job")
            job.state, job.last_step = JobState.SUCCEEDED, 100
            s.add(job)
            add_event(s, "live-job", "succeeded", "after 1 attempt(s)")
            s.commit()
        _wait(driver, 60).until(
            lambda d: d.find_element(By.ID, "job-state").text == "succeeded")
        assert "final" in driver.find_element(By.ID, "live").text
        assert "100/100" in driver.page_source
    finally:
        driver.quit()
        server.shutdown()
        server.server_close()


def test_a_taken_port_is_one_line_not_a_traceback(tmp_home):
    import socket
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    try:
        port = sock.getsockname()[1]
        res = CliRunner().invoke(cli, ["ui", "--port", str(port)],
                                 env={"SPOTRUN_HOME": str(tmp_home)})
    finally:
        sock.close()
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert f"cannot listen on 127.0.0.1:{port}" in res.output and "--port" in res.output
