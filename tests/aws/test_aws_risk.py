"""Reclaim-risk hints on AWS: placement scores through boto3 (moto + layer), the advisor file."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from risk_helpers import ADVISOR, AdvisorServer

from spotrun.catalog import load_catalog
from spotrun.costmodel.risk import risk_model
from spotrun.providers.aws.provider import AwsProvider

T0 = datetime(2026, 3, 1, tzinfo=timezone.utc)


def _zone_ids(ec2: Any) -> dict[str, str]:
    zones = ec2.describe_availability_zones()["AvailabilityZones"]
    return {z["ZoneName"]: z["ZoneId"] for z in zones}


def _provider(settings: Any, clock: dict[str, datetime], **aws: Any) -> AwsProvider:
    new_aws = dataclasses.replace(settings.aws, **aws)
    return AwsProvider.from_settings(dataclasses.replace(settings, aws=new_aws),
                                     clock=lambda: clock["now"])


def test_placement_scores_through_boto3_nudge_the_prior_per_zone(aws_settings, moto, ec2):
    ids = _zone_ids(ec2)
    moto.layer.set_placement_scores([
        ("g6.xlarge", "us-east-1", ids["us-east-1a"], 9),
        ("g6.xlarge", "us-east-1", ids["us-east-1c"], 2),
        ("p4d.24xlarge", "us-east-1", ids["us-east-1a"], 1)])
    clock = {"now": T0}
    p = _provider(aws_settings, clock)
    hints = p.risk_hints(["g6.xlarge"], ["us-east-1a", "us-east-1c"])
    assert {k: h.placement_score for k, h in hints.items()} == {
        ("g6.xlarge", "us-east-1a"): 9, ("g6.xlarge", "us-east-1c"): 2}
    calls = moto.layer.calls("GetSpotPlacementScores")
    assert len(calls) == 1 and calls[0].status == 200
    assert calls[0].params["InstanceType.1"] == "g6.xlarge"
    assert calls[0].params["SingleAvailabilityZone"] == "true"
    assert calls[0].params["RegionName.1"] == "us-east-1"
    assert "InstanceType.2" not in calls[0].params       # one type per call: its own score

    cat = load_catalog()
    plain, live = risk_model(cat), risk_model(cat, hints=hints)
    for zone, factor in (("us-east-1a", 2 ** (-3.5 / 4.5)), ("us-east-1c", 2 ** (3.5 / 4.5))):
        got = live.prior("g6.xlarge", zone)
        assert got.source == "trace-nearest-family+placement-score"
        assert got.reclaims_per_hour == pytest.approx(
            plain.prior("g6.xlarge", zone).reclaims_per_hour * factor)

    # Within the max age the scores come from memory; after it, from EC2 again.
    p.risk_hints(["g6.xlarge"], ["us-east-1a"])
    assert len(moto.layer.calls("GetSpotPlacementScores")) == 1
    clock["now"] = T0 + timedelta(hours=2)
    p.risk_hints(["g6.xlarge"], ["us-east-1a"])
    assert len(moto.layer.calls("GetSpotPlacementScores")) == 2


def test_placement_scores_denied_is_logged_and_the_advisor_still_counts(aws_settings, moto,
                                                                        tmp_path, caplog):
    srv = AdvisorServer(json.dumps(ADVISOR).encode())
    try:
        moto.layer.fail("GetSpotPlacementScores", "UnauthorizedOperation", times=None)
        p = _provider(aws_settings, {"now": T0}, spot_advisor_url=srv.url)
        with caplog.at_level("WARNING"):
            hints = p.risk_hints(["g6.xlarge"], ["us-east-1a"])
        assert "spot placement scores" in caplog.text and "UnauthorizedOperation" in caplog.text
        assert hints[("g6.xlarge", "us-east-1a")].advisor_label == "<5%"
        assert hints[("g6.xlarge", "us-east-1a")].placement_score is None
        assert srv.requests == 1
        # The cache lives under SPOTRUN_HOME/cache; a second provider does not fetch again.
        assert (aws_settings.home_path / "cache" / "spot-advisor-data.json").exists()
        _provider(aws_settings, {"now": T0 + timedelta(hours=1)},
                  spot_advisor_url=srv.url).risk_hints(["g6.xlarge"], ["us-east-1a"])
        assert srv.requests == 1
    finally:
        srv.stop()


def test_risk_hints_never_raise(aws_settings, moto):
    moto.layer.fail("DescribeAvailabilityZones", "RequestLimitExceeded", status=503, times=None)
    p = _provider(aws_settings, {"now": T0},
                  spot_advisor_url="http://127.0.0.1:9/spot-advisor-data.json")
    assert p.risk_hints(["g6.xlarge"], ["us-east-1a"]) == {}


def test_placement_scores_read_every_page(aws_settings, moto, ec2, monkeypatch):
    # Ten scores a page (EC2's least): six unknown zone ids sort first, so two of the
    # region's zones are only on the second page.
    import spotrun.providers.aws.risk as risk
    monkeypatch.setattr(risk, "PLACEMENT_PAGE_SIZE", 10)
    ids = _zone_ids(ec2)
    known = sorted(ids.items(), key=lambda kv: kv[1])
    fake = [("g6.xlarge", "us-east-1", f"use1-az0{i}", 5) for i in range(6)]
    moto.layer.set_placement_scores(fake + [("g6.xlarge", "us-east-1", zid, 1 + i % 9)
                                            for i, (_, zid) in enumerate(known)])
    p = _provider(aws_settings, {"now": T0})
    hints = p.risk_hints(["g6.xlarge"], [name for name, _ in known])
    assert {n: hints[("g6.xlarge", n)].placement_score for n, _ in known} == {
        n: 1 + i % 9 for i, (n, _) in enumerate(known)}
    calls = moto.layer.calls("GetSpotPlacementScores")
    assert len(calls) == 2 and calls[0].params["MaxResults"] == "10"
    assert "NextToken" not in calls[0].params and calls[1].params["NextToken"]
