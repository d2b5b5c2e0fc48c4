"""Fixtures of the team-server tests (tests/server/harness.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from server.harness import Team, start_team


@pytest.fixture
def team(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Team]:
    """A running server with four users (see harness)."""
    monkeypatch.delenv("SPOTRUN_HOME", raising=False)
    yield from start_team(tmp_path)
