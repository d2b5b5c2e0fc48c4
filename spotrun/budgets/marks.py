"""The mark a project or owner budget leaves on a job it stopped, and the phrase that says it.

A job stopped by a budget carries `project:ml@2030-01` (`Job.budget_stop_scope`) until it is
resumed; its `budget_exhausted` event says `budget project ml reached (2030-01)`, which stays
in the history after a resume has cleared the mark, so what the event meant can be read
from the event alone (the alerts re-read recent events: spotrun.notify.events).
"""

from __future__ import annotations

import re

# Budget names hold no spaces (spotrun.config); periods read `2030-01-02`, `2030-W05`,
# `2030-01` or `total`.
_PHRASE = re.compile(r"^budget (project|owner) (\S+) reached \((\S+)\)$")


def stop_mark(key: str, period_key: str) -> str:
    """`project:ml@2030-01`: the budget (`scope:name`) and the period that stopped a job."""
    return f"{key}@{period_key}"


def stop_phrase(mark: str) -> str:
    """`budget project ml reached (2030-01)` for the mark `project:ml@2030-01`."""
    key, _, period = mark.partition("@")
    return f"budget {key.replace(':', ' ', 1)} reached ({period})"


def mark_of_phrase(text: str) -> str | None:
    """The mark a `stop_phrase` names; None for any other text (a job's own budget)."""
    m = _PHRASE.match(text or "")
    return stop_mark(f"{m.group(1)}:{m.group(2)}", m.group(3)) if m else None
