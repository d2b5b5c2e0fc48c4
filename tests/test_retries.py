"""One retry policy: botocore's standard retries with our limits on every client (moto on
127.0.0.1), and tenacity for our own waits (the schema lock)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from sqlalchemy import create_engine

from aws.moto_fixtures import MotoServer, moto, moto_server  # noqa: F401  (fixtures)
from spotrun.aws_clients import RetryPolicy, make_client, use_retries
from spotrun.db.faults import LOCK_SUFFIX, schema_lock
from spotrun.errors import DatabaseError

FAST = RetryPolicy(attempts=3, base_s=0.001, max_s=0.01)


def test_throttling_is_retried_up_to_our_attempts(moto: MotoServer):  # noqa: F811
    ec2 = make_client("ec2", region="us-east-1", endpoint_url=moto.url, retry=FAST)
    moto.layer.fail("DescribeInstances", "RequestLimitExceeded", status=503, times=2)
    ec2.describe_instances()
    assert [c.status for c in moto.layer.calls("DescribeInstances")] == [503, 503, 200]
    moto.layer.reset()
    moto.layer.fail("DescribeInstances", "RequestLimitExceeded", status=503, times=None)
    with pytest.raises(ClientError):
        ec2.describe_instances()
    assert len(moto.layer.calls("DescribeInstances")) == FAST.attempts


def test_capacity_errors_are_never_retried_even_as_500(moto: MotoServer):  # noqa: F811
    ec2 = make_client("ec2", region="us-east-1", endpoint_url=moto.url, retry=FAST)
    moto.layer.fail("DescribeInstances", "InsufficientInstanceCapacity", status=500, times=None)
    with pytest.raises(ClientError) as err:
        ec2.describe_instances()
    assert err.value.response["Error"]["Code"] == "InsufficientInstanceCapacity"
    assert len(moto.layer.calls("DescribeInstances")) == 1


def test_a_given_client_takes_our_limits(moto: MotoServer):  # noqa: F811
    """A client built elsewhere (e.g. a test's) gets the provider's policy, not botocore's."""
    ec2 = make_client("ec2", region="us-east-1", endpoint_url=moto.url,
                      retry=RetryPolicy(attempts=6, base_s=0.001, max_s=0.01))
    use_retries(ec2, RetryPolicy(attempts=2, base_s=0.001, max_s=0.01))
    moto.layer.fail("DescribeInstances", "RequestLimitExceeded", status=503, times=None)
    with pytest.raises(ClientError):
        ec2.describe_instances()
    assert len(moto.layer.calls("DescribeInstances")) == 2


def test_schema_lock_held_elsewhere_gives_up_in_one_line(tmp_path: Path):
    db = tmp_path / "spotrun.db"
    engine = create_engine(f"sqlite:///{db}")
    fd = os.open(str(db) + LOCK_SUFFIX, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # another holder (a second open file)
        with pytest.raises(DatabaseError) as err:
            with schema_lock(engine, timeout_s=0.1):
                pass
        assert "locked by another process" in str(err.value) and "\n" not in str(err.value)
    finally:
        os.close(fd)
    with schema_lock(engine, timeout_s=0.1):   # free again: taken at once
        pass
