"""Talking to a market: MarketClient (stdlib HTTP), start one detached, or reuse a live one.

The daemon never owns the market process: ensure_market() starts it in its own
session (it outlives its parent) and later callers find it via DIR/market.json.
"""

from __future__ import annotations

import fcntl
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

from spotrun.errors import BadInputError, ProviderError
from spotrun.providers.local.market import procs
from spotrun.providers.local.market.options import MarketOptions

MARKET_JSON = "market.json"
START_LOCK = "start.lock"
LOG_FILE = "market.log"


class MarketRefused(ProviderError):
    """The market answered 409: no candidate pool had capacity (reasons per pool)."""

    def __init__(self, reasons: dict[str, str]) -> None:
        text = "; ".join(f"{k}: {v}" for k, v in reasons.items())
        super().__init__(f"no capacity: {text}"[:450], field="pool")
        self.reasons = reasons


# A kept connection the server closed while idle fails with one of these before any answer:
# the request is sent once more on a new connection.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


class MarketClient:
    """JSON over HTTP to one market on 127.0.0.1, one kept-alive connection per thread."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        parts = urllib.parse.urlsplit(self.url)
        self._host, self._port, self._prefix = parts.hostname or "127.0.0.1", parts.port, \
            parts.path
        self._local = threading.local()

    def request(self, method: str, path: str, body: dict[str, Any] | None = None,
                query: dict[str, Any] | None = None) -> Any:
        """One call; raises ProviderError (unreachable, 5xx), BadInputError (400), MarketRefused."""
        target = self._prefix + path
        if query:
            target += "?" + urllib.parse.urlencode(
                {k: v for k, v in query.items() if v is not None})
        data = json.dumps(body).encode() if body is not None else None
        status, raw = self._exchange(method, target, data)
        if status < 400:
            return json.loads(raw or b"null")
        payload = _json_or_empty(raw)
        if status == 409:
            raise MarketRefused(payload.get("reasons") or {})
        if status == 400:
            raise BadInputError(payload.get("error", "bad request"), field=payload.get("field"))
        raise ProviderError(f"market {method} {path}: HTTP {status} "
                            f"{payload.get('error', '')}", field="market", value=self.url)

    def _exchange(self, method: str, target: str, data: bytes | None) -> tuple[int, bytes]:
        """(status, body) over this thread's connection; a kept one found closed is replaced
        once."""
        kept = getattr(self._local, "conn", None) is not None
        try:
            return self._once(method, target, data)
        except _STALE as exc:
            if not kept:
                raise self._unreachable(exc) from None
        try:
            return self._once(method, target, data)
        except _STALE as exc:
            raise self._unreachable(exc) from None

    def _once(self, method: str, target: str, data: bytes | None) -> tuple[int, bytes]:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPConnection(self._host, self._port,
                                                                 timeout=self.timeout_s)
        try:
            conn.request(method, target, body=data, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            raw = resp.read()
        except _STALE:
            self.close()
            raise
        except (http.client.HTTPException, OSError) as exc:
            self.close()
            raise self._unreachable(exc) from None
        if resp.will_close:
            self.close()   # a server that closes after each answer (HTTP/1.0)
        return resp.status, raw

    def _unreachable(self, exc: BaseException) -> ProviderError:
        return ProviderError(f"market not reachable: {exc}", field="market", value=self.url,
                             hint="`spotrun market status`")

    def close(self) -> None:
        """Close this thread's connection (the next call opens a new one)."""
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def faults(self, *, throttle_fraction: float = 0.0, capacity_fraction: float = 0.0,
               seed: int = 0) -> dict[str, Any]:
        """POST /admin/faults: refuse a seeded share of calls (503) and launches (409)."""
        return self.request("POST", "/admin/faults", {
            "throttle_fraction": throttle_fraction, "capacity_fraction": capacity_fraction,
            "seed": seed})["faults"]

    def fault_counts(self) -> dict[str, Any]:
        """GET /admin/faults: the fractions and how many calls failed so far."""
        return self.request("GET", "/admin/faults")["faults"]

    def health(self) -> dict[str, Any]:
        """GET /health."""
        return self.request("GET", "/health")

    def time(self) -> dict[str, Any]:
        """GET /time: market time and clock parameters."""
        return self.request("GET", "/time")

    def pools(self, instance_types: list[str] | None = None) -> list[dict[str, Any]]:
        """Per type and zone: availability and prices now (default: the trace's type)."""
        query = {"instance_types": ",".join(instance_types) if instance_types else None}
        return self.request("GET", "/pools", query=query)["pools"]

    def instances(self, *, job_id: str | None = None,
                  ids: list[str] | None = None) -> list[dict[str, Any]]:
        """Instances, optionally of one job or these ids."""
        query = {"job_id": job_id, "ids": ",".join(ids) if ids is not None else None}
        if ids is not None and not ids:
            return []
        return self.request("GET", "/instances", query=query)["instances"]

    def launch(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST /instances; raises MarketRefused when no candidate has capacity.

        Local instances run on the caller's machine, so their environment is the
        caller's: the `env:` secrets their agent config names travel with the launch
        (`instance_env`), only in memory; the market never stores them and never
        holds them in its own environment (see market_environment).
        """
        if "instance_env" not in body:
            body = dict(body, instance_env=instance_env_for(str(body.get("user_data") or "")))
        return self.request("POST", "/instances", body)["instance"]

    def terminate(self, instance_id: str) -> dict[str, Any] | None:
        """Terminate (idempotent; unknown ids are fine)."""
        path = "/instances/" + urllib.parse.quote(instance_id, safe="") + "/terminate"
        return self.request("POST", path, {})["instance"]

    def price(self, instance_type: str, zone: str) -> float | None:
        """Spot price now."""
        return self.request("GET", "/prices", query={"instance_type": instance_type,
                                                     "zone": zone})["price_usd_per_hour"]

    def price_history(self, instance_type: str, zones: list[str], start_s: float,
                      end_s: float) -> list[dict[str, Any]]:
        """Change points in [start_s, end_s] (market clock)."""
        return self.request("GET", "/price-history", query={
            "instance_type": instance_type, "zones": ",".join(zones), "start_s": repr(start_s),
            "end_s": repr(end_s)})["points"]

    def status(self) -> dict[str, Any]:
        """GET /status: clock, options, pools, instances."""
        return self.request("GET", "/status")

    def interrupt(self, instance_id: str, in_s: float, notice: bool = True) -> dict[str, Any]:
        """Force a reclaim in_s market seconds from now, or sooner (a pending one is never
        moved later): the instance's view, plus `already_noticed` and `reclaim_in_s`."""
        got = self.request("POST", "/admin/interrupt", {"instance_id": instance_id,
                                                        "in_s": in_s, "notice": notice})
        return {**got["instance"], "already_noticed": bool(got.get("already_noticed")),
                "reclaim_in_s": got.get("reclaim_in_s")}

    def stop(self) -> None:
        """Ask the market to terminate its instances and exit."""
        self.request("POST", "/admin/stop", {})


# What the market process keeps of its starter's environment: what a host needs to run
# Python, GPUs and an s3:// store. Anything else (a job's `env:` secret above all) stays
# out of the market; a launch brings the variables its job refers to (instance_env_for).
KEEP_ENV = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR",
            "TERM", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHASHSEED", "PYTHONUNBUFFERED",
            "PYTHONDONTWRITEBYTECODE", "LD_LIBRARY_PATH", "SPOTRUN_HOME", "SSL_CERT_FILE",
            "REQUESTS_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy",
            "https_proxy", "no_proxy"}
KEEP_ENV_PREFIXES = ("LC_", "XDG_", "CUDA_", "NVIDIA_", "NCCL_", "OMP_", "MKL_", "TORCH_", "HF_",
                     "AWS_", "COV_CORE_", "COVERAGE_")


def market_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment to start a market with: the host basics of KEEP_ENV, nothing else."""
    env = dict(os.environ if environ is None else environ)
    return {k: v for k, v in env.items()
            if k in KEEP_ENV or k.startswith(KEEP_ENV_PREFIXES)}


def instance_env_for(user_data: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The caller's values of the variables an agent config's `env:` secrets refer to."""
    env = os.environ if environ is None else environ
    try:
        refs = json.loads(user_data).get("secrets") or {}
    except (ValueError, AttributeError):
        return {}
    out = {}
    for ref in refs.values() if isinstance(refs, dict) else []:
        kind, _, var = str(ref).partition(":")
        if kind == "env" and var in env:
            out[var] = env[var]
    return out


def _json_or_empty(raw: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return obj if isinstance(obj, dict) else {}


def read_live_info(state_dir: Path) -> dict[str, Any] | None:
    """DIR/market.json if its process still runs (same pid and start time), else None."""
    try:
        info = json.loads((Path(state_dir) / MARKET_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or not procs.is_alive(info.get("pid"),
                                                        info.get("pid_start_ticks")):
        return None
    return info


def _pause(seconds: float) -> None:
    threading.Event().wait(seconds)


def _log_tail(path: Path, chars: int = 400) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-chars:].strip()
    except OSError:
        return ""


def start_detached(state_dir: Path, options: MarketOptions,
                   timeout_s: float = 30.0) -> MarketClient:
    """Start `spotrun market serve` in a new session; wait (with a deadline) until it answers."""
    state_dir = Path(state_dir).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "spotrun", "market", "serve", "--state-dir",
            str(state_dir)] + options.validate().to_argv()
    log_path = state_dir / LOG_FILE
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, cwd=state_dir, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env=market_environment())
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = read_live_info(state_dir)
        if info and info.get("pid") == proc.pid:
            client = MarketClient(info["url"])
            try:
                client.health()
            except ProviderError:
                pass
            else:
                # Reap it when it exits, so a long-lived caller keeps no zombie.
                threading.Thread(target=proc.wait, daemon=True).start()
                return client
        if proc.poll() is not None:
            raise ProviderError(f"market exited with {proc.returncode}: {_log_tail(log_path)}",
                                field="market", value=str(state_dir))
        _pause(0.05)
    raise ProviderError(f"market not ready after {timeout_s:.0f} s", field="market",
                        value=str(state_dir), hint=f"see {log_path}")


def ensure_market(state_dir: Path, options: MarketOptions,
                  timeout_s: float = 30.0) -> MarketClient:
    """A client for the live market in state_dir, starting one (detached) if none runs."""
    state_dir = Path(state_dir).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / START_LOCK, "w") as lock:
        # One starter at a time, so two callers never start two markets on one dir.
        fcntl.flock(lock, fcntl.LOCK_EX)
        info = read_live_info(state_dir)
        if info:
            client = MarketClient(info["url"])
            try:
                client.health()
                return client
            except ProviderError:
                pass   # a live pid that does not answer: start anew (the lock file decides)
        return start_detached(state_dir, options, timeout_s)


def stop_market(state_dir: Path, timeout_s: float = 30.0) -> bool:
    """Stop the market of state_dir (its instances first); False if none was running."""
    info = read_live_info(Path(state_dir))
    if not info:
        return False
    pid = int(info["pid"])
    try:
        MarketClient(info["url"]).stop()
    except ProviderError:
        os.kill(pid, signal.SIGTERM)   # not answering: stop the process; instances stay
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not procs.is_alive(pid, info.get("pid_start_ticks")):
            return True
        _pause(0.05)
    raise ProviderError(f"market pid {pid} still running after {timeout_s:.0f} s",
                        field="market", value=str(state_dir))
