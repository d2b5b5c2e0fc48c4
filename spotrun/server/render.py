"""JSON bodies as the CLI's `--json` writes them, rendered where the work runs."""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse

from spotrun.contracts import json_default


class SpotrunJSON(JSONResponse):
    """JSON as the CLI's `--json` writes it (datetimes ISO-8601, enums by value)."""

    def render(self, content: Any) -> bytes:
        """The body."""
        return json.dumps(content, default=json_default).encode("utf-8")


def rendered(content: Any) -> SpotrunJSON:
    """The body rendered now, by a sync route in FastAPI's threadpool: a plain return value
    is encoded on the event loop (jsonable_encoder, then json.dumps), which for 1,000 jobs'
    status took about 50 ms per call and held every other request behind it."""
    return SpotrunJSON(content)
