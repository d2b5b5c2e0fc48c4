"""The price of moving a checkpoint between clouds (docs/cost-model.md, "Moving between clouds")."""

from __future__ import annotations

import pytest

from spotrun.catalog import load_catalog, parse_catalog
from spotrun.costmodel.egress import (PRIOR_COPY_BYTES_PER_S, Throughput, egress_rate, move)
from spotrun.errors import ConfigError


def test_each_cloud_catalog_declares_its_published_internet_rate():
    aws = egress_rate("aws", load_catalog("aws"))
    gcp = egress_rate("gcp", load_catalog("gcp"))
    # The published first tiers: AWS $0.09 per GB (10^9 bytes), GCS $0.12 per GiB.
    assert aws.usd(10**9) == pytest.approx(0.09)
    assert gcp.usd(2**30) == pytest.approx(0.12)
    assert aws.source and gcp.source


def test_a_move_inside_one_cloud_costs_nothing_and_takes_no_time():
    rate = egress_rate("aws", load_catalog("aws"))
    m = move(40 * 10**9, "aws", "aws", rate)
    assert (m.usd, m.transfer_s, m.crosses) == (0.0, 0.0, False)


def test_a_move_out_of_a_cloud_pays_its_rate_and_waits_for_the_copy():
    rate = egress_rate("gcp", load_catalog("gcp"))
    nbytes = 60 * 2**30                     # a 60 GiB checkpoint (a 7B model in fp32 + Adam)
    m = move(nbytes, "gcp", "aws", rate, Throughput(bytes_per_s=100e6, source="measured (2)"))
    assert m.crosses
    assert m.usd == pytest.approx(60 * 0.12)
    assert m.transfer_s == pytest.approx(nbytes / 100e6)
    assert m.to_dict()["throughput"] == "measured (2)"


def test_without_a_measured_copy_the_prior_throughput_applies():
    t = Throughput.measured([])
    assert (t.bytes_per_s, t.source) == (PRIOR_COPY_BYTES_PER_S, "prior")
    t = Throughput.measured([(300, 1.0), (100, 3.0), (0, 5.0)])   # an empty copy says nothing
    assert t.bytes_per_s == pytest.approx(400 / 4.0)
    assert t.source == "measured (2 copies)"


def test_a_catalog_without_an_egress_section_names_what_is_missing():
    bare = parse_catalog({"instance_types": {}})
    with pytest.raises(ConfigError) as err:
        egress_rate("aws", bare)
    assert err.value.field == "egress"
    with pytest.raises(ConfigError):
        move(10, "aws", "gcp", None)
