"""At submit: who owns the job, and whether its own cap can fit what its budgets have left."""

from __future__ import annotations

import getpass
from typing import Any

from spotrun.config import OWNER_RE, OWNER_RULE, UNKNOWN_OWNER
from spotrun.errors import BadInputError
from spotrun.budgets.source import effective_budgets
from spotrun.budgets.standing import EPSILON_USD, read_standing, usd
from spotrun.db import session
from spotrun.ledger.stopmargin import stop_margin_for
from spotrun.providers.timescale import provider_now


def os_user() -> str:
    """The OS user running this process (`unknown` where the system cannot say)."""
    try:
        name = getpass.getuser()
    except (KeyError, OSError):   # no login name and no passwd entry (some containers)
        return UNKNOWN_OWNER
    return name if OWNER_RE.match(name or "") else UNKNOWN_OWNER


def submit_owner(settings: Any, requested: str | None) -> str:
    """The job's owner: the submitting OS user, or `--owner` where settings allow it."""
    if requested is None:
        return os_user()
    if not settings.budgets.allow_owner_override:
        raise BadInputError("naming another owner is not allowed here", field="--owner",
                            value=requested,
                            hint="[budgets] allow_owner_override = true in spotrun.toml "
                                 "allows it; without --owner the job is yours")
    if not OWNER_RE.match(requested):
        raise BadInputError(f"not a valid owner; allowed: {OWNER_RULE}", field="--owner",
                            value=requested)
    return requested


def refuse_unfit(settings: Any, engine: Any, project: str, owner: str,
                 cap_usd: float | None) -> None:
    """Refuse (exit 2) a job whose own cap (`policy.budget_usd`) is more than one of its
    budgets has left now; a job without a cap is accepted and waits for room instead."""
    budgets = effective_budgets(settings, engine).of_job(project, owner)
    if cap_usd is None or not budgets:
        return
    with session(engine) as s:
        standing = read_standing(s, budgets, provider_now(settings), stop_margin_for(settings))
    for st in standing:
        if cap_usd > st.left_usd + EPSILON_USD:
            raise BadInputError(
                f"${cap_usd:g} cannot fit budget {st.scope} {st.name}: "
                f"{usd(max(st.left_usd, 0.0))} left ({st.figures()})", field="policy.budget_usd",
                value=cap_usd, hint="lower it, or submit once the budget has room "
                                    "(`spotrun budgets` shows what is left)")
