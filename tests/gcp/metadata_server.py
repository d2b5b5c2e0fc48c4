"""One VM's GCE metadata server on 127.0.0.1 (what metadata.google.internal is to a VM).

Speaks the metadata server's protocol for the paths the agent reads: `Metadata-Flavor: Google`
required on every request (403 without it) and sent on every answer; an `ETag` per value;
`?wait_for_change=true` long polls that answer at once when `last_etag` differs from the
value's ETag, else when the value changes or `timeout_sec` runs out. `preempt()` turns
`instance/preempted` TRUE, as Compute Engine does at a preemption.
"""

from __future__ import annotations

import hashlib
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

PREFIX = "/computeMetadata/v1/"
MAX_WAIT_S = 60.0


class MetadataServer:
    """The metadata of one instance; start() serves it."""

    def __init__(self, name: str, zone: str, project: str = "spotrun-test",
                 attributes: dict[str, str] | None = None) -> None:
        self.values: dict[str, str] = {
            "instance/name": name, "instance/id": str(abs(hash(name)) % 10**18),
            "instance/zone": f"projects/1234567890/zones/{zone}",
            "instance/preempted": "FALSE", "project/project-id": project}
        for key, value in (attributes or {}).items():
            self.values[f"instance/attributes/{key}"] = value
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.refused = 0
        self._changed = threading.Condition()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:   # noqa: N802 - http.server's name
                server._get(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.host = f"127.0.0.1:{self.httpd.server_address[1]}"
        self.url = f"http://{self.host}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True,
                                        name=f"metadata-{name}")

    def start(self) -> "MetadataServer":
        """Serve on a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving (waiting long polls are answered first)."""
        with self._changed:
            self._changed.notify_all()
        self.httpd.shutdown()
        self.httpd.server_close()

    def set(self, path: str, value: str) -> None:
        """Change a value; long polls on it answer now."""
        with self._changed:
            self.values[path] = value
            self._changed.notify_all()

    def preempt(self) -> None:
        """instance/preempted TRUE, as at a preemption's soft-off."""
        self.set("instance/preempted", "TRUE")

    @staticmethod
    def etag(value: str) -> str:
        """The ETag of a value."""
        return hashlib.sha1(value.encode()).hexdigest()[:16]

    def _get(self, h: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(h.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        self.requests.append((parts.path, query))
        if h.headers.get("Metadata-Flavor") != "Google":
            self.refused += 1
            return self._answer(h, 403, "Missing required header: Metadata-Flavor\n", None)
        path = parts.path[len(PREFIX):] if parts.path.startswith(PREFIX) else None
        if path is None or path not in self.values:
            return self._answer(h, 404, "not found\n", None)
        value = self.values[path]
        if query.get("wait_for_change") == "true":
            last = query.get("last_etag")
            timeout = min(float(query.get("timeout_sec") or MAX_WAIT_S), MAX_WAIT_S)
            deadline = time.monotonic() + timeout
            with self._changed:
                while (last is None or last == self.etag(self.values[path])) and \
                        time.monotonic() < deadline:
                    self._changed.wait(max(0.0, deadline - time.monotonic()))
                    if last is None and self.values[path] != value:
                        break
                value = self.values[path]
        self._answer(h, 200, value, self.etag(value))

    @staticmethod
    def _answer(h: BaseHTTPRequestHandler, status: int, body: str, etag: str | None) -> None:
        data = body.encode()
        try:
            h.send_response(status)
            h.send_header("Metadata-Flavor", "Google")
            h.send_header("Content-Type", "application/text")
            if etag:
                h.send_header("ETag", etag)
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
        except OSError:
            pass   # the client gave up on a long poll
