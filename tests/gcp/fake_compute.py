"""A fake Compute Engine v1 REST API on 127.0.0.1, for google-cloud-compute's REST transport.

The real client library is pointed at it (`client_options={"api_endpoint": url}`, anonymous
credentials) and speaks to it exactly as to compute.googleapis.com: the paths, query
parameters and JSON bodies of the calls spotrun makes (instances insert/get/delete/list,
aggregatedList, simulateMaintenanceEvent; zoneOperations get/wait/list; resourcePolicies
insert/get with regionOperations get/wait; regions and projects get for `doctor`). State and
GCP's own behaviour (preemption, capacity, quota) live in compute_state.py.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

from .compute_state import ApiError, Call, ComputeState

PREFIX = "/compute/v1/projects/"
WAIT_S = 2.0     # zoneOperations.wait blocks at most this long (GCP: about 2 minutes)

Route = tuple[str, re.Pattern[str], Callable[..., Any]]


class FakeCompute:
    """The HTTP server over one ComputeState."""

    def __init__(self, state: ComputeState | None = None) -> None:
        self.state = state or ComputeState()
        self.routes: list[Route] = []
        self._add_routes()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:   # quiet
                pass

            def _serve(self) -> None:
                fake._handle(self)

            do_GET = do_POST = do_DELETE = do_PATCH = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="fake-compute",
                                       daemon=True)

    def start(self) -> "FakeCompute":
        """Serve on a background thread."""
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; cancel pending preemption timers."""
        for p in list(self.state.preempting.values()):
            if p.timer is not None:
                p.timer.cancel()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

    def calls(self, method: str | None = None, contains: str = "") -> list[Call]:
        """Requests answered so far (of one method, with `contains` in the path)."""
        return [c for c in list(self.state.calls)
                if (method is None or c.method == method) and contains in c.path]

    # ------------------------------------------------------------ routing

    def _route(self, method: str, pattern: str, fn: Callable[..., Any]) -> None:
        regex = re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", pattern) + "$")
        self.routes.append((method, regex, fn))

    def _add_routes(self) -> None:
        s = self.state
        z = "{project}/zones/{zone}"
        r = "{project}/regions/{region}"
        self._route("POST", f"{z}/instances", lambda q, b, zone, **_: s.insert(
            zone, b or {}, q.get("requestId")))
        self._route("GET", f"{z}/instances", lambda q, b, zone, **_: _page(
            "compute#instanceList", s.list_instances(zone, q.get("filter", "")), q))
        self._route("GET", f"{z}/instances/{{name}}", lambda q, b, zone, name, **_:
                    _clean(s.get_instance(zone, name)))
        self._route("DELETE", f"{z}/instances/{{name}}", lambda q, b, zone, name, **_:
                    s.delete(zone, name, q.get("requestId")))
        self._route("POST", f"{z}/instances/{{name}}/simulateMaintenanceEvent",
                    lambda q, b, zone, name, **_: s.simulate_maintenance(zone, name))
        self._route("GET", "{project}/aggregated/instances", lambda q, b, **_: self._aggregated(q))
        self._route("GET", f"{z}/operations/{{op}}", lambda q, b, zone, op, **_:
                    _clean(s.get_op(zone, op)))
        self._route("POST", f"{z}/operations/{{op}}/wait", lambda q, b, zone, op, **_:
                    _clean(s.get_op(zone, op, wait_s=WAIT_S)))
        self._route("GET", f"{z}/operations", lambda q, b, zone, **_: _page(
            "compute#operationList", s.list_ops(zone, q.get("filter", "")), q))
        self._route("POST", f"{r}/resourcePolicies", lambda q, b, region, **_: s.insert_policy(
            region, b or {}, q.get("requestId")))
        self._route("GET", f"{r}/resourcePolicies/{{name}}", lambda q, b, region, name, **_:
                    s.get_policy(region, name))
        self._route("GET", f"{r}/operations/{{op}}", lambda q, b, region, op, **_:
                    _clean(s.get_op(region, op)))
        self._route("POST", f"{r}/operations/{{op}}/wait", lambda q, b, region, op, **_:
                    _clean(s.get_op(region, op, wait_s=WAIT_S)))
        self._route("GET", r, lambda q, b, region, **_: self._region(region))
        self._route("GET", "{project}", lambda q, b, project, **_: {
            "kind": "compute#project", "name": project, "id": "1234567890",
            "defaultServiceAccount": f"1234567890-compute@{project}.iam.gserviceaccount.com"})

    def _aggregated(self, q: dict[str, str]) -> dict[str, Any]:
        by_zone: dict[str, Any] = {}
        found = self.state.list_instances(None, q.get("filter", ""))
        for zone in self.state.zones:
            mine = [i for i in found if i["zone"].endswith(f"/zones/{zone}")]
            by_zone[f"zones/{zone}"] = {"instances": mine} if mine else {"warning": {
                "code": "NO_RESULTS_ON_PAGE", "message": "There are no results for scope "
                                                         f"'zones/{zone}' on this page."}}
        return {"kind": "compute#instanceAggregatedList", "id": "projects/x/aggregated/instances",
                "items": by_zone}

    def _region(self, region: str) -> dict[str, Any]:
        if region != self.state.region:
            raise ApiError(404, "notFound", f"The resource 'regions/{region}' was not found")
        return {"kind": "compute#region", "name": region, "status": "UP",
                "zones": [self.state.zone_link(z) for z in self.state.zones],
                "quotas": [{"metric": "PREEMPTIBLE_NVIDIA_A100_GPUS", "limit": 16.0, "usage": 0.0},
                           {"metric": "PREEMPTIBLE_NVIDIA_L4_GPUS", "limit": 8.0, "usage": 0.0},
                           {"metric": "NVIDIA_A100_GPUS", "limit": 0.0, "usage": 0.0},
                           {"metric": "CPUS", "limit": 96.0, "usage": 0.0}]}

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(h.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        status, payload = 404, ApiError(404, "notFound", f"no route {parts.path}").body()
        body = None
        try:
            body = json.loads(raw) if raw else None
            path = parts.path
            if not path.startswith(PREFIX):
                raise ApiError(404, "notFound", f"no route {path}")
            rest = path[len(PREFIX):]
            self.state.calls.append(Call(h.command, rest, query, body))
            for method, regex, fn in self.routes:
                m = regex.match(rest)
                if m and method == h.command:
                    status, payload = 200, fn(query, body, **m.groupdict())
                    break
        except ApiError as exc:
            status, payload = exc.status, exc.body()
        except ValueError as exc:
            status, payload = 400, ApiError(400, "parseError", str(exc)).body()
        data = json.dumps(payload).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json; charset=UTF-8")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)


def _clean(obj: dict[str, Any]) -> dict[str, Any]:
    obj.pop("_ready_at", None)
    obj.pop("_deleting", None)
    return obj


def _page(kind: str, items: list[dict[str, Any]], q: dict[str, str]) -> dict[str, Any]:
    """One page of a list (maxResults, pageToken as an offset)."""
    size = int(q.get("maxResults") or 500)
    start = int(q.get("pageToken") or 0)
    out: dict[str, Any] = {"kind": kind, "items": items[start:start + size]}
    if start + size < len(items):
        out["nextPageToken"] = str(start + size)
    return out
