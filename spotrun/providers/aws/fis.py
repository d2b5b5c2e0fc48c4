"""Pure builders of the Fault Injection Service calls `spotrun interrupt` makes on AWS.

One experiment template per interruption: the instances by ARN as the target of
`aws:ec2:send-spot-instance-interruptions`, whose `durationBeforeInterruption` is the
notice EC2 gives before it reclaims them (FIS allows 2 to 15 minutes).
"""

from __future__ import annotations

import math
from typing import Any

from spotrun.providers.base import TAG_MANAGED

FIS_ACTION = "aws:ec2:send-spot-instance-interruptions"
FIS_ROLE_NAME = "spotrun-fis"          # the default role FIS assumes (docs/aws.md)
NOTICE_MIN_S, NOTICE_MAX_S = 120.0, 900.0


def instance_arn(region: str, account: str, instance_id: str) -> str:
    """The EC2 instance ARN FIS targets."""
    return f"arn:aws:ec2:{region}:{account}:instance/{instance_id}"


def default_role_arn(account: str) -> str:
    """arn:aws:iam::<account>:role/spotrun-fis."""
    return f"arn:aws:iam::{account}:role/{FIS_ROLE_NAME}"


def fis_notice_s(notice_s: float) -> int:
    """The notice FIS gives for an ask of notice_s: clamped to its 2-15 minutes, whole seconds."""
    return int(math.ceil(min(max(notice_s, NOTICE_MIN_S), NOTICE_MAX_S)))


def iso_duration(notice_s: float) -> str:
    """notice_s clamped to FIS's 2-15 minutes, as an ISO 8601 duration (PT2M, PT150S)."""
    s = fis_notice_s(notice_s)
    return f"PT{s // 60}M" if s % 60 == 0 else f"PT{s}S"


def template_params(*, arns: list[str], notice_s: float, role_arn: str, token: str,
                    description: str) -> dict[str, Any]:
    """create_experiment_template kwargs: every instance, one interruption action, no stop."""
    return {
        "clientToken": token,
        "description": description[:512],
        "roleArn": role_arn,
        "stopConditions": [{"source": "none"}],
        "targets": {"SpotInstances": {"resourceType": "aws:ec2:spot-instance",
                                      "resourceArns": list(arns), "selectionMode": "ALL"}},
        "actions": {"interrupt": {"actionId": FIS_ACTION,
                                  "parameters": {"durationBeforeInterruption":
                                                 iso_duration(notice_s)},
                                  "targets": {"SpotInstances": "SpotInstances"}}},
        "tags": {TAG_MANAGED: "true"},
    }
