"""Read the training library's progress file, keeping the last good copy.

The library rewrites the file atomically, but a hand-written job may not, and
before the first step it does not exist: a missing or partial file is normal.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIELDS = ("step", "total_steps", "steps_per_s", "last_checkpoint_step", "checkpoint_save_s",
          "emergency_checkpoint_step", "checkpoint_failures", "checkpoint_error_step",
          "checkpoint_error", "notice_outcome")


class ProgressReader:
    """Latest parsed SPOTRUN_PROGRESS_FILE content."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.last: dict[str, Any] = {}

    def read(self) -> dict[str, Any]:
        """Re-read the file; on any problem keep what was read before."""
        try:
            obj = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return self.last
        if isinstance(obj, dict):
            self.last = {k: obj.get(k) for k in FIELDS}
        return self.last

    def get(self, name: str) -> Any:
        """One field of the last good read (None if unknown)."""
        return self.last.get(name)
