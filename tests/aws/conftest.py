"""Fixtures for the AWS tests: moto on 127.0.0.1, settings pointing at it, a provider."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from spotrun.aws_clients import make_client
from spotrun.config import Settings, load_settings
from spotrun.providers.aws.provider import AwsProvider

from .moto_fixtures import MotoServer, moto, moto_server  # noqa: F401  (fixtures)


@pytest.fixture
def ec2(moto: MotoServer) -> Any:  # noqa: F811
    """A boto3 EC2 client on moto."""
    return make_client("ec2", region="us-east-1", endpoint_url=moto.url)


@pytest.fixture
def aws_settings(moto: MotoServer, ec2: Any, tmp_path: Any) -> Settings:  # noqa: F811
    """Settings for the aws provider: moto's default subnets, an AMI, fast retries."""
    subnets = [f"{s['AvailabilityZone']}={s['SubnetId']}"
               for s in ec2.describe_subnets()["Subnets"]
               if s["AvailabilityZone"] in ("us-east-1a", "us-east-1b", "us-east-1c")]
    ami = ec2.describe_images(Owners=["amazon"], Filters=[
        {"Name": "name", "Values": ["Deep Learning AMI*"]}])["Images"][0]["ImageId"]
    sg = ec2.describe_security_groups()["SecurityGroups"][0]["GroupId"]

    return load_settings(str(tmp_path / "home"), {
        "provider": "aws", "aws.endpoint_url": moto.url, "aws.ami_id": ami,
        "aws.subnets": subnets, "aws.security_group_ids": [sg], "aws.key_name": "",
        "aws.instance_profile_arn": "",
        "aws.spotrun_install": "spotrun==0.1.0", "aws.volume_size_gb": 50,
        "aws.retry_base_s": 0.001, "aws.retry_max_s": 0.01, "aws.retry_attempts": 4,
        "aws.spot_advisor_url": "",   # tests reach only 127.0.0.1; risk tests serve one there
    })


@pytest.fixture
def provider(aws_settings: Settings) -> AwsProvider:
    """The aws provider on moto (fleet launches)."""
    return AwsProvider.from_settings(aws_settings)


def make_instance_profile(moto: MotoServer) -> str:  # noqa: F811
    """Create the agent's role and instance profile in moto (IAM is slow to reset: opt-in)."""
    iam = make_client("iam", region="us-east-1", endpoint_url=moto.url)
    name = f"spotrun-agent-{uuid.uuid4().hex[:8]}"   # IAM is not reset between tests
    iam.create_role(RoleName=name, AssumeRolePolicyDocument="{}")
    arn = iam.create_instance_profile(InstanceProfileName=name)["InstanceProfile"]["Arn"]
    iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name)
    return arn
