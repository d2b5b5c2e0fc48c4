"""The market's HTTP JSON API and IMDS on 127.0.0.1, and `serve()` (the foreground process).

Routes: GET /health /time /pools /instances /prices /price-history /status;
POST /instances, /instances/<id>/terminate, /admin/interrupt, /admin/stop;
GET/POST /admin/faults (tests: throttling and capacity refusals, seeded);
any method under /imds/<id>/latest/... (IMDSv2, see imds.py).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

from spotrun.errors import BadInputError, ProviderError, SpotrunError
from spotrun.providers.local.market import imds, procs
from spotrun.providers.local.market.clock import to_iso
from spotrun.providers.local.market.core import LaunchRefused, Market
from spotrun.providers.base import Pool
from spotrun.providers.local.market.options import MarketOptions
from spotrun.providers.local.market.state import InstanceRecord, write_json_atomic
from spotrun.states import Market as MarketKind

MARKET_JSON = "market.json"
LOCK_FILE = "market.lock"


def record_json(rec: InstanceRecord) -> dict[str, Any]:
    """The API's view of an instance (times ISO-8601, market clock)."""
    return {"instance_id": rec.instance_id, "instance_type": rec.instance_type, "zone": rec.zone,
            "market": rec.market.value, "state": rec.state.value,
            "launched_at": to_iso(rec.launched_at), "ended_at": to_iso(rec.ended_at),
            "cause": rec.cause.value if rec.cause else None, "tags": rec.tags,
            "price_usd_per_hour": rec.price_usd_per_hour, "client_token": rec.client_token,
            "notice_at": to_iso(rec.notice_at), "reclaim_at": to_iso(rec.reclaim_at),
            "pid": rec.pid}


class _Flags:
    """Set by signal handlers and /admin/stop; read by the main loop."""

    stop = False
    stop_instances = False


class Faults:
    """Test faults set by POST /admin/faults: a seeded share of calls throttled (HTTP 503,
    like EC2's RequestLimitExceeded) and of launches refused for capacity (HTTP 409)."""

    def __init__(self) -> None:
        import random
        self.lock = threading.Lock()
        # One generator per fault: which launches are refused must not depend on how many
        # other calls (timing-dependent polls) drew before them.
        self.rngs = {kind: random.Random(f"0:{kind}") for kind in ("throttled", "refused")}
        self.throttle_fraction = 0.0
        self.capacity_fraction = 0.0
        self.counts = {"throttled": 0, "refused": 0}

    def set(self, body: dict[str, Any]) -> dict[str, Any]:
        """Replace the fractions (0..1) and reseed."""
        import random
        with self.lock:
            for key in ("throttle_fraction", "capacity_fraction"):
                value = _num(body, key, 0.0)
                if not 0.0 <= value <= 1.0:
                    raise BadInputError("must be between 0 and 1", field=key, value=value)
                setattr(self, key, value)
            seed = int(_num(body, "seed", 0.0))
            self.rngs = {kind: random.Random(f"{seed}:{kind}") for kind in self.rngs}
            return self.view()

    def hit(self, kind: str) -> bool:
        """Draw once: should this call fail with the fault `kind`?"""
        with self.lock:
            frac = self.throttle_fraction if kind == "throttled" else self.capacity_fraction
            if frac <= 0 or self.rngs[kind].random() >= frac:
                return False
            self.counts[kind] += 1
            return True

    def view(self) -> dict[str, Any]:
        """The fractions and how many calls each fault failed."""
        return {"throttle_fraction": self.throttle_fraction,
                "capacity_fraction": self.capacity_fraction, **self.counts}


class MarketHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that carries the market."""

    daemon_threads = True

    def __init__(self, market: Market, flags: _Flags, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.market = market
        self.flags = flags
        self.faults = Faults()
        self.port = int(self.server_address[1])
        market.imds_base = f"http://127.0.0.1:{self.port}/imds"


class _Handler(BaseHTTPRequestHandler):
    server: MarketHTTPServer
    # Kept-alive connections: the daemon's client sends a pass's requests on one.
    protocol_version = "HTTP/1.1"
    # An answer goes out as two writes (headers, body): with Nagle's algorithm the body waits
    # for the client's delayed ACK of the headers, 40 ms on every call of a kept connection.
    disable_nagle_algorithm = True
    _raw = b""

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: agents poll IMDS several times a second."""

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def _send(self, status: int, body: str, content_type: str = "application/json") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj))

    def _body(self) -> dict[str, Any]:
        if not self._raw:
            return {}
        try:
            body = json.loads(self._raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise BadInputError("request body is not JSON", field="body") from None
        if not isinstance(body, dict):
            raise BadInputError("request body must be an object", field="body")
        return body

    def _dispatch(self, method: str) -> None:
        # Every body is read, used or not: on a kept-alive connection the next request follows.
        self._raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        url = urlsplit(self.path)
        parts = [p for p in url.path.split("/") if p]
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        try:
            if parts and parts[0] == "imds" and len(parts) >= 2:
                self._imds(method, parts[1], "/".join(parts[2:]))
                return
            if parts and parts[0] not in ("admin", "health") \
                    and self.server.faults.hit("throttled"):
                self._json(503, {"error": "RequestLimitExceeded: request rate exceeded"})
                return
            self._api(method, parts, query)
        except LaunchRefused as exc:
            self._json(409, {"error": "no candidate has capacity", "reasons": exc.reasons})
        except BadInputError as exc:
            self._json(400, {"error": str(exc), "field": exc.field})
        except SpotrunError as exc:
            self._json(500, {"error": str(exc), "field": exc.field})

    def _imds(self, method: str, instance_id: str, rest: str) -> None:
        m = self.server.market
        rec = m.state.get(instance_id)
        user_data = m.user_data(instance_id) if rest == "latest/user-data" else None
        headers = {k.lower(): v for k, v in self.headers.items()}   # names are case-insensitive
        if rest == imds.PHASE_PATH and method == "PUT":
            self._phase(instance_id, rec, headers)
            return
        reply = imds.handle(method, rest, headers, imds.metadata_of(rec, user_data, m.now_s()),
                            m.minter)
        self._send(reply.status, reply.body, reply.content_type)

    def _phase(self, instance_id: str, rec: InstanceRecord | None,
               headers: dict[str, str]) -> None:
        """The local market's one IMDS extension: the agent reports its job's phase."""
        m = self.server.market
        if rec is None or rec.state.is_terminal():
            self._send(404, "Not Found", "text/plain")
            return
        if not m.minter.valid(instance_id, headers.get(imds.TOKEN_HEADER.lower())):
            self._send(401, "Unauthorized", "text/plain")
            return
        m.report_phase(instance_id, str(self._body().get("phase")))
        self._json(200, {"instance_id": instance_id, "rate": m.clock.rate()})

    def _api(self, method: str, parts: list[str], q: dict[str, str]) -> None:
        # `instances/<id>/terminate` is the one route with a parameter: match it by shape.
        key = "instances/*/terminate" if len(parts) == 3 and parts[0] == "instances" \
            and parts[2] == "terminate" else "/".join(parts)
        handler = ROUTES.get((method, key))
        if handler is None:
            self._json(404, {"error": f"no route {method} /{'/'.join(parts)}"})
            return
        self._json(200, handler(self, parts, q))

    # ---- one function per route: (handler, path parts, query) -> JSON body ----------------
    def _health(self, parts: list[str], q: dict[str, str]) -> Any:
        return {"ok": True, "pid": os.getpid()}

    def _time(self, parts: list[str], q: dict[str, str]) -> Any:
        return time_json(self.server.market)

    def _pools(self, parts: list[str], q: dict[str, str]) -> Any:
        types = [t for t in q.get("instance_types", "").split(",") if t]
        return {"pools": self.server.market.pools(types or None)}

    def _instances(self, parts: list[str], q: dict[str, str]) -> Any:
        ids = q["ids"].split(",") if q.get("ids") else None
        recs = self.server.market.describe(job_id=q.get("job_id"), instance_ids=ids)
        return {"instances": [record_json(r) for r in recs]}

    def _launch_route(self, parts: list[str], q: dict[str, str]) -> Any:
        if self.server.faults.hit("refused"):
            raise LaunchRefused({"*": "InsufficientInstanceCapacity: injected fault"})
        return {"instance": record_json(_launch(self.server.market, self._body()))}

    def _terminate(self, parts: list[str], q: dict[str, str]) -> Any:
        rec = self.server.market.terminate(parts[1])
        return {"instance": record_json(rec) if rec else None}

    def _price(self, parts: list[str], q: dict[str, str]) -> Any:
        m = self.server.market
        pos = m.clock.position(m.now_s())
        return {"price_usd_per_hour": m.book.spot_price(q.get("instance_type", ""),
                                                         q.get("zone", ""), pos)}

    def _price_history(self, parts: list[str], q: dict[str, str]) -> Any:
        return {"points": _history(self.server.market, q)}

    def _status(self, parts: list[str], q: dict[str, str]) -> Any:
        return status_json(self.server.market)

    def _interrupt(self, parts: list[str], q: dict[str, str]) -> Any:
        body = self._body()
        got = self.server.market.interrupt(str(body.get("instance_id", "")),
                                           _num(body, "in_s", 0.0),
                                           bool(body.get("notice", True)))
        return {"instance": record_json(got.record), "already_noticed": got.already_noticed,
                "reclaim_in_s": got.reclaim_in_s}

    def _set_faults(self, parts: list[str], q: dict[str, str]) -> Any:
        return {"faults": self.server.faults.set(self._body())}

    def _get_faults(self, parts: list[str], q: dict[str, str]) -> Any:
        return {"faults": self.server.faults.view()}

    def _stop(self, parts: list[str], q: dict[str, str]) -> Any:
        self.server.flags.stop_instances = True
        self.server.flags.stop = True
        return {"stopping": True}


# The market's HTTP API: (method, path) -> handler. IMDS paths are served by imds.py.
ROUTES: dict[tuple[str, str], Callable[[_Handler, list[str], dict[str, str]], Any]] = {
    ("GET", "health"): _Handler._health,
    ("GET", "time"): _Handler._time,
    ("GET", "pools"): _Handler._pools,
    ("GET", "instances"): _Handler._instances,
    ("POST", "instances"): _Handler._launch_route,
    ("POST", "instances/*/terminate"): _Handler._terminate,
    ("GET", "prices"): _Handler._price,
    ("GET", "price-history"): _Handler._price_history,
    ("GET", "status"): _Handler._status,
    ("POST", "admin/interrupt"): _Handler._interrupt,
    ("POST", "admin/faults"): _Handler._set_faults,
    ("GET", "admin/faults"): _Handler._get_faults,
    ("POST", "admin/stop"): _Handler._stop,
}


def _num(body: dict[str, Any], key: str, default: float | None) -> float:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadInputError("must be a number", field=key, value=value)
    return float(value)


def _launch(m: Market, body: dict[str, Any]) -> InstanceRecord:
    raw = body.get("candidates")
    if not isinstance(raw, list):
        raise BadInputError("must be a list", field="candidates")
    try:
        cands = [Pool(str(c["instance_type"]), str(c["zone"]), MarketKind(c["market"]))
                 for c in raw]
    except (KeyError, TypeError, ValueError):
        raise BadInputError("each needs instance_type, zone, market (spot|on-demand)",
                            field="candidates") from None
    tags = body.get("tags") or {}
    if not isinstance(tags, dict):
        raise BadInputError("must be an object", field="tags")
    max_price = body.get("max_price_usd_per_hour")
    instance_env = body.get("instance_env") or {}
    if not isinstance(instance_env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in instance_env.items()):
        raise BadInputError("must be an object of strings", field="instance_env")
    return m.launch(client_token=body.get("client_token") or None, candidates=cands,
                    instance_env=instance_env,
                    user_data=str(body.get("user_data") or ""),
                    tags={str(k): str(v) for k, v in tags.items()},
                    max_price_usd_per_hour=None if max_price is None
                    else _num(body, "max_price_usd_per_hour", None))


def _history(m: Market, q: dict[str, str]) -> list[dict[str, Any]]:
    try:
        start, end = float(q["start_s"]), float(q["end_s"])
    except (KeyError, ValueError):
        raise BadInputError("start_s and end_s (unix seconds) are required",
                            field="price-history") from None
    out = []
    for zone in [z for z in q.get("zones", "").split(",") if z]:
        for p in m.book.price_points(q.get("instance_type", ""), zone, m.clock.position(start),
                                     m.clock.position(end)):
            out.append({"zone": zone, "ts_s": max(start, m.clock.time_of(p.position)),
                        "price_usd_per_hour": p.price_usd_per_hour})
    return out


def time_json(m: Market) -> dict[str, Any]:
    """GET /time: market time and the clock's parameters."""
    now = m.now_s()
    return {"now": to_iso(now), "now_s": now, "epoch_wall_s": m.clock.epoch_wall_s,
            "time_scale": m.clock.time_scale, "start_tick": m.clock.start_tick,
            "tick_s": m.clock.tick_s, "position": m.clock.position(now),
            "rate": m.clock.rate(), "pacing": m.options.pacing,
            "trace_rows": m.book.rows}


def status_json(m: Market) -> dict[str, Any]:
    """GET /status: clock, options, pools now and every instance."""
    return {"time": time_json(m), "options": json.loads(m.options.to_json()),
            "pools": m.pools(), "instances": [record_json(r) for r in m.describe()]}


def serve(state_dir: Path, options: MarketOptions, port: int = 0) -> int:
    """Run the market in the foreground until SIGTERM/SIGINT or POST /admin/stop."""
    state_dir = Path(state_dir).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    lock = open(state_dir / LOCK_FILE, "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise ProviderError("a market already runs on this state dir", field="state_dir",
                            value=str(state_dir), hint="`spotrun market stop` first") from None
    flags = _Flags()

    def _on_signal(signum: int, frame: Any) -> None:
        flags.stop = True

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    market = Market(state_dir, options)
    server = MarketHTTPServer(market, flags, port)
    market.start_watcher()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                              daemon=True)
    thread.start()
    # market.json is also how instances find their metadata service again after a restart
    # on a new port (SPOTRUN_IMDS_DISCOVERY, see spotrun/agent/imds.py): "imds_url".
    info = {"url": f"http://127.0.0.1:{server.port}", "port": server.port,
            "imds_url": market.imds_base, "pid": os.getpid(),
            "pid_start_ticks": procs.start_ticks(os.getpid()), "state_dir": str(state_dir),
            "ignored_options": market.ignored}
    write_json_atomic(state_dir / MARKET_JSON, info)
    print(f"market ready at {info['url']} (state {state_dir})", flush=True)
    if market.ignored:
        print(f"kept the stored settings for: {', '.join(market.ignored)}", flush=True)
    idle = threading.Event()   # never set: bounded waits while signal handlers set flags
    while not flags.stop:
        idle.wait(0.2)
    if flags.stop_instances:
        market.terminate_all(market.wall.time() + market.options.grace_s + 5.0)
    server.shutdown()
    server.server_close()
    market.close()
    try:
        if json.loads((state_dir / MARKET_JSON).read_text())["pid"] == os.getpid():
            (state_dir / MARKET_JSON).unlink()
    except (OSError, ValueError, KeyError):
        pass
    lock.close()
    return 0
