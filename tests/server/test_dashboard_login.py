"""The dashboard on the team server: login, session cookie, CSRF, 401/redirects, the trail
panel; over real uvicorn on 127.0.0.1 (HTTP, HTTPS) and in headless Chromium."""

from __future__ import annotations

import re
import socket
import ssl
import threading
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import uvicorn

from spotrun.config import load_settings
from spotrun.db import utcnow
from spotrun.server import identity, sessions
from spotrun.server.app import create_app
from spotrun.server.identity import Principal

from polling import wait_for
from server.harness import Team
from test_dashboard import JOB, _browser, _demo_like_home

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def _web(team: Team) -> httpx.Client:
    """A browser-like client: keeps cookies, does not follow redirects."""
    return httpx.Client(base_url=team.url, timeout=30, follow_redirects=False)


def _login(web: httpx.Client, token: str, next_path: str = "/") -> httpx.Response:
    page = web.get("/login", params={"next": next_path})
    assert page.status_code == 200
    csrf = CSRF.search(page.text)[1]
    return web.post("/login", data={"token": token, "csrf": csrf, "next": next_path})


def _trail(team: Team, action: str) -> list[tuple[str, str]]:
    rows = team.client("ada").get("/api/v1/trail").json()
    return [(r["user"], r["outcome"]) for r in rows if r["action"] == action]


def test_without_a_session_pages_go_to_the_login_and_json_is_401(team):
    web = _web(team)
    r = web.get("/")
    assert r.status_code == 303 and r.headers["location"] == "/login?next=/"
    r = web.get("/job/some-job")
    assert r.status_code == 303 and r.headers["location"] == "/login?next=/job/some-job"
    for route in ("/api/status", "/api/audit", "/api/budgets", "/api/page/x", "/metrics",
                  "/api/session", "/api/trail"):
        r = web.get(route)
        assert r.status_code == 401, route
        assert r.json()["field"] == "session" and "/login" in r.json()["hint"]
    # A stale or forged session cookie is no session.
    web.cookies.set(sessions.COOKIE, "forged-session-id")
    assert web.get("/api/status").status_code == 401
    # The vendored assets need no login (the login page uses them): offline, no CDN.
    assert web.get("/static/app.css").status_code == 200
    assert web.get("/static/uPlot.iife.min.js").status_code == 200
    # A bearer token opens the JSON as on the API.
    assert team.client("vera").get("/api/status").status_code == 200
    assert team.client(None).get("/api/status",
                                 headers={"Authorization": "Bearer nope"}).status_code == 401


def test_login_cookie_flags_and_logout_with_its_csrf_token(team):
    web = _web(team)
    r = _login(web, team.tokens["alice"], "/job/x")
    assert r.status_code == 303 and r.headers["location"] == "/job/x"
    cookie = [c for c in r.headers.get_list("set-cookie")
              if c.startswith(sessions.COOKIE + "=")][0]
    flags = {f.strip().split("=")[0].lower() for f in cookie.split(";")}
    assert {"httponly", "max-age", "path"} <= flags and "secure" not in flags   # plain HTTP
    assert "samesite=strict" in cookie.lower() and "max-age=43200" in cookie.lower()
    session_id = web.cookies[sessions.COOKIE]
    assert team.tokens["alice"] not in cookie and session_id not in str(
        team.client("ada").get("/api/v1/trail").json())

    assert web.get("/api/status").status_code == 200
    assert web.get("/").status_code == 200 and "app.js" in web.get("/").text
    me = web.get("/api/session").json()
    assert me["user"] == "alice" and me["role"] == "member" and me["csrf"]
    assert web.get("/api/trail").status_code == 403   # members see no trail

    # Logout without, or with another, CSRF token: refused, the session lives on.
    assert web.post("/logout", data={}).status_code == 403
    assert web.post("/logout", data={"csrf": "x" * 32}).status_code == 403
    assert web.get("/api/status").status_code == 200

    r = web.post("/logout", data={"csrf": me["csrf"]})
    assert r.status_code == 303 and r.headers["location"] == "/login"
    cleared = [c for c in r.headers.get_list("set-cookie") if c.startswith(sessions.COOKIE)][0]
    assert 'max-age=0' in cleared.lower()
    # The server forgot it: the same cookie sent again opens nothing.
    replay = _web(team)
    replay.cookies.set(sessions.COOKIE, session_id)
    assert replay.get("/api/status").status_code == 401
    assert _trail(team, "login") == [("alice", "ok")]
    assert _trail(team, "logout") == [("alice", "denied"), ("alice", "denied"), ("alice", "ok")]


def test_login_form_without_its_csrf_token_is_refused(team):
    web = _web(team)
    r = web.post("/login", data={"token": team.tokens["alice"], "csrf": "forged"})
    assert r.status_code == 403 and "expired or came from another site" in r.text
    assert sessions.COOKIE not in web.cookies
    assert _trail(team, "login") == [("", "denied")]


def test_bad_logins_count_against_the_bad_token_limiter(team):
    web = _web(team)
    for _ in range(5):   # the harness's limiter: 5 failures a minute per address
        r = _login(web, "spotrun_0123456789ab_wrong")
        assert r.status_code == 401 and "unknown or revoked API token" in r.text
        assert sessions.COOKIE not in web.cookies
    r = _login(web, team.tokens["alice"])   # even the right token waits now
    assert r.status_code == 429 and "too many bad tokens" in r.text
    assert int(r.headers["retry-after"]) >= 1
    # One limiter: the API's bearer tokens from this address wait too.
    assert team.client("vera").get("/api/v1/whoami").status_code == 429
    team.clock[0] += 61
    assert _login(web, team.tokens["alice"]).status_code == 303
    assert _trail(team, "login") == [("", "denied")] * 6 + [("alice", "ok")]


def test_revoking_the_token_ends_its_sessions(team):
    web = _web(team)
    assert _login(web, team.tokens["bob"]).status_code == 303
    assert web.get("/api/status").status_code == 200
    identity.revoke(team.engine, "bob")
    assert web.get("/api/status").status_code == 401
    assert web.get("/").status_code == 303


def test_a_session_expires(team):
    principal = identity.authenticate(team.engine, team.tokens["alice"])
    now = utcnow()
    sid, login = sessions.start(team.engine, principal, ttl_s=60, remote_addr="127.0.0.1",
                                now=now)
    assert sessions.find(team.engine, sid, now=now + timedelta(seconds=59)) == login
    assert sessions.find(team.engine, sid, now=now + timedelta(seconds=60)) is None
    # The next login sweeps the expired row away.
    sessions.start(team.engine, Principal("bob", "member", principal.token_id), ttl_s=60,
                   remote_addr="", now=now + timedelta(seconds=61))
    assert sessions.find(team.engine, sid, now=now) is None


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (PEM files)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = utcnow()
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(days=1)).not_valid_after(now + timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_over_tls_the_cookies_are_secure(team, tmp_path):
    cert, key = _self_signed(tmp_path)
    app = create_app(load_settings(str(team.home)), engine=team.engine)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off",
                                           ssl_certfile=str(cert), ssl_keyfile=str(key)))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"https://127.0.0.1:{sock.getsockname()[1]}"
    web = httpx.Client(base_url=url, verify=ssl.create_default_context(cafile=str(cert)),
                       timeout=30, follow_redirects=False)
    try:

        def answers() -> bool:
            try:
                return web.get("/api/v1/health").status_code == 200
            except httpx.HTTPError:
                return False
        wait_for(answers, timeout_s=30, what="the TLS server to answer")
        page = web.get("/login")
        assert "secure" in page.headers["set-cookie"].lower()
        r = web.post("/login", data={"token": team.tokens["alice"],
                                     "csrf": CSRF.search(page.text)[1], "next": "/"})
        assert r.status_code == 303
        cookie = [c for c in r.headers.get_list("set-cookie")
                  if c.startswith(sessions.COOKIE + "=")][0]
        assert {f.strip().lower() for f in cookie.split(";")} >= {"httponly", "secure",
                                                                  "samesite=strict"}
    finally:
        # A keep-alive connection left open holds uvicorn's shutdown for the join's whole
        # timeout: the client goes first.
        web.close()
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
    assert not thread.is_alive(), "the TLS server did not stop"


@pytest.mark.slow
def test_browser_login_job_page_trail_and_logout(team):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import ui
    _demo_like_home(team.home)
    driver = _browser()

    def WebDriverWait(d, timeout_s):   # noqa: N802 (selenium's name, one more ignore)
        # A form post replaces the page: an element read just before it goes stale.
        return ui.WebDriverWait(d, timeout_s,
                                ignored_exceptions=(StaleElementReferenceException,))
    try:
        def ready(d):
            return d.execute_script("return document.body.dataset.ready === '1'")
        driver.get(team.url + "/")
        WebDriverWait(driver, 60).until(lambda d: "/login" in d.current_url)

        driver.find_element(By.ID, "token").send_keys("spotrun_0123456789ab_wrong")
        driver.find_element(By.ID, "login-submit").click()
        WebDriverWait(driver, 60).until(
            lambda d: "unknown or revoked API token" in d.find_element(By.ID, "login-error").text)

        driver.find_element(By.ID, "token").send_keys(team.tokens["ada"])
        driver.find_element(By.ID, "login-submit").click()
        WebDriverWait(driver, 60).until(ready)
        row = driver.find_element(By.CSS_SELECTOR, f'#jobs tr[data-job="{JOB}"]')
        assert "succeeded" in row.text
        assert driver.find_element(By.ID, "who").text == "ada (admin)"
        trail_text = driver.find_element(By.ID, "trail").text   # admins see the trail
        assert "login" in trail_text and "denied" in trail_text and "ok" in trail_text

        row.find_element(By.TAG_NAME, "a").click()
        WebDriverWait(driver, 60).until(
            lambda d: d.find_elements(By.ID, "job-id") and
            d.find_element(By.ID, "job-id").text == JOB)
        assert len(driver.find_elements(By.CSS_SELECTOR, "#timeline rect.attempt")) == 3

        driver.find_element(By.ID, "logout-button").click()
        WebDriverWait(driver, 60).until(lambda d: d.find_elements(By.ID, "login"))
        assert driver.current_url.endswith("/login")
        driver.get(team.url + f"/job/{JOB}")   # the session is gone: back to the login
        WebDriverWait(driver, 60).until(lambda d: d.find_elements(By.ID, "login"))
    finally:
        driver.quit()
    assert _trail(team, "logout") == [("ada", "ok")]
