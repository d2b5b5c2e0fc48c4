"""Spot prices from describe_spot_price_history, with prices injected by the test layer."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest

T0 = datetime(2025, 9, 1, tzinfo=timezone.utc)


def test_price_history_pages_filters_and_includes_point_in_effect(provider, moto):
    rng = random.Random(7)
    points = []
    for zone in ("us-east-1a", "us-east-1b", "us-east-1d"):
        for i in range(700):        # > 1000 matching rows in all: two pages
            points.append(("g5.xlarge", zone, T0 + timedelta(minutes=10 * i),
                           round(rng.uniform(0.40, 0.46), 4)))
    points.append(("p4d.24xlarge", "us-east-1a", T0, 9.0))
    moto.layer.set_prices(points)
    start, end = T0 + timedelta(minutes=95), T0 + timedelta(minutes=10 * 699)
    hist = provider.price_history("g5.xlarge", ["us-east-1a", "us-east-1b"], start, end)
    by_zone = {z: [h for h in hist if h.zone == z] for z in ("us-east-1a", "us-east-1b")}
    assert set(h.zone for h in hist) == {"us-east-1a", "us-east-1b"}
    for zone, rows in by_zone.items():
        expected = [p for p in points if p[1] == zone and p[0] == "g5.xlarge"
                    and start - timedelta(minutes=10) < p[2] <= end]
        assert [(h.ts, h.price_usd_per_hour) for h in rows] == [(p[2], p[3]) for p in expected]
    assert rows[0].ts < start     # the point in effect at start comes first
    assert len(moto.layer.calls("DescribeSpotPriceHistory")) >= 2
    assert all(h.instance_type == "g5.xlarge" for h in hist)


def test_spot_price_is_the_one_in_effect_and_cached(aws_settings, moto):
    from spotrun.providers.aws.provider import AwsProvider
    clock = {"now": T0 + timedelta(hours=1)}
    p = AwsProvider.from_settings(aws_settings, clock=lambda: clock["now"])
    moto.layer.set_prices([("g5.xlarge", "us-east-1a", T0, 0.41),
                           ("g5.xlarge", "us-east-1a", T0 + timedelta(minutes=30), 0.44),
                           ("g5.xlarge", "us-east-1a", T0 + timedelta(hours=2), 0.99)])
    assert p.spot_price("g5.xlarge", "us-east-1a") == pytest.approx(0.44)
    assert p.spot_price("g5.xlarge", "us-east-1a") == pytest.approx(0.44)
    assert len(moto.layer.calls("DescribeSpotPriceHistory")) == 1
    clock["now"] = T0 + timedelta(hours=3)
    assert p.spot_price("g5.xlarge", "us-east-1a") == pytest.approx(0.99)
    assert p.spot_price("g5.xlarge", "us-east-1f") is None
