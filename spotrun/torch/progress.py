"""The progress file the agent reads for its heartbeat (rewritten atomically)."""

from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


class ProgressFile:
    """Writes `{"step", "total_steps", "steps_per_s", ...}` with temp file + rename."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path else None

    def write(self, fields: dict[str, Any]) -> None:
        """Replace the file with fields plus a UTC timestamp; no-op without a path."""
        if self.path is None:
            return
        body = dict(fields, ts=datetime.now(timezone.utc).isoformat())
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".progress-", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(body, f)
            # No fsync: a lost update after a crash only makes the next heartbeat stale.
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
