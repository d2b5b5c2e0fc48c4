"""Cost model: the brief's worked figures, scaling rows, Young/Daly, learned speed, memory."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from spotrun.catalog import load_catalog, parse_catalog
from spotrun.costmodel import (CatalogPrices, JobStats, NoHistory, NoticePrior, PoolStats, Priors,
                               ScalingCurve, StaticHistory, ZonePrior, progress_fraction,
                               young_daly_interval_s)
from decide_helpers import rank_candidates
from spotrun.errors import SpecError
from spotrun.spec import parse_spec
from spotrun.states import Market

NOW = datetime(2030, 1, 1, tzinfo=timezone.utc)


def _catalog(rows: dict[str, dict[str, Any]], speeds: dict[str, float]) -> Any:
    return parse_catalog({
        "instance_types": rows,
        "gpu_speed": {g: {"amp": v, "fp32": v} for g, v in speeds.items()},
        "scaling_default": {1: 1.0, 2: 1.8, 4: 3.2, 8: 5.6, 16: 8.5},
    })


def _row(gpu: str, gpus: int, od: float, spot: float | None = None, mem: float = 80) -> dict:
    r = {"gpu": gpu, "gpus": gpus, "gpu_memory_gib": mem, "vcpus": 8, "ram_gib": 64,
         "od_usd_per_hour": {"r-1": od}}
    if spot is not None:
        r["spot_snapshot_usd_per_hour"] = [spot, spot]
    return r


def _spec(cat: Any, **sections: Any) -> Any:
    raw = {"name": "job", "command": "true", **sections}
    return parse_spec(raw, base_dir=Path("."), instance_types=cat.names(), zones=["r-1a", "r-1b"],
                      now=NOW)


def _rank(spec: Any, cat: Any, *, zones: tuple[str, ...] = ("r-1a",), history: Any = None,
          priors: Priors | None = None, prices: Any = None, **kw: Any) -> Any:
    return rank_candidates(spec, catalog=cat, zones=zones, prices=prices or CatalogPrices(cat, "r-1"),
                           history=history or NoHistory(), region="r-1", now=NOW,
                           priors=priors or Priors(checkpoint_min_s=0.0), **kw)


def test_previous_generation_card_is_35_percent_cheaper() -> None:
    # BRIEF: a card at 48/62 of the flagship's speed for 50% of its price: 62 h instead of 48 h,
    # about 35% less in total.
    cat = _catalog({"flag.x": _row("FLAG", 1, 10.0), "prev.x": _row("PREV", 1, 5.0)},
                   {"FLAG": 1.0, "PREV": 48 / 62})
    spec = _spec(cat, work={"reference_hours": 48, "reference_instance": "flag.x"},
                 policy={"market": "on-demand"})
    plan = _rank(spec, cat)
    by = {c.instance_type: c for c in plan.candidates}
    assert plan.candidates[0].instance_type == "prev.x"
    assert by["flag.x"].expected_hours == pytest.approx(48.0)
    assert by["prev.x"].expected_hours == pytest.approx(62.0)
    saved = 1 - by["prev.x"].expected_usd / by["flag.x"].expected_usd
    assert saved == pytest.approx(0.354, abs=0.005)
    assert plan.reference.instance_type == "flag.x" and plan.reference.market is Market.ON_DEMAND


def test_72h_on_demand_vs_85h_spot_costs_52_percent_less() -> None:
    # BRIEF: 72 h on-demand for 12,000; on spot, reclaimed twice with ~15 min restores, 85 h at
    # ~41% of the on-demand price for ~5,800 (52% less). A pool with one reclaim per 42.25 h of
    # running, 15 min restarts, a fixed 12.5 h checkpoint interval and missed notices (half an
    # interval lost per reclaim) is exactly that run.
    od = 12000 / 72
    cat = _catalog({"big.x": _row("G", 8, od, spot=0.41 * od)}, {"G": 1.0})
    spec = _spec(cat, work={"reference_hours": 72, "reference_instance": "big.x"},
                 checkpoint={"interval_minutes": 750})
    priors = Priors(zones={"r-1a": ZonePrior(up_hours=42.25, reclaims=1)}, restart_s=900,
                    checkpoint_min_s=0.0)
    plan = _rank(spec, cat, priors=priors, notice=NoticePrior(window_s=0.0, prior=0.0))
    spot = next(c for c in plan.candidates if c.market is Market.SPOT)
    assert plan.candidates[0] is spot
    assert plan.reference.expected_hours == pytest.approx(72.0)
    assert plan.reference.expected_usd == pytest.approx(12000.0)
    assert spot.expected_hours == pytest.approx(85.0)
    assert spot.expected_preemptions == pytest.approx(2.0)
    assert spot.expected_usd == pytest.approx(5808, abs=1)
    assert 1 - spot.expected_usd / plan.reference.expected_usd == pytest.approx(0.52, abs=0.005)


def test_multi_gpu_rows_follow_the_scaling_table() -> None:
    rows = {f"g.{n}x": _row("G", n, 1.0 * n) for n in (1, 2, 3, 4, 8, 16)}
    cat = _catalog(rows, {"G": 1.0})
    # A range lets each type use all of its GPUs (resources.gpus: "1-16").
    spec = _spec(cat, work={"reference_hours": 100, "reference_instance": "g.1x"},
                 resources={"gpus": "1-16"}, policy={"market": "on-demand"})
    by = {c.instance_type: c for c in _rank(spec, cat).candidates}
    for n, s in ((1, 1.0), (2, 1.8), (3, 2.5), (4, 3.2), (8, 5.6), (16, 8.5)):
        assert by[f"g.{n}x"].speedup == pytest.approx(s), n
        assert by[f"g.{n}x"].expected_hours == pytest.approx(100 / s)
        assert by[f"g.{n}x"].gpus == n
    # Sub-linear scaling at a per-GPU price: one GPU is the cheapest progress.
    assert _rank(spec, cat).candidates[0].instance_type == "g.1x"
    # A job's own curve overrides the default.
    own = _spec(cat, work={"reference_hours": 100, "reference_instance": "g.1x",
                           "scaling": {2: 2.0, 8: 7.2}}, resources={"gpus": "1-16"},
                policy={"market": "on-demand"})
    by = {c.instance_type: c for c in _rank(own, cat).candidates}
    assert by["g.2x"].speedup == pytest.approx(2.0)
    assert by["g.4x"].speedup == pytest.approx(2.0 + 5.2 * 2 / 6)
    assert by["g.8x"].speedup == pytest.approx(7.2)
    assert by["g.16x"].speedup == pytest.approx(7.2 + (7.2 - 2.0) / 6 * 8)


def test_scaling_spec_is_validated() -> None:
    cat = _catalog({"g.1x": _row("G", 1, 1.0)}, {"G": 1.0})
    with pytest.raises(SpecError) as err:
        _spec(cat, work={"scaling": {0: 1.0}})
    assert err.value.field == "work.scaling"
    # One GPU is the unit when a curve omits it.
    assert ScalingCurve.from_mapping({4: 3.0})(2) == pytest.approx(1.0 + 2.0 / 3.0)


def test_young_daly_matches_formula_and_is_the_recommended_interval() -> None:
    assert young_daly_interval_s(30.0, 7200.0) == pytest.approx(math.sqrt(2 * 30 * 7200))
    assert young_daly_interval_s(0.0, 7200.0) == 0.0
    cat = _catalog({"g.1x": _row("G", 1, 3.0, spot=1.0)}, {"G": 1.0})
    spec = _spec(cat, policy={"market": "spot"})
    priors = Priors(zones={"r-1a": ZonePrior(up_hours=2.0, reclaims=1)}, checkpoint_min_s=45.0,
                    interval_min_s=1.0, interval_max_s=1e9)
    c = _rank(spec, cat, priors=priors).candidates[0]
    assert c.mtbf_h == pytest.approx(2.0)
    assert c.checkpoint_interval_s == pytest.approx(math.sqrt(2 * 45.0 * 2 * 3600))
    # A fixed interval in the spec wins over Young/Daly.
    fixed = _spec(cat, checkpoint={"interval_minutes": 20}, policy={"market": "spot"})
    assert _rank(fixed, cat, priors=priors).candidates[0].checkpoint_interval_s == 1200.0


def test_progress_fraction_terms() -> None:
    base = dict(mtbf_h=2.0, restart_s=600.0, checkpoint_cost_s=30.0, interval_s=900.0)
    missed = progress_fraction(lost_per_reclaim_s=450.0, **base)
    caught = progress_fraction(lost_per_reclaim_s=0.0, **base)
    keep = 900 / 930
    assert caught == pytest.approx(keep * 7200 / 7800)
    assert missed == pytest.approx(keep * (7200 - 450) / 7800)
    assert progress_fraction(mtbf_h=None, restart_s=600, checkpoint_cost_s=30, interval_s=900,
                             lost_per_reclaim_s=450.0) == pytest.approx(keep)
    assert progress_fraction(mtbf_h=0.01, restart_s=600, checkpoint_cost_s=30, interval_s=900,
                             lost_per_reclaim_s=450.0) == 0.0


def test_rates_only_without_work() -> None:
    cat = _catalog({"g.1x": _row("G", 1, 2.0, spot=1.0)}, {"G": 1.0})
    plan = _rank(_spec(cat), cat)
    for c in plan.candidates:
        assert c.expected_hours is None and c.expected_usd is None
        assert c.usd_per_reference_hour > c.price_usd_per_hour * 0.99


def test_measured_speed_replaces_the_catalog_prior() -> None:
    cat = _catalog({"a.x": _row("A", 1, 1.0), "b.x": _row("B", 1, 1.0)}, {"A": 1.0, "B": 2.0})
    spec = _spec(cat, work={"total_steps": 36000, "reference_hours": 50,
                            "reference_instance": "a.x"}, policy={"market": "on-demand"})
    before = {c.instance_type: c for c in _rank(spec, cat).candidates}
    assert before["b.x"].speedup == pytest.approx(2.0)
    assert before["a.x"].expected_hours == pytest.approx(50.0)
    # The job measured 2 steps/s on a.x and only 1 on b.x: b.x is slower for THIS job.
    hist = StaticHistory(jobs={"j1": JobStats(steps_per_s={"a.x": 2.0, "b.x": 1.0})})
    after = _rank(spec, cat, history=hist, job_id="j1", steps_done=18000)
    by = {c.instance_type: c for c in after.candidates}
    assert by["b.x"].speedup == pytest.approx(0.5) and by["b.x"].speed_source == "measured"
    assert after.candidates[0].instance_type == "a.x"
    # Remaining work from the measured speed: 18,000 steps at 2 steps/s = 2.5 h.
    assert by["a.x"].expected_hours == pytest.approx(2.5)
    assert by["b.x"].expected_hours == pytest.approx(5.0)


def test_memory_whole_state_unless_fsdp() -> None:
    cat = load_catalog()
    zones = ["us-east-1a"]

    def feasible(model: dict, gpus: int = 8, **res: Any) -> set[str]:
        spec = parse_spec({"name": "m", "command": "x", "model": model,
                           "resources": {"gpus": gpus, **res}}, base_dir=Path("."),
                          instance_types=cat.names(), zones=zones, now=NOW)
        plan = rank_candidates(spec, catalog=cat, zones=zones, prices=CatalogPrices(cat, "us-east-1"),
                               history=NoHistory(), region="us-east-1", now=NOW)
        return {c.instance_type for c in plan.candidates}

    whole = feasible({"params_billion": 7, "sharding": "none"})
    split = feasible({"params_billion": 7, "sharding": "fsdp"})
    # 7B x 16 B + 7 GB = 119 GB per GPU unsharded: only the 141 GiB H200 holds it (151 GB, 121
    # usable); split over 8 GPUs it is 14 + 7 GB.
    assert whole == {"p5e.48xlarge", "p5en.48xlarge"}
    assert {"p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge"} <= split
    assert "g5.48xlarge" not in split and "p3dn.24xlarge" in split
    # resources.gpu_memory_gb overrides the estimate (a 24 GB A10G counts as 24 GB).
    explicit = feasible({"params_billion": 7}, gpus=1, gpu_memory_gb=24)
    assert "g5.xlarge" in explicit and "g4dn.xlarge" not in explicit
    infeasible = rank_candidates(
        parse_spec({"name": "m", "command": "x", "model": {"params_billion": 7}},
                   base_dir=Path("."), instance_types=cat.names(), zones=zones, now=NOW),
        catalog=cat, zones=zones, prices=CatalogPrices(cat, "us-east-1"), history=NoHistory(),
        region="us-east-1", now=NOW).rejected
    assert all("GB per GPU" in i.reason for i in infeasible if i.kind == "never")


def test_pool_history_sets_reclaim_rate_restart_and_notice() -> None:
    cat = _catalog({"g.1x": _row("G", 1, 3.0, spot=1.0)}, {"G": 1.0})
    spec = _spec(cat, policy={"market": "spot"})
    priors = Priors(zones={"r-1a": ZonePrior(up_hours=10.0, reclaims=1)}, restart_s=900)
    hist = StaticHistory(pools={("g.1x", "r-1a"): PoolStats(
        run_hours=10.0, reclaims=9.0, notices_caught=9.0, restart_s_total=300.0, restarts=3)})
    c = _rank(spec, cat, priors=priors, history=hist).candidates[0]
    assert c.mtbf_h == pytest.approx(20.0 / 10.0)
    assert c.restart_s == pytest.approx((300 + 900) / 4)
