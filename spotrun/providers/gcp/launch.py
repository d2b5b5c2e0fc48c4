"""Pure builders of the Compute Engine calls one launch makes (printed by `--dry-run`).

One `instances.insert` per candidate pool, in order, until one gives a VM. Each call is the
REST body (camelCase JSON, as the API reference writes it): a Spot VM is
`scheduling.provisioningModel = SPOT` with `instanceTerminationAction = DELETE` (a preempted
VM is deleted, so its disk stops billing with it). Names and request ids derive from the
attempt's client token, so a launch retried after a crash asks for the same VM: the same
`requestId` returns the first operation (GCP keeps them about an hour) and the same name
cannot be created twice (alreadyExists). A group (multi-node) is `count` inserts in one pool,
with a compact placement policy where the machine series supports one.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass, replace
from typing import Any

from spotrun.catalog import Catalog
from spotrun.errors import ConfigError
from spotrun.providers.base import (TAG_ATTEMPT, TAG_JOB, TAG_MANAGED, TAG_NODE, LaunchRequest,
                                    Pool)
from spotrun.providers.gcp.startup import (AGENT_CONFIG_KEY, TOKEN_KEY, agent_config,
                                          render_startup_script)
from spotrun.states import Market

TOKEN_LABEL = "spotrun_token"     # a hash of the client token (labels hold 63 characters)
USER_DATA_PLACEHOLDER = "<user data>"
SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
# Machine series with compact placement policies ("Supported machine types: A4X Max, A4X, A4,
# A3 Ultra, A3 Mega, A3 High, A3 Edge, A2, G4, G2": Google Cloud AI Hypercomputer docs,
# "Compact placement policy and workload policy overview"); N1 has none.
COMPACT_SERIES = ("a2", "a3", "a4", "g2", "g4")
_REQUEST_NS = uuid.UUID("6b1f9a52-5d6e-4b8e-9a57-1c1d2a6f0e31")
_LABEL_BAD = re.compile(r"[^a-z0-9_-]")
_NAME_RE = re.compile(r"^sr-(?P<zone>[a-z]+(?:-[a-z]+)*\d+-[a-z])-(?P<hash>[0-9a-f]{12})$")


@dataclass(frozen=True)
class LaunchConfig:
    """The GcpSettings fields a launch needs."""

    project: str
    region: str
    image: str
    network: str
    subnetwork: str
    service_account: str
    boot_disk_gb: int
    boot_disk_type: str
    spotrun_install: str
    external_ip: bool

    @classmethod
    def from_settings(cls, gcp: Any) -> "LaunchConfig":
        """Validate and convert GcpSettings."""
        if gcp.boot_disk_gb < 10:
            raise ConfigError("must be >= 10", field="gcp.boot_disk_gb", value=gcp.boot_disk_gb)
        if gcp.boot_disk_type not in ("pd-balanced", "pd-ssd", "pd-standard", "hyperdisk-balanced"):
            raise ConfigError("allowed: pd-balanced, pd-ssd, pd-standard, hyperdisk-balanced",
                              field="gcp.boot_disk_type", value=gcp.boot_disk_type)
        return cls(project=gcp.project, region=gcp.region, image=gcp.image, network=gcp.network,
                   subnetwork=gcp.subnetwork, service_account=gcp.service_account,
                   boot_disk_gb=gcp.boot_disk_gb, boot_disk_type=gcp.boot_disk_type,
                   spotrun_install=gcp.spotrun_install, external_ip=gcp.external_ip)


# ------------------------------------------------------------------ names, ids, labels

def instance_name(token: str, zone: str, suffix: str) -> str:
    """The VM's name: its zone (so an id alone says where to look) and a hash of the token."""
    digest = hashlib.sha256(f"{token}/{suffix}".encode()).hexdigest()[:12]
    return f"sr-{zone}-{digest}"


def zone_of(instance_id: str) -> str | None:
    """The zone a spotrun VM name carries, or None if it is not one of spotrun's names."""
    m = _NAME_RE.match(instance_id)
    return m.group("zone") if m else None


def request_id(token: str, suffix: str) -> str:
    """GCE's requestId (a UUID, the zero UUID excepted) for one call of one attempt."""
    return str(uuid.uuid5(_REQUEST_NS, f"{token}/{suffix}"))


def token_label(token: str) -> str:
    """The label value a client token is found by."""
    return hashlib.sha256(token.encode()).hexdigest()[:40]


def label_key(tag: str) -> str:
    """A tag key as a label key: lowercase, `[a-z0-9_-]`, starting with a letter
    (spotrun:job -> spotrun_job)."""
    key = _LABEL_BAD.sub("_", tag.lower().replace(":", "_"))[:63]
    return key if key[:1].isalpha() else f"t_{key}"[:63]


def label_value(value: str) -> str:
    """A tag value as a label value (63 characters of `[a-z0-9_-]`)."""
    return _LABEL_BAD.sub("_", str(value).lower())[:63]


def tag_of(key: str) -> str:
    """A label key back as spotrun's tag key (spotrun_job -> spotrun:job)."""
    return "spotrun:" + key[len("spotrun_"):] if key.startswith("spotrun_") else key


def instance_labels(request: LaunchRequest, rank: int | None = None) -> dict[str, str]:
    """The labels on a VM and its disk: the request's tags (a replacement node's rank among
    them), job, attempt, managed, the token's hash, and `rank` when given."""
    tags = dict(request.tags)
    tags.update({TAG_JOB: request.job_id, TAG_ATTEMPT: str(request.attempt_number),
                 TAG_MANAGED: "true"})
    if rank is not None:
        tags[TAG_NODE] = str(rank)
    labels = {label_key(k): label_value(v) for k, v in tags.items()}
    labels[TOKEN_LABEL] = token_label(request.client_token)
    return labels


# ------------------------------------------------------------------ the insert bodies

def _scheduling(market: Market) -> dict[str, Any]:
    # GPU VMs cannot live-migrate: host maintenance stops them (onHostMaintenance TERMINATE).
    if market is Market.SPOT:
        return {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE",
                "onHostMaintenance": "TERMINATE", "automaticRestart": False}
    return {"provisioningModel": "STANDARD", "onHostMaintenance": "TERMINATE",
            "automaticRestart": False}


def _row(catalog: Catalog, instance_type: str) -> dict[str, Any]:
    t = catalog.get(instance_type)
    return {"machine_type": str(t.extra.get("machine_type") or instance_type),
            "accelerator": t.extra.get("accelerator"), "count": int(t.extra.get("count") or t.gpus),
            "attach": bool(t.extra.get("attach_accelerator", False))}


def need_project(project: str) -> None:
    """ConfigError naming gcp.project when it is not set (prices need none; every call does)."""
    if not project:
        raise ConfigError("the GCP project to launch in is not set", field="gcp.project",
                          hint="set it in spotrun.toml's gcp section (docs/gcp.md)")


def insert_body(cfg: LaunchConfig, catalog: Catalog, request: LaunchRequest, pool: Pool,
                name: str, *, rank: int | None, elide_user_data: bool,
                policy: str | None = None) -> dict[str, Any]:
    """The Instance resource of one insert (REST JSON)."""
    need_project(cfg.project)
    if not cfg.image:
        raise ConfigError("a boot image is needed to launch", field="gcp.image",
                          hint="an image with NVIDIA drivers, e.g. a Deep Learning VM image")
    zone, row = pool.zone, _row(catalog, pool.instance_type)
    labels = instance_labels(request, rank)
    if elide_user_data:
        config, script = USER_DATA_PLACEHOLDER, USER_DATA_PLACEHOLDER
    else:
        config = agent_config(request.user_data)
        script = render_startup_script(spotrun_install=cfg.spotrun_install)
    nic: dict[str, Any] = {}
    if cfg.network:
        nic["network"] = cfg.network
    if cfg.subnetwork:
        nic["subnetwork"] = cfg.subnetwork
    if cfg.external_ip:
        nic["accessConfigs"] = [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]
    body: dict[str, Any] = {
        "name": name,
        "machineType": f"zones/{zone}/machineTypes/{row['machine_type']}",
        "labels": labels,
        "metadata": {"items": [{"key": "startup-script", "value": script},
                               {"key": AGENT_CONFIG_KEY, "value": config},
                               {"key": TOKEN_KEY, "value": request.client_token}]},
        "disks": [{"boot": True, "autoDelete": True, "initializeParams": {
            "sourceImage": cfg.image, "diskSizeGb": str(cfg.boot_disk_gb),
            "diskType": f"zones/{zone}/diskTypes/{cfg.boot_disk_type}", "labels": labels}}],
        "networkInterfaces": [nic],
        "serviceAccounts": [{"email": cfg.service_account or "default", "scopes": list(SCOPES)}],
        "scheduling": _scheduling(pool.market),
    }
    if row["attach"] and row["accelerator"]:
        body["guestAccelerators"] = [{
            "acceleratorType": f"zones/{zone}/acceleratorTypes/{row['accelerator']}",
            "acceleratorCount": row["count"]}]
    if policy:
        body["resourcePolicies"] = [policy]
    return body


def _insert_call(cfg: LaunchConfig, catalog: Catalog, request: LaunchRequest, pool: Pool,
                 suffix: str, *, rank: int | None, elide_user_data: bool,
                 policy: str | None = None) -> dict[str, Any]:
    name = instance_name(request.client_token, pool.zone, suffix)
    body = insert_body(cfg, catalog, request, pool, name, rank=rank, policy=policy,
                       elide_user_data=elide_user_data)
    return {"api": "compute.instances.insert", "pools": [pool.key()], "name": name,
            "params": {"project": cfg.project, "zone": pool.zone,
                       "requestId": request_id(request.client_token, suffix),
                       "instanceResource": body}}


def build_calls(cfg: LaunchConfig, catalog: Catalog, request: LaunchRequest, *,
                elide_user_data: bool = False) -> tuple[dict[str, Any], ...]:
    """One insert per candidate pool, in order: {"api", "params", "pools", "name"}."""
    if not request.candidates:
        raise ConfigError("no candidate pools to launch into", field="candidates")
    return tuple(_insert_call(cfg, catalog, request, pool, f"c{i}", rank=None,
                              elide_user_data=elide_user_data)
                 for i, pool in enumerate(request.candidates))


# ------------------------------------------------------------------ multi-node groups

def compact_placement(catalog: Catalog, instance_type: str) -> bool:
    """True when the type's machine series takes a compact placement policy."""
    series = _row(catalog, instance_type)["machine_type"].split("-", 1)[0]
    return series in COMPACT_SERIES


def policy_name(request: LaunchRequest, region: str) -> str:
    """The job's compact placement policy in a region (one per job: its nodes sit together)."""
    digest = hashlib.sha256(f"{request.job_id}/{region}".encode()).hexdigest()[:12]
    return f"spotrun-{label_value(request.job_id)[:36].rstrip('-_')}-{digest}".replace("_", "-")


def policy_link(cfg: LaunchConfig, name: str) -> str:
    """A resource policy's URL as an instance refers to it."""
    return f"projects/{cfg.project}/regions/{cfg.region}/resourcePolicies/{name}"


def build_group_calls(cfg: LaunchConfig, catalog: Catalog, request: LaunchRequest, *,
                      elide_user_data: bool = False) -> tuple[dict[str, Any], ...]:
    """Per candidate pool, in order: a compact placement policy where the series has one, then
    `count` inserts (one per rank, each labelled with it); "group" numbers the pool."""
    if request.count < 1:
        raise ConfigError("must be >= 1", field="count", value=request.count)
    if not request.candidates:
        raise ConfigError("no candidate pools to launch into", field="candidates")
    request = replace(request, tags={k: v for k, v in request.tags.items() if k != TAG_NODE})
    calls: list[dict[str, Any]] = []
    made: set[str] = set()
    for g, pool in enumerate(request.candidates):
        policy = None
        if request.count > 1 and compact_placement(catalog, pool.instance_type):
            pname = policy_name(request, cfg.region)
            policy = policy_link(cfg, pname)
            if pname not in made:
                made.add(pname)
                calls.append({"api": "compute.resourcePolicies.insert", "pools": [], "group": g,
                              "params": {"project": cfg.project, "region": cfg.region,
                                         "requestId": request_id(request.client_token, pname),
                                         "resourcePolicyResource": {
                                             "name": pname, "description": "spotrun: nodes of "
                                                                           f"{request.job_id}",
                                             "groupPlacementPolicy": {
                                                 "collocation": "COLLOCATED"}}}})
        for k in range(request.count):
            rank = request.rank_of(k)
            call = _insert_call(cfg, catalog, request, pool, f"g{g}r{rank}", rank=rank,
                                elide_user_data=elide_user_data, policy=policy)
            call["group"] = g
            call["rank"] = rank
            calls.append(call)
    return tuple(calls)
