"""Project and owner budget alerts: `budget_80` and `budget_100`, once per budget and period.

The scheduler reads every budget's standing once per pass (spotrun.budgets.guard) and
hands it here; an alert that is due becomes one outbox row per webhook, under a key that
names the budget, its amount and its period (`budget_80:project:ml:2030-01:2000`), so the
outbox's unique key makes it happen once, whichever daemon or restart finds it first. The
notify loop delivers the rows like any other (spotrun.notify.deliver).

- `budget_80`: spend plus what the running jobs have committed reaches `[notify]
  budget_warn_fraction` of the budget (what the stop counts: it always comes first);
- `budget_100`: spend plus what the running jobs have committed reaches the budget: the
  point where spotrun stops the scope's running jobs and holds its launches.
"""

from __future__ import annotations

from typing import Any, Iterable

from sqlalchemy.exc import IntegrityError

from spotrun.db import session
from spotrun.notify.routes import NotifyConfig
from spotrun.notify.events import Alert
from spotrun.db.outbox import add_missing


def scope_alerts(standing: Iterable[Any], warn_fraction: float) -> list[Alert]:
    """The alerts these budgets' figures call for (ScopeStanding items)."""
    out = []
    for st in standing:
        tag = f"{st.key}:{st.window.key}:{st.budget_usd:g}"
        # What the stop counts (spent + committed), so a scope never stops before its 80 %
        # alert; the 80 % one is listed first, so the outbox holds it first.
        used = st.spent_usd + st.committed_usd
        if used >= warn_fraction * st.budget_usd:
            out.append(Alert(f"budget_80:{tag}", "budget_80", st.key,
                             f"spotrun: budget {st.scope} {st.name} has used "
                             f"{used / st.budget_usd * 100:.0f}% (spent + committed): "
                             f"{st.figures()}"))
        if used >= st.budget_usd:
            out.append(Alert(f"budget_100:{tag}", "budget_100", st.key,
                             f"spotrun: {st.stop_reason()}; its running jobs save and stop, "
                             f"its launches wait for the next period or a raised budget"))
    return out


class ScopeAlerts:
    """Queues due scope alerts in the outbox; keys already queued are remembered, so a pass
    with nothing new costs no statement."""

    def __init__(self, engine: Any, config: NotifyConfig, warn_fraction: float) -> None:
        self.engine = engine
        self.config = config
        self.warn_fraction = warn_fraction
        self._queued: set[str] = set()

    def queue(self, standing: Iterable[Any]) -> int:
        """Write the outbox rows of new alerts; how many rows were added."""
        if not self.config.webhooks:
            return 0
        due = [a for a in scope_alerts(standing, self.warn_fraction)
               if a.key not in self._queued]
        if not due:
            return 0
        with session(self.engine) as s:
            added = add_missing(s, due, self.config.targets)
            try:
                s.commit()
            except IntegrityError:   # another daemon queued one first: it stays one; the
                s.rollback()         # next pass adds what is still missing
                return 0
        self._queued.update(a.key for a in due)
        return added
