"""Pure builders of the EC2 calls one launch makes (printed by `--dry-run`, run by launch).

Two shapes, chosen by `aws.launch_api`:
- `fleet`: one launch template, then one `create_fleet` (Type instant) per run of
  same-market candidates: spot with allocation `price-capacity-optimized`, on-demand
  `prioritized` in candidate order;
- `run_instances`: one call per candidate, spot through InstanceMarketOptions.
Every call carries a ClientToken derived from the attempt's token, so a launch
retried after a crash is answered with the instance already started.
A group (multi-node) launch is one instant fleet for all its instances per candidate pool,
in a cluster placement group where the type has EFA (build_group_calls).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from typing import Any

from spotrun.aws_clients import error_code
from spotrun.errors import ConfigError, ProviderError
from spotrun.providers.aws.userdata import encode_user_data, render_user_data
from spotrun.providers.base import (TAG_ATTEMPT, TAG_JOB, TAG_MANAGED, TAG_NODE, LaunchRequest,
                                    Pool)
from spotrun.states import Market

TAG_TOKEN = "spotrun:client-token"
USER_DATA_PLACEHOLDER = "<user data>"
_TOKEN_MAX = 64
_LT_NAME_RE = re.compile(r"[^a-zA-Z0-9().\-/_]")


@dataclass(frozen=True)
class LaunchConfig:
    """The AwsSettings fields a launch needs, with subnets parsed per zone."""

    ami_id: str
    subnets: dict[str, str]
    security_group_ids: tuple[str, ...]
    key_name: str
    instance_profile_arn: str
    spotrun_install: str
    volume_size_gb: int
    launch_api: str

    @classmethod
    def from_settings(cls, aws: Any) -> "LaunchConfig":
        """Validate and convert AwsSettings."""
        subnets: dict[str, str] = {}
        for entry in aws.subnets:
            zone, sep, subnet = entry.partition("=")
            if not sep or not zone or not subnet.startswith("subnet-"):
                raise ConfigError("each entry must be 'zone=subnet-id'", field="aws.subnets",
                                  value=entry)
            subnets[zone.strip()] = subnet.strip()
        if aws.launch_api not in ("fleet", "run_instances"):
            raise ConfigError("allowed: fleet, run_instances", field="aws.launch_api",
                              value=aws.launch_api)
        if aws.volume_size_gb < 8:
            raise ConfigError("must be >= 8", field="aws.volume_size_gb",
                              value=aws.volume_size_gb)
        return cls(ami_id=aws.ami_id, subnets=subnets,
                   security_group_ids=tuple(aws.security_group_ids), key_name=aws.key_name,
                   instance_profile_arn=aws.instance_profile_arn,
                   spotrun_install=aws.spotrun_install, volume_size_gb=aws.volume_size_gb,
                   launch_api=aws.launch_api)


def sub_token(token: str, suffix: str) -> str:
    """token + suffix, hashed down to EC2's 64-character limit when longer."""
    full = f"{token}-{suffix}" if suffix else token
    if len(full) <= _TOKEN_MAX:
        return full
    return hashlib.sha256(full.encode()).hexdigest()[:_TOKEN_MAX]


def instance_tags(request: LaunchRequest) -> dict[str, str]:
    """Tags on everything a launch creates: instance, volumes, template, fleet, spot request."""
    tags = dict(request.tags)
    tags.update({TAG_JOB: request.job_id, TAG_ATTEMPT: str(request.attempt_number),
                 TAG_MANAGED: "true", TAG_TOKEN: request.client_token})
    return tags


def _tag_specs(request: LaunchRequest, kinds: tuple[str, ...]) -> list[dict[str, Any]]:
    tags = [{"Key": k, "Value": v} for k, v in sorted(instance_tags(request).items())]
    return [{"ResourceType": kind, "Tags": tags} for kind in kinds]


def _instance_data(cfg: LaunchConfig, request: LaunchRequest,
                   user_data_b64: str) -> dict[str, Any]:
    if not cfg.ami_id:
        raise ConfigError("an AMI is needed to launch", field="aws.ami_id",
                          hint="a Deep Learning AMI with NVIDIA drivers")
    data: dict[str, Any] = {
        "ImageId": cfg.ami_id,
        "UserData": user_data_b64,
        # The agent's dead-man switch powers off; that must end the bill, not stop it.
        "InstanceInitiatedShutdownBehavior": "terminate",
        "BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {
            "VolumeSize": cfg.volume_size_gb, "VolumeType": "gp3",
            "DeleteOnTermination": True}}],
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
        "TagSpecifications": _tag_specs(request, ("instance", "volume")),
    }
    if cfg.security_group_ids:
        data["SecurityGroupIds"] = list(cfg.security_group_ids)
    if cfg.key_name:
        data["KeyName"] = cfg.key_name
    if cfg.instance_profile_arn:
        data["IamInstanceProfile"] = {"Arn": cfg.instance_profile_arn}
    return data


def template_name(request: LaunchRequest) -> str:
    """A launch-template name unique to the attempt's token."""
    return "spotrun-" + _LT_NAME_RE.sub("-", sub_token(request.client_token, "lt"))[:100]


def _groups(candidates: tuple[Pool, ...]) -> list[list[Pool]]:
    groups: list[list[Pool]] = []
    for pool in candidates:
        if groups and groups[-1][0].market is pool.market:
            groups[-1].append(pool)
        else:
            groups.append([pool])
    return groups


def _placement(cfg: LaunchConfig, zone: str) -> dict[str, str]:
    out = {"AvailabilityZone": zone}
    if zone in cfg.subnets:
        out["SubnetId"] = cfg.subnets[zone]
    return out


def build_calls(cfg: LaunchConfig, request: LaunchRequest, *,
                elide_user_data: bool = False) -> tuple[dict[str, Any], ...]:
    """The calls, in order: {"api": "ec2.<method>", "params": {...}, "pools": [keys]}."""
    if not request.candidates:
        raise ConfigError("no candidate pools to launch into", field="candidates")
    user_data = USER_DATA_PLACEHOLDER if elide_user_data else encode_user_data(
        render_user_data(request.user_data, spotrun_install=cfg.spotrun_install))
    if cfg.launch_api == "run_instances":
        return tuple(_run_instances_call(cfg, request, user_data, i, pool)
                     for i, pool in enumerate(request.candidates))
    calls: list[dict[str, Any]] = [{
        "api": "ec2.create_launch_template", "pools": [],
        "params": {"LaunchTemplateName": template_name(request),
                   "ClientToken": sub_token(request.client_token, "lt"),
                   "LaunchTemplateData": _instance_data(cfg, request, user_data),
                   "TagSpecifications": _tag_specs(request, ("launch-template",))},
    }]
    for g, group in enumerate(_groups(request.candidates)):
        calls.append(_fleet_call(cfg, request, g, group))
    return tuple(calls)


def _run_instances_call(cfg: LaunchConfig, request: LaunchRequest, user_data: str, i: int,
                        pool: Pool) -> dict[str, Any]:
    params = _instance_data(cfg, request, user_data)
    params.update({"MinCount": 1, "MaxCount": 1, "InstanceType": pool.instance_type,
                   "ClientToken": sub_token(request.client_token, f"c{i}")})
    placement = _placement(cfg, pool.zone)
    params["Placement"] = {"AvailabilityZone": placement["AvailabilityZone"]}
    if "SubnetId" in placement:
        params["SubnetId"] = placement["SubnetId"]
    if pool.market is Market.SPOT:
        spot: dict[str, Any] = {"SpotInstanceType": "one-time",
                                "InstanceInterruptionBehavior": "terminate"}
        if request.max_price_usd_per_hour:
            spot["MaxPrice"] = f"{request.max_price_usd_per_hour:.4f}"
        params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}
        params["TagSpecifications"] = _tag_specs(
            request, ("instance", "volume", "spot-instances-request"))
    return {"api": "ec2.run_instances", "params": params, "pools": [pool.key()]}


def _fleet_call(cfg: LaunchConfig, request: LaunchRequest, g: int,
                group: list[Pool]) -> dict[str, Any]:
    spot = group[0].market is Market.SPOT
    overrides = []
    for priority, pool in enumerate(group):
        ov: dict[str, Any] = {"InstanceType": pool.instance_type, **_placement(cfg, pool.zone)}
        if spot and request.max_price_usd_per_hour:
            ov["MaxPrice"] = f"{request.max_price_usd_per_hour:.4f}"
        if not spot:
            ov["Priority"] = float(priority)
        overrides.append(ov)
    params: dict[str, Any] = {
        "Type": "instant",
        "ClientToken": sub_token(request.client_token, f"f{g}"),
        "LaunchTemplateConfigs": [{
            "LaunchTemplateSpecification": {"LaunchTemplateName": template_name(request),
                                            "Version": "$Latest"},
            "Overrides": overrides}],
        "TargetCapacitySpecification": {
            "TotalTargetCapacity": 1,
            "DefaultTargetCapacityType": "spot" if spot else "on-demand"},
        # An instant fleet is a resource too; tagging it ties it to the attempt for billing.
        "TagSpecifications": _tag_specs(request, ("instance", "fleet")),
    }
    if spot:
        params["SpotOptions"] = {"AllocationStrategy": "price-capacity-optimized"}
    else:
        params["OnDemandOptions"] = {"AllocationStrategy": "prioritized"}
    return {"api": "ec2.create_fleet", "params": params, "pools": [p.key() for p in group]}


# ------------------------------------------------------------------ multi-node groups

def placement_group_name(request: LaunchRequest, zone: str) -> str:
    """The job's cluster placement group in zone (a cluster group lives in one zone)."""
    return "spotrun-" + _LT_NAME_RE.sub("-", f"{request.job_id}-{zone}")[:200]


def build_group_calls(cfg: LaunchConfig, request: LaunchRequest, efa_types: frozenset[str], *,
                      elide_user_data: bool = False) -> tuple[dict[str, Any], ...]:
    """The calls of a group launch: template, then per candidate pool (in order) a cluster
    placement group where the type has EFA and ONE instant fleet for all `count` instances."""
    if request.count < 1:
        raise ConfigError("must be >= 1", field="count", value=request.count)
    if request.count > 1:   # ranks are tagged per instance after the launch, never all alike
        request = replace(request, tags={k: v for k, v in request.tags.items() if k != TAG_NODE})
    # A group is always one fleet, whatever aws.launch_api says: it needs the template.
    calls = list(build_calls(replace(cfg, launch_api="fleet"),
                             replace(request, candidates=request.candidates[:1]),
                             elide_user_data=elide_user_data)[:1])
    made: set[str] = set()
    for i, pool in enumerate(request.candidates):
        group = placement_group_name(request, pool.zone) if pool.instance_type in efa_types \
            else None
        if group and group not in made:
            made.add(group)
            calls.append({"api": "ec2.create_placement_group", "pools": [], "params": {
                "GroupName": group, "Strategy": "cluster",
                "TagSpecifications": _tag_specs(request, ("placement-group",))}})
        calls.append(_group_fleet_call(cfg, request, i, pool, group))
    return tuple(calls)


def _group_fleet_call(cfg: LaunchConfig, request: LaunchRequest, i: int, pool: Pool,
                      group: str | None) -> dict[str, Any]:
    call = _fleet_call(cfg, request, i, [pool])
    params = call["params"]
    params["ClientToken"] = sub_token(request.client_token, f"g{i}")
    if group:
        params["LaunchTemplateConfigs"][0]["Overrides"][0]["Placement"] = {"GroupName": group}
    params["TargetCapacitySpecification"]["TotalTargetCapacity"] = request.count
    # All or nothing from EC2 itself: below MinTargetCapacity an instant fleet launches none.
    key = "SpotOptions" if pool.market is Market.SPOT else "OnDemandOptions"
    params[key].update({"MinTargetCapacity": request.count, "SingleInstanceType": True,
                        "SingleAvailabilityZone": True})
    # Fleet tags every instance alike: one rank can be tagged at launch, a group's are tagged
    # after (a TAG_NODE in request.tags would give every node the same rank).
    tags = {k: v for k, v in instance_tags(request).items() if k != TAG_NODE}
    if request.count == 1:
        tags[TAG_NODE] = str(request.rank_of(0))
    params["TagSpecifications"] = [
        {"ResourceType": kind, "Tags": [{"Key": k, "Value": v} for k, v in sorted(tags.items())]}
        for kind in ("instance", "fleet")]
    return call


def ec2_error(exc: BaseException, method: str) -> ProviderError:
    """A boto3 failure of one EC2 call as our ProviderError (ProviderErrors pass through)."""
    if isinstance(exc, ProviderError):
        return exc
    code = error_code(exc) or type(exc).__name__
    hint = None
    if code == "IdempotentParameterMismatch":
        hint = "a retried launch must send the same request as the first"
    return ProviderError(f"ec2 {method} failed: {code}: {exc}"[:400], field="aws",
                         value=code, hint=hint)
