"""The `gcp` provider: Compute Engine Spot VMs through google-cloud-compute, and what GCP bills.

Control plane: `provider` (GcpProvider: plan, launch, describe, terminate), `launch` (the
pure insert calls: names, labels, request ids, SPOT scheduling), `ops` (the clients, zone
operations, error codes), `group` (multi-node groups, compact placement, interrupts by
simulated maintenance), `prices` (the catalog's Spot prices), `doctor`.
Instance side: `startup` (the startup script that boots the agent) and `metadata` (the GCE
metadata server: `instance/preempted`, the 30 s soft-off). `billing` holds GCP's rules.
This module is cheap to import (no google SDK): it declares the provider's facts only.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from spotrun.providers.base import ProviderFacts, ProviderFeature
from spotrun.providers.gcp.billing import GCP_RULES
from spotrun.providers.agent_unit import JOB_DIR     # the same path as on EC2

# The zones of each region spotrun's catalog prices (docs/gcp-facts.md; the union of the
# catalog's per-type zones). `gcp.zones` narrows or replaces them.
ZONES = {
    "us-central1": ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"],
    "europe-west4": ["europe-west4-a", "europe-west4-b", "europe-west4-c"],
}
# ACPI G2 soft-off to G3 mechanical-off for a Spot VM: "30 seconds for Spot VMs" (Compute
# Engine API reference, Scheduling.skipGuestOsShutdown; docs/gcp.md "Preemption").
PREEMPTION_WINDOW_S = 30.0
# Beyond the protocol, the pools that refused capacity lately (a decision goes elsewhere); no
# market view: Spot prices are the catalog's, read per pool; they hold for days (no grid), and
# reading them calls no API.
GCP_FEATURES: frozenset[ProviderFeature] = frozenset({ProviderFeature.CAPACITY_COOLDOWN})


def zones_of(settings: Any) -> list[str]:
    """The zones spotrun launches into: `gcp.zones`, else the region's."""
    gcp = settings.gcp
    if gcp.zones:
        return list(gcp.zones)
    return list(ZONES.get(gcp.region, []))


def _agent_extras(settings: Any) -> dict[str, Any]:
    # The agent talks to the GCE metadata server (this folder's metadata.py), not IMDSv2.
    host = settings.gcp.metadata_host
    return {"instance_side": "gcp",
            "imds_endpoint": host if "://" in host else f"http://{host}"}


def _make(settings: Any, **kw: Any) -> Any:
    from spotrun.providers.gcp.provider import GcpProvider  # google-cloud-compute only now
    return GcpProvider.from_settings(settings, **kw)


def _doctor(settings: Any) -> list[Any]:
    from spotrun.providers.gcp.doctor import GcpDoctor  # lazy: facts import no google SDK
    return GcpDoctor(settings).run()


def _instance_metadata(config: Any, environ: Mapping[str, str],
                       monotonic: Callable[[], float]) -> Any:
    from spotrun.providers.gcp.metadata import GceMetadata  # urllib only
    return GceMetadata.for_agent(config, environ, monotonic)


FACTS = ProviderFacts(
    name="gcp", make=_make, known_zones=zones_of, time_scale=lambda st: 1.0,
    billed_volume_gb=lambda st: float(st.gcp.boot_disk_gb),
    agent_extras=_agent_extras, billing_rules=lambda: GCP_RULES, doctor=_doctor,
    rdzv_port=29400,
    # "Compute Engine sends a preemption notice to the VM in the form of an ACPI G2 Soft Off
    # signal" and stops it 30 s later (docs: Spot VMs, "Preemption process"); GCP publishes
    # no rate of missed notices. 0.95: the soft-off reaches a running guest unless it is
    # hung (an estimate; the job's own reclaims correct it, costmodel/notice_loss.py).
    notice_window_s=lambda st: PREEMPTION_WINDOW_S, notice_prior=0.95,
    # The same 30 s are what Compute Engine gives a VM to shut down: the budget stop
    # margin's prior until stops are measured.
    terminate_wall_s=lambda st: PREEMPTION_WINDOW_S,
    # A preemption closes its pool to launches for its 30 s window plus the 600 s in which
    # reclaims cluster in a pool on AWS (aws/__init__.py): no GCP trace was found, so the
    # cluster's length is AWS's, an estimate. Not the 30 s alone: a shorter notice says
    # nothing about a shorter capacity squeeze.
    notice_quarantine_s=PREEMPTION_WINDOW_S + 600.0,
    job_dir=lambda st: JOB_DIR, catalog="gcp", price_region=lambda st: st.gcp.region,
    instance_metadata=_instance_metadata, features=GCP_FEATURES,
    store_scheme="gs", store_uri=lambda st: st.gcp.store_uri)
