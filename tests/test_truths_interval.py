"""`checkpoint.interval_minutes: auto` is Young/Daly clamped to 60 s - 1 h, the floor in wall
seconds (a save costs real time) and the ceiling on the provider's clock (the work at risk),
on the paced local market too, where that clock runs x`time_scale` while jobs train
(docs/cost-model.md, "Checkpoint interval"; docs/local-provider.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from spotrun.catalog import load_catalog
from spotrun.cli import cli
from spotrun.costmodel.memory import checkpoint_gb
from spotrun.costmodel.model import recommended_interval_s
from spotrun.costmodel.priors import priors_from_catalog
from spotrun.decide import checkpoint_interval_s
from spotrun.spec import JobSpec, load_spec_file

SPEC = """name: auto-interval
command: python train.py
resources: {{gpus: 1, instance_types: [p3.2xlarge]{memory}}}
{model}work: {{total_steps: 1000}}
checkpoint: {{interval_minutes: {interval}}}
policy: {{market: spot}}
"""
# A 3B-parameter model: its state blocks a save for about 42 s (1 s per GB), which puts
# Young/Daly inside the bounds; its memory said outright, so that a 16 GB V100 takes it.
BIG = {"model": "model: {params_billion: 3}\n", "memory": ", gpu_memory_gb: 10"}


def _spec(tmp_path: Path, model: str = "", memory: str = "", interval: str = "auto") -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(SPEC.format(model=model, memory=memory, interval=interval))
    return path


def _plan(tmp_path: Path, time_scale: float | None = None, **spec: str) -> list[dict]:
    home = tmp_path / "home"      # the embedded default: the local market at x60, not started
    if time_scale is not None:
        home.mkdir()
        (home / "spotrun.toml").write_text(f"[local]\ntime_scale = {time_scale}\n")
    res = CliRunner().invoke(cli, ["plan", str(_spec(tmp_path, **spec)), "--json"],
                             env={"SPOTRUN_HOME": str(home)})
    assert res.exit_code == 0, res.output
    return [c for c in json.loads(res.output)["candidates"] if c["market"] == "spot"]


def _load(tmp_path: Path, **kw: str) -> JobSpec:
    return load_spec_file(_spec(tmp_path, **kw), instance_types=["p3.2xlarge"],
                          zones=["us-east-1a"])


def test_auto_on_the_default_local_market_saves_once_a_wall_minute(tmp_path: Path):
    # At x60 the bounds meet: a wall minute is an hour of market time.
    for c in _plan(tmp_path):
        assert c["checkpoint_interval_wall_s"] == 60.0, c      # not 1 s: a save every step
        assert c["checkpoint_interval_s"] == 3600.0


def test_auto_between_the_bounds_is_young_daly_in_wall_seconds(tmp_path: Path):
    [c, *_] = _plan(tmp_path, time_scale=10.0, **BIG)    # bounds: 60-360 wall seconds
    priors = priors_from_catalog(load_catalog())
    cost_s = max(priors.checkpoint_min_s,
                 checkpoint_gb(_load(tmp_path, **BIG), 1) * priors.checkpoint_s_per_gb)
    mtbf_wall_s = 3600.0 / c["reclaims_per_hour"] / 10.0
    young_daly = math.sqrt(2 * cost_s * mtbf_wall_s)
    assert 60.0 < young_daly < 360.0
    assert c["checkpoint_interval_wall_s"] == pytest.approx(young_daly, rel=0.01)
    assert c["checkpoint_interval_s"] == pytest.approx(young_daly * 10.0, rel=0.01)


def test_on_a_wall_clock_the_rule_is_unchanged(tmp_path: Path) -> None:
    priors = priors_from_catalog(load_catalog())
    spec = _load(tmp_path)
    for cost_s, mtbf_h in ((0.05, 1.67), (10.0, 1.67), (48.0, 2.0), (5.0, None)):
        want = recommended_interval_s(cost_s, mtbf_h, min_s=priors.interval_min_s,
                                      max_s=priors.interval_max_s)
        assert checkpoint_interval_s(spec, cost_s, mtbf_h, priors) == want
    # Faster than x60 the bounds cross: an hour of the provider's clock is the most at risk.
    assert checkpoint_interval_s(spec, 0.05, 1.67, priors, 600.0) == priors.interval_max_s
    fixed = _load(tmp_path, interval="10")
    assert checkpoint_interval_s(fixed, 0.05, 1.67, priors, 60.0) == 600.0   # market minutes
