"""IMDSv2, the one server implementation: the same paths, headers and JSON as AWS.

The market serves every instance's metadata under /imds/<id>/ through `handle`;
`ImdsServer` serves one instance's metadata at the root of its own port, for
tests and harnesses that play an instance without a market. Both answer through
`handle`, so the protocol (token PUT, TTL bounds, 401 without a live token, the
notice and rebalance documents) is written once.

Tokens are HMACs over (instance, expiry) with a secret kept in the market's state,
so they stay valid across a market restart, as they would on a real instance.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
import time
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Mapping

from spotrun.providers.local.market.clock import aws_time
from spotrun.providers.local.market.state import InstanceRecord

TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
MAX_TTL_S = 21600
ACTION_PATH = "latest/meta-data/spot/instance-action"
REBALANCE_PATH = "latest/meta-data/events/recommendations/rebalance"
# Not AWS: a paced local market learns here when a job trains or has saved on its notice.
PHASE_PATH = "latest/spotrun/phase"


@dataclass(frozen=True)
class ImdsReply:
    """An HTTP answer: status code, body text, content type."""

    status: int
    body: str = ""
    content_type: str = "text/plain"


@dataclass(frozen=True)
class Metadata:
    """What one instance's metadata service says now (None documents answer 404)."""

    instance_id: str
    instance_type: str = ""
    zone: str = ""
    life_cycle: str = "spot"
    user_data: str | None = None
    instance_action: dict[str, Any] | None = None   # {"action": ..., "time": ...}
    rebalance: dict[str, Any] | None = None         # {"noticeTime": ...}


class TokenMinter:
    """Mints and checks session tokens bound to one instance."""

    def __init__(self, secret: bytes, wall_time: Callable[[], float]) -> None:
        self._secret = secret
        self._wall_time = wall_time

    def _sig(self, instance_id: str, expiry: int) -> str:
        msg = f"{instance_id}:{expiry}".encode()
        return hmac.new(self._secret, msg, hashlib.sha256).hexdigest()[:32]

    def mint(self, instance_id: str, ttl_s: int) -> str:
        """A token for instance_id valid ttl_s wall seconds."""
        expiry = int(self._wall_time()) + ttl_s
        return f"{expiry}.{self._sig(instance_id, expiry)}"

    def valid(self, instance_id: str, token: str | None) -> bool:
        """True when token was minted for this instance and has not expired."""
        if not token or "." not in token:
            return False
        expiry_text, sig = token.split(".", 1)
        if not expiry_text.isdigit():
            return False
        expiry = int(expiry_text)
        return (hmac.compare_digest(sig, self._sig(instance_id, expiry))
                and self._wall_time() < expiry)


def metadata_of(rec: InstanceRecord | None, user_data: str | None, now_s: float
                ) -> Metadata | None:
    """A market instance's metadata at market time now_s; None once it is gone."""
    if rec is None or rec.state.is_terminal():
        return None
    noticed = rec.notice_at is not None and rec.reclaim_at is not None and now_s >= rec.notice_at
    action = rebalance = None
    if noticed:
        assert rec.reclaim_at is not None and rec.notice_at is not None
        action = {"action": "terminate", "time": aws_time(rec.reclaim_at)}
        # Served from the notice time: the trace gives no earlier hint of a reclaim.
        rebalance = {"noticeTime": aws_time(rec.notice_at)}
    return Metadata(instance_id=rec.instance_id, instance_type=rec.instance_type,
                    zone=rec.zone, life_cycle="spot" if rec.market.value == "spot"
                    else "on-demand", user_data=user_data, instance_action=action,
                    rebalance=rebalance)


def handle(method: str, path: str, headers: Mapping[str, str], meta: Metadata | None,
           minter: TokenMinter, max_ttl_s: int = MAX_TTL_S) -> ImdsReply:
    """Answer one IMDS request; path starts at `latest/`; header names in lower case."""
    if meta is None:
        return ImdsReply(404, "Not Found")
    if path == "latest/api/token":
        if method != "PUT":
            return ImdsReply(405, "Method Not Allowed")
        ttl = (headers.get(TTL_HEADER.lower()) or "").strip()
        if not ttl.isdigit() or not 1 <= int(ttl) <= max_ttl_s:
            return ImdsReply(400, "Bad Request")
        return ImdsReply(200, minter.mint(meta.instance_id, int(ttl)))
    if method != "GET":
        return ImdsReply(405, "Method Not Allowed")
    if not minter.valid(meta.instance_id, headers.get(TOKEN_HEADER.lower())):
        return ImdsReply(401, "Unauthorized")
    documents = {ACTION_PATH: meta.instance_action, REBALANCE_PATH: meta.rebalance}
    if path in documents:
        doc = documents[path]
        return ImdsReply(404, "Not Found") if doc is None else \
            ImdsReply(200, json.dumps(doc), "application/json")
    simple = {
        "latest/meta-data/instance-id": meta.instance_id,
        "latest/meta-data/instance-type": meta.instance_type,
        "latest/meta-data/placement/availability-zone": meta.zone,
        "latest/meta-data/instance-life-cycle": meta.life_cycle,
        "latest/user-data": meta.user_data,
    }
    if simple.get(path) is not None:
        return ImdsReply(200, str(simple[path]))
    return ImdsReply(404, "Not Found")


class ImdsServer:
    """One instance's IMDSv2 on 127.0.0.1 (its own port, paths at the root), via `handle`.

    The owner changes what it says (`arm_notice`, `arm_rebalance`, `user_data`);
    counters tell how a client behaved: token PUTs, notice polls, rejected requests.
    """

    def __init__(self, instance_id: str = "i-0local", *, user_data: str | None = None,
                 max_ttl_s: int = MAX_TTL_S, port: int = 0) -> None:
        self.lock = threading.Lock()
        self.meta = Metadata(instance_id=instance_id, user_data=user_data)
        self.max_ttl_s = max_ttl_s
        self.minter = TokenMinter(secrets.token_bytes(32), time.time)
        self.token_puts = 0
        self.rejected = 0
        self.action_polls = 0
        self.action_polls_after_arm = 0
        self.requests: list[str] = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler_for(self))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def user_data(self) -> str | None:
        """The user data served at /latest/user-data."""
        return self.meta.user_data

    @user_data.setter
    def user_data(self, value: str | None) -> None:
        with self.lock:
            self.meta = replace(self.meta, user_data=value)

    def start(self) -> "ImdsServer":
        """Serve in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Shut the server down."""
        self.httpd.shutdown()
        self.httpd.server_close()

    def arm_notice(self, action: str = "terminate", when: str = "2030-01-01T00:02:00Z") -> None:
        """From now on, instance-action answers the interruption notice."""
        with self.lock:
            self.meta = replace(self.meta, instance_action={"action": action, "time": when})

    def arm_rebalance(self, when: str = "2030-01-01T00:00:00Z") -> None:
        """From now on, the rebalance recommendation is present."""
        with self.lock:
            self.meta = replace(self.meta, rebalance={"noticeTime": when})

    def revoke_tokens(self) -> None:
        """Invalidate every token handed out (as a restarted metadata service would)."""
        with self.lock:
            self.minter = TokenMinter(secrets.token_bytes(32), time.time)

    def answer(self, method: str, path: str, headers: Mapping[str, str]) -> ImdsReply:
        """Serve one request through `handle` and count what the tests look at.

        Paths may also carry the market's layout (`imds/<instance id>/latest/...`).
        """
        market_prefix = f"imds/{self.meta.instance_id}/"
        if path.startswith(market_prefix):
            path = path[len(market_prefix):]
        with self.lock:
            self.requests.append(f"{method} /{path}")
            reply = handle(method, path, headers, self.meta, self.minter, self.max_ttl_s)
            if method == "PUT" and reply.status == 200:
                self.token_puts += 1
            if reply.status == 401:
                self.rejected += 1
            if method == "GET" and path == ACTION_PATH and reply.status != 401:
                self.action_polls += 1
                if self.meta.instance_action is not None:
                    self.action_polls_after_arm += 1
        return reply


def _handler_for(server: ImdsServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:   # agents poll several times a second
            pass

        def _serve(self, method: str) -> None:
            headers = {k.lower(): v for k, v in self.headers.items()}
            reply = server.answer(method, self.path.split("?", 1)[0].lstrip("/"), headers)
            data = reply.body.encode()
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            self._serve("GET")

        def do_PUT(self) -> None:  # noqa: N802
            self._serve("PUT")

    return Handler
