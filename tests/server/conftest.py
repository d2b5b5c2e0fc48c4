"""Fixtures of the team-server tests (tests/server/harness.py)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import pytest

from budget_helpers import BudgetRig
from server.harness import Team, start_team

DAY1 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def team(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Team]:
    """A running server with four users (see harness)."""
    monkeypatch.delenv("SPOTRUN_HOME", raising=False)
    yield from start_team(tmp_path)


@pytest.fixture
def rig_and_team(tmp_path: Path, instance_command: str, monkeypatch: pytest.MonkeyPatch
                 ) -> Iterator[tuple[BudgetRig, Team]]:
    """A daemon rig (tests/budget_helpers.py: its loops ticked by hand against the real local
    market) and a team server over the rig's home."""
    monkeypatch.delenv("SPOTRUN_HOME", raising=False)
    monkeypatch.delenv("SPOTRUN_DB_URL", raising=False)
    rig = BudgetRig(tmp_path / "rig", instance_command, DAY1, "")
    team_gen = start_team(tmp_path, settings=rig.settings, provider=rig.ctx.provider)
    try:
        yield rig, next(team_gen)
    finally:
        team_gen.close()
        rig.close()
