"""The kind of a waiting reason: what a job waits for, without the live figures in the text.

A waiting job's reason names live prices and pools ("lowest $3.12/h (p3.2xlarge in
us-east-1a)"), so its text changes at every price move. The daemon records a `waiting` event
only when the kind changes (price above the cap, no capacity, ...) and keeps the live text on
the job for `status`. The kind is read from the text itself, so the job row stays the one
record of what the job waits for, across daemon restarts.
"""

from __future__ import annotations

import re

from spotrun.decide.rank import NO_PROGRESS

PRICE_CAP = "price_cap"
NO_CAPACITY = "no_capacity"
NO_PRICE = "no_price"
NO_PROGRESS_KIND = "no_progress"
ON_DEMAND_NEEDS_DEADLINE = "on_demand_needs_deadline"
DEADLINE_POLICY = "deadline_policy"
UNSUPPORTED = "unsupported"
NO_POOL = "no_pool"
BUDGET = "budget"           # a project or owner budget has no room (spotrun.budgets)
NOTICE_QUARANTINE = "notice_quarantine"   # pools closed after a notice (decide/quarantine.py)

# Whole-reason texts (spotrun.decide.core.wait_reason, decide.from_settings and the
# scheduler's launch refusals), first match wins.
_WHOLE: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^price cap \$"), PRICE_CAP),
    (re.compile(r"^no spot capacity now in any of \d+ pool"), NO_CAPACITY),
    (re.compile(r"^no capacity in \d+ pool"), NO_CAPACITY),
    (re.compile(r"^no pool of \d+ has room for"), NO_CAPACITY),
    (re.compile(r"provider cannot launch multi-node jobs"), UNSUPPORTED),
    (re.compile(r"^the deadline policy \S+ waits"), DEADLINE_POLICY),
    (re.compile(r"^no spot pool can take the job now and on-demand"), ON_DEMAND_NEEDS_DEADLINE),
    (re.compile(r"^no pool can take the job( now)?$"), NO_POOL),
    (re.compile(r"^budget (project|owner) \S+: "), BUDGET),
    (re.compile(r"^every spot pool that can take the job had an interruption notice"),
     NOTICE_QUARANTINE),
]
# One pool's rejection (spotrun.decide.rank); wait_reason joins up to three with "; ".
_PART: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"price \$[\d.]+/h in \S+ is above policy\.max_price_usd_per_hour"), PRICE_CAP),
    (re.compile(r"^no spot capacity in \S+ now$"), NO_CAPACITY),
    (re.compile(r"^no \S+ price in \S+$"), NO_PRICE),
    (re.compile(re.escape(NO_PROGRESS)), NO_PROGRESS_KIND),
    (re.compile(r"^interruption notice in \S+ at [\d:]+: no spot launch there"),
     NOTICE_QUARANTINE),
]


def _match(table: list[tuple[re.Pattern[str], str]], text: str) -> str | None:
    for pattern, kind in table:
        if pattern.search(text):
            return kind
    return None


def reason_kind(text: str | None) -> str | None:
    """The kind of a waiting reason (None for none); a text of no known shape is its own kind."""
    if text is None:
        return None
    whole = _match(_WHOLE, text)
    if whole is not None:
        return whole
    # Several pools' rejections: the set of their kinds (an unknown part keeps its own text,
    # so a reason nobody classified still records every change, as before kinds existed).
    parts = {_match(_PART, p) or p for p in text.split("; ")}
    return "+".join(sorted(parts))
