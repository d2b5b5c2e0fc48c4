"""One simulated run: a policy driven tick by tick over a trace window.

The rules live with the policies (spotrun.decide.policy.replay), because the `spotrun`
policy's shadow runs replay its candidates by the very same rules: a reclaim loses its tick
unpaid, every launch or move pays the changeover at the new price, progress survives
reclaims.
"""

from __future__ import annotations

from spotrun.decide.policy.base import IDLE, Decision, JobProgress, Policy
from spotrun.decide.policy.replay import RunResult, replay
from spotrun.simulate.model import SimModel

__all__ = ["RunResult", "ScheduledPolicy", "run_policy"]


def run_policy(model: SimModel, policy: Policy, start_row: int, *,
               record: bool = False) -> RunResult:
    """Drive policy over the window starting at start_row; record=True keeps decisions."""
    return replay(model.history, policy, start_row, model.work_ticks, model.deadline_ticks,
                  model.changeover_ticks, record=record, moves=model.moves)


class ScheduledPolicy:
    """Replays a fixed list of decisions (the optimum's); no safety net: it saw the future."""

    def __init__(self, schedule: list[Decision], name: str = "optimal") -> None:
        self.name = name
        self._schedule = schedule
        self._i = 0

    def decide(self, job: JobProgress, market: object) -> Decision:
        """The next scheduled decision (idle once the schedule ends)."""
        tau = round(job.elapsed_s / job.tick_s)
        return self._schedule[tau] if tau < len(self._schedule) else IDLE
