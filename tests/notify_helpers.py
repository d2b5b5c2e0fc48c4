"""A webhook receiver on 127.0.0.1 that records what it is sent (and can refuse on purpose)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


class Receiver:
    """A real HTTP server; `refuse(text) -> bool` answers 503 to the messages it picks."""

    def __init__(self) -> None:
        self.received: list[dict] = []
        self.refused: list[dict] = []
        self.refuse: Callable[[str], bool] = lambda text: False
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):   # keep test output clean
                return

            def do_POST(self):   # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                entry = {"path": self.path, "text": body.get("text", ""),
                         "id": self.headers.get("X-Spotrun-Event-Id")}
                refused = outer.refuse(entry["text"])
                with outer._lock:
                    (outer.refused if refused else outer.received).append(entry)
                self.send_response(503 if refused else 200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def url(self, path: str = "/hook") -> str:
        """The URL of one hook path on this receiver."""
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def texts(self, path: str | None = None, containing: str = "") -> list[str]:
        """Texts received (optionally at one path, containing a word)."""
        with self._lock:
            return [e["text"] for e in self.received
                    if (path is None or e["path"] == path) and containing in e["text"]]

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()
