"""The progress file the agent reads for its heartbeat (rewritten atomically)."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from spotrun.store.localfile import write_atomic


class ProgressFile:
    """Writes `{"step", "total_steps", "steps_per_s", ...}` with temp file + rename."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path else None

    def write(self, fields: dict[str, Any]) -> None:
        """Replace the file with fields plus a UTC timestamp; no-op without a path."""
        if self.path is None:
            return
        body = dict(fields, ts=datetime.now(timezone.utc).isoformat())
        write_atomic(self.path, [json.dumps(body).encode()], durable=False)
