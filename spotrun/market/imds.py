"""IMDSv2 for local instances: the same paths, headers and JSON as AWS, under /imds/<id>/.

Tokens are HMACs over (instance, expiry) with a secret kept in the market's state,
so they stay valid across a market restart, as they would on a real instance.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Callable, Mapping

from spotrun.market.clock import aws_time
from spotrun.market.state import InstanceRecord

TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
MAX_TTL_S = 21600


@dataclass(frozen=True)
class ImdsReply:
    """An HTTP answer: status code, body text, content type."""

    status: int
    body: str = ""
    content_type: str = "text/plain"


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


def handle(method: str, path: str, headers: Mapping[str, str], rec: InstanceRecord | None,
           user_data: str | None, now_s: float, minter: TokenMinter) -> ImdsReply:
    """Answer one IMDS request; path follows /imds/<id>/; header names in lower case."""
    if rec is None or rec.state.is_terminal():
        return ImdsReply(404, "Not Found")
    if path == "latest/api/token":
        if method != "PUT":
            return ImdsReply(405, "Method Not Allowed")
        ttl = (headers.get(TTL_HEADER.lower()) or "").strip()
        if not ttl.isdigit() or not 1 <= int(ttl) <= MAX_TTL_S:
            return ImdsReply(400, "Bad Request")
        return ImdsReply(200, minter.mint(rec.instance_id, int(ttl)))
    if method != "GET":
        return ImdsReply(405, "Method Not Allowed")
    if not minter.valid(rec.instance_id, headers.get(TOKEN_HEADER.lower())):
        return ImdsReply(401, "Unauthorized")
    return _get(path, rec, user_data, now_s)


def _get(path: str, rec: InstanceRecord, user_data: str | None, now_s: float) -> ImdsReply:
    noticed = rec.notice_at is not None and rec.reclaim_at is not None and now_s >= rec.notice_at
    if path == "latest/meta-data/spot/instance-action":
        if not noticed:
            return ImdsReply(404, "Not Found")
        assert rec.reclaim_at is not None
        body = json.dumps({"action": "terminate", "time": aws_time(rec.reclaim_at)})
        return ImdsReply(200, body, "application/json")
    if path == "latest/meta-data/events/recommendations/rebalance":
        # Served from the notice time: the trace gives no earlier hint of a reclaim.
        if not noticed:
            return ImdsReply(404, "Not Found")
        assert rec.notice_at is not None
        return ImdsReply(200, json.dumps({"noticeTime": aws_time(rec.notice_at)}),
                         "application/json")
    simple = {
        "latest/meta-data/instance-id": rec.instance_id,
        "latest/meta-data/instance-type": rec.instance_type,
        "latest/meta-data/placement/availability-zone": rec.zone,
        "latest/meta-data/instance-life-cycle": "spot" if rec.market.value == "spot"
        else "on-demand",
    }
    if path in simple:
        return ImdsReply(200, simple[path])
    if path == "latest/user-data" and user_data is not None:
        return ImdsReply(200, user_data)
    return ImdsReply(404, "Not Found")
