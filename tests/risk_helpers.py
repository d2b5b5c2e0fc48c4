"""Test helpers for reclaim risk: a small Spot Instance Advisor file and a server for it."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# The published file's shape (spot-bid-advisor.s3.amazonaws.com/spot-advisor-data.json), cut small.
ADVISOR = {
    "global_rate": "<10%",
    "instance_types": {"g6.xlarge": {"emr": False, "cores": 4, "ram_gb": 16.0},
                      "p3.2xlarge": {"emr": True, "cores": 8, "ram_gb": 61.0}},
    "ranges": [{"index": 0, "label": "<5%", "dots": 0, "max": 5},
               {"index": 1, "label": "5-10%", "dots": 1, "max": 11},
               {"index": 2, "label": "10-15%", "dots": 2, "max": 16},
               {"index": 3, "label": "15-20%", "dots": 3, "max": 22},
               {"index": 4, "label": ">20%", "dots": 4, "max": 100}],
    "spot_advisor": {
        "us-east-1": {"Linux": {"g6.xlarge": {"s": 58, "r": 0}, "p3.2xlarge": {"s": 70, "r": 4}},
                      "Windows": {"g6.xlarge": {"s": 40, "r": 4}}},
        "us-west-2": {"Linux": {"g6.xlarge": {"s": 55, "r": 2}, "p3.2xlarge": {"s": 69, "r": 2}}},
    },
}


class AdvisorServer:
    """Serves one JSON body on 127.0.0.1 and counts the requests."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.requests = 0
        self.status = 200
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                outer.requests += 1
                self.send_response(outer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/spot-advisor-data.json"
        self.thread = threading.Thread(target=self.httpd.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Shut down and free the port."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)
