"""The Spot Instance Advisor file: served on 127.0.0.1, cached on disk, turned into priors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest
from risk_helpers import ADVISOR, AdvisorServer

from spotrun.catalog import load_catalog
from spotrun.costmodel.risk import risk_model
from spotrun.providers.aws.risk import AdvisorFeed, AwsRisk, advisor_hints, parse_ranges


@pytest.fixture
def advisor_server() -> Iterator[AdvisorServer]:
    srv = AdvisorServer(json.dumps(ADVISOR).encode())
    yield srv
    srv.stop()


class Clock:
    """Epoch seconds that tests move by hand."""

    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_ranges_are_monthly_fractions_with_the_open_bucket_bounded() -> None:
    r = parse_ranges(ADVISOR)
    assert r[0] == (0.0, 0.05, "<5%") and r[1] == (0.05, 0.11, "5-10%")
    assert r[4][0] == pytest.approx(0.22) and r[4][1] == pytest.approx(0.32)
    with pytest.raises(ValueError):
        parse_ranges({"ranges": []})


def test_advisor_file_changes_the_prior_and_is_fetched_once_within_max_age(
        advisor_server: AdvisorServer, tmp_path: Path) -> None:
    clock = Clock()
    feed = AdvisorFeed(advisor_server.url, cache_dir=tmp_path / "cache", max_age_s=3600,
                       clock=clock)
    risk = AwsRisk(call=_no_ec2, region="us-east-1", advisor=feed, placement=False, clock=clock)
    zones = ["us-east-1f", "us-west-2c"]
    hints = risk.hints(["g6.xlarge"], zones)
    assert advisor_server.requests == 1
    assert hints[("g6.xlarge", "us-east-1f")].advisor_label == "<5%"
    assert hints[("p3.2xlarge", "us-east-1f")].advisor_label == ">20%"   # the reference, added
    cat = load_catalog()
    before, after = risk_model(cat), risk_model(cat, hints=hints)
    east_b, east_a = before.prior("g6.xlarge", "us-east-1f"), after.prior("g6.xlarge", "us-east-1f")
    assert east_a.source == "trace-nearest-family+advisor"
    # <5% (mid 2.5%) against the traced p3.2xlarge's >20% (mid 27%): about 11x fewer reclaims.
    assert east_a.reclaims_per_hour == pytest.approx(east_b.reclaims_per_hour * 0.025 / 0.27)
    # Same bucket as p3.2xlarge in us-west-2: ratio 1, the trace figure stands.
    assert after.prior("g6.xlarge", "us-west-2c").mtbf_h == pytest.approx(
        before.prior("g6.xlarge", "us-west-2c").mtbf_h)
    # The traced type itself is not rescaled by its own bucket.
    assert after.prior("p3.2xlarge", "us-east-1f").source == "trace"

    clock.t += 3599
    again = AwsRisk(call=_no_ec2, region="us-east-1", placement=False, clock=clock,
                    advisor=AdvisorFeed(advisor_server.url, cache_dir=tmp_path / "cache",
                                        max_age_s=3600, clock=clock))
    assert again.hints(["g6.xlarge"], zones) == hints
    assert advisor_server.requests == 1            # a new process reads the disk cache
    clock.t += 2
    feed.load()
    assert advisor_server.requests == 2            # past max age: fetched again


def test_a_failed_fetch_uses_the_stale_cache_else_nothing(advisor_server: AdvisorServer,
                                                          tmp_path: Path) -> None:
    clock = Clock()
    feed = AdvisorFeed(advisor_server.url, cache_dir=tmp_path, max_age_s=60, clock=clock)
    assert feed.load() is not None
    advisor_server.status = 503
    clock.t += 120
    assert feed.load() == ADVISOR and advisor_server.requests == 2
    clock.t += 599
    assert feed.load() == ADVISOR and advisor_server.requests == 2    # no retry storm
    clock.t += 2
    advisor_server.status = 200
    assert feed.load() == ADVISOR and advisor_server.requests == 3
    clock.t += 30
    assert feed.load() == ADVISOR and advisor_server.requests == 3    # fresh again
    advisor_server.status = 503
    fresh = AdvisorFeed(advisor_server.url, cache_dir=tmp_path / "empty", clock=clock)
    risk = AwsRisk(call=_no_ec2, region="us-east-1", advisor=fresh, placement=False, clock=clock)
    assert risk.hints(["g6.xlarge"], ["us-east-1a"]) == {}


def test_a_file_of_another_shape_is_not_cached_and_gives_no_hints(tmp_path: Path) -> None:
    srv = AdvisorServer(b'{"hello": "world"}')
    try:
        feed = AdvisorFeed(srv.url, cache_dir=tmp_path, clock=Clock())
        risk = AwsRisk(call=_no_ec2, region="us-east-1", advisor=feed, placement=False)
        assert risk.hints(["g6.xlarge"], ["us-east-1a"]) == {}
        assert not list(tmp_path.iterdir())
    finally:
        srv.stop()


def test_types_missing_from_the_file_get_no_advisor_hint() -> None:
    got = advisor_hints(ADVISOR, ["g6.xlarge", "p5.48xlarge"], ["us-east-1a", "eu-west-1a"])
    assert set(got) == {("g6.xlarge", "us-east-1a")}
    assert got[("g6.xlarge", "us-east-1a")].advisor_range == (0.0, 0.05)   # Linux, not Windows


def _no_ec2(method: str, **kw: Any) -> Any:
    raise AssertionError(f"no EC2 call expected here: {method}")
