"""Pure parts of the market: the clock mapping and the order book over a hand-made trace."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import write_prices, write_trace

from spotrun.catalog import load_catalog
from spotrun.providers.local.market.book import MarketBook
from spotrun.providers.local.market.clock import ManualClock, MarketClock, aws_time
from spotrun.providers.local.market.options import MarketOptions
from spotrun.traces import load_prices, load_trace


def _book(tmp_path: Path, prices: bool = True) -> MarketBook:
    trace = load_trace(write_trace(tmp_path / "t.csv", {"za": [1, 1, 0, 1, None],
                                                        "zb": [1, 1, 1, 1, 1]}, 100.0))
    book = load_prices(write_prices(tmp_path / "p.csv", [("za", 0, 1.0), ("za", 3, 2.0),
                                                         ("zb", 0, 0.5)])) if prices else None
    return MarketBook(trace, catalog=load_catalog(), region="us-east-1", trace_type="p3.2xlarge",
                      prices=book)


def test_clock_runs_time_scale_faster_from_the_epoch() -> None:
    wall = ManualClock(1000.0)
    clock = MarketClock(epoch_wall_s=1000.0, time_scale=60.0, start_tick=5, tick_s=195.0,
                        wall=wall)
    assert clock.now_s() == 1000.0 and clock.position(clock.now_s()) == 5.0
    wall.advance(6.5)
    assert clock.now_s() == pytest.approx(1000.0 + 390.0)
    assert clock.position(clock.now_s()) == pytest.approx(7.0)
    assert clock.time_of(7.0) == pytest.approx(1390.0)
    assert clock.wall_s(1390.0) == pytest.approx(1006.5)
    assert aws_time(1505817720.9) == "2017-09-19T10:42:00Z"


def test_availability_blank_is_unavailable_and_replay_is_cyclic(tmp_path: Path) -> None:
    book = _book(tmp_path)
    assert [book.available("za", p) for p in range(5)] == [True, True, False, True, False]
    assert book.available("za", 5.5) is True            # row 0 again
    assert book.next_unavailable("za", 0.3) == 2
    assert book.next_unavailable("za", 3.0) == 4
    assert book.next_unavailable("za", 4.2) == 7        # wraps: rows 5, 6 = 0, 1; row 7 = 2
    assert book.next_unavailable("zb", 0.0) is None
    assert book.available("nowhere", 0) is False


def test_spot_price_scales_by_on_demand_ratio(tmp_path: Path) -> None:
    book = _book(tmp_path)
    assert book.spot_price("p3.2xlarge", "za", 2.9) == 1.0
    assert book.spot_price("p3.2xlarge", "za", 3.0) == 2.0
    ratio = load_catalog().get("p4d.24xlarge").on_demand_price("us-east-1") / 3.06
    assert book.spot_price("p4d.24xlarge", "zb", 0) == pytest.approx(0.5 * ratio, rel=1e-6)
    assert book.spot_price("p5e.48xlarge", "zb", 0) is None      # no on-demand price listed
    assert "p5e.48xlarge" not in book.instance_types()


def test_price_points_include_the_one_in_effect_and_changes_across_cycles(tmp_path: Path) -> None:
    book = _book(tmp_path)
    pts = book.price_points("p3.2xlarge", "za", 1.5, 9.0)
    assert [(p.position, p.price_usd_per_hour) for p in pts] == [(1.5, 1.0), (3.0, 2.0),
                                                                 (5.0, 1.0), (8.0, 2.0)]
    assert book.price_points("p3.2xlarge", "zb", 0.0, 9.0)[1:] == []


def test_without_prices_the_catalog_snapshot_midpoint_is_used(tmp_path: Path) -> None:
    book = _book(tmp_path, prices=False)
    assert book.spot_price("p3.2xlarge", "za", 0) == pytest.approx((0.371 + 0.428) / 2)


def test_packaged_demo_extract_loads_with_prices() -> None:
    book = MarketOptions().load_book()
    assert book.zones == ["us-east-1a", "us-east-1c", "us-east-1d", "us-east-1f"]
    assert book.trace.tick_s == 195.0 and book.rows == 300
    assert book.spot_price("p3.2xlarge", "us-east-1d", 0) == 1.1859
    # The demo window flips often: several reclaims in the first 45 rows, any policy.
    downs = sum(1 for z in book.zones for r in range(1, 45)
                if book.available(z, r - 1) and not book.available(z, r))
    assert downs >= 8


def test_options_validate_names_the_field() -> None:
    from spotrun.errors import BadInputError
    with pytest.raises(BadInputError) as err:
        MarketOptions(time_scale=0).validate()
    assert err.value.field == "time_scale"
    with pytest.raises(BadInputError) as err:
        MarketOptions(instance_type="x9.huge").validate()
    assert err.value.field == "instance_type"
