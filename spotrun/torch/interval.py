"""How often the Checkpointer saves: seconds, "auto" (Young/Daly from the measured save cost),
or none (only every_steps)."""

from __future__ import annotations

from spotrun.errors import ConfigError
from spotrun.torch.envconf import DEFAULT_INTERVAL_S

AUTO_FIRST_S = 60.0              # first save under "auto", to measure the save cost
AUTO_BOUNDS_S = (30.0, 3600.0)


def young_daly_s(save_cost_s: float, mtbf_s: float) -> float:
    """The cost model's Young/Daly interval (one formula), clamped to the library's bounds.

    Used when the job runs outside spotrun, or re-tunes itself from its measured save cost;
    under spotrun the agent passes the decision's interval (SPOTRUN_CHECKPOINT_INTERVAL_S).
    """
    # Start-up cost: spotrun.costmodel's package pulls in the database layer (~1.5 s), and
    # most jobs never use interval_s="auto".
    from spotrun.costmodel.model import recommended_interval_s
    return recommended_interval_s(max(save_cost_s, 1e-3), mtbf_s / 3600.0,
                                  min_s=AUTO_BOUNDS_S[0], max_s=AUTO_BOUNDS_S[1])


def first_interval_s(given: float | str | None, from_env: float | str | None,
                     every_steps: int | None) -> tuple[float | None, bool]:
    """(seconds until the first periodic save or None, whether "auto" re-tunes it after each)."""
    raw = given if given is not None else from_env
    if raw == "auto":
        return AUTO_FIRST_S, True
    if isinstance(raw, str):
        raise ConfigError("interval must be seconds or 'auto'", field="interval_s", value=raw)
    if raw is None:   # every_steps alone saves by steps only
        return (DEFAULT_INTERVAL_S if every_steps is None else None), False
    return raw, False
