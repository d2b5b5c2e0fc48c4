"""The `aws` provider: EC2, FIS and Cost Explorer through boto3, and what it bills.

Control plane: `provider` (AwsProvider: plan, launch, describe, terminate), `launch`
(fleet / run_instances calls), `group` (multi-node fleets), `fis` (interruptions),
`prices`, `risk` (reclaim-risk hints), `doctor`, `cost_explorer` (`audit --reconcile`).
Instance side: `userdata` (what boots the agent); the agent reads EC2's IMDS.
This module is cheap to import (no boto3): it declares the provider's facts only.
"""

from __future__ import annotations

from typing import Any

from spotrun.providers.billing_rules import BillingRules
from spotrun.providers.aws.userdata import JOB_DIR
from spotrun.providers.base import ProviderFacts, ProviderFeature

DEFAULT_ZONES = {
    "us-east-1": ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1e",
                  "us-east-1f"],
    "us-east-2": ["us-east-2a", "us-east-2b", "us-east-2c"],
    "us-west-2": ["us-west-2a", "us-west-2b", "us-west-2c", "us-west-2d"],
}
AWS_RULES = BillingRules(provider="aws")
# Beyond the protocol, the pools that refused capacity lately (a decision goes elsewhere); no
# market view: EC2 prices are read per pool (a decision reads few), its prices move when they
# move (no grid), and reading them starts nothing.
AWS_FEATURES: frozenset[ProviderFeature] = frozenset({ProviderFeature.CAPACITY_COOLDOWN})


def _zones(settings: Any) -> list[str]:
    # Configured subnets ("zone=subnet-id") say where launches can go.
    subnets = [s.split("=", 1)[0].strip() for s in settings.aws.subnets if "=" in s]
    if subnets:
        return sorted(set(subnets))
    return list(DEFAULT_ZONES.get(settings.region, []))


def _make(settings: Any, **kw: Any) -> Any:
    from spotrun.providers.aws.provider import AwsProvider  # boto3 only when asked for
    return AwsProvider.from_settings(settings, **kw)


def _doctor(settings: Any) -> list[Any]:
    from spotrun.providers.aws.doctor import AwsDoctor  # boto3 only when asked for
    return AwsDoctor(settings).run()


def _reconcile(settings: Any, s: Any, jobs: list[Any], now: Any) -> list[Any]:
    from spotrun.aws_clients import RetryPolicy, make_client  # lazy: facts import no boto3
    from spotrun.providers.aws.cost_explorer import reconcile  # lazy: facts import no boto3
    # Cost Explorer has one endpoint, in us-east-1, whatever region the instances ran in.
    ce = make_client("ce", region="us-east-1", endpoint_url=settings.aws.endpoint_url,
                     retry=RetryPolicy.from_settings(settings.aws))
    return reconcile(s, jobs, ce, now=now)


FACTS = ProviderFacts(
    name="aws", make=_make, known_zones=_zones, time_scale=lambda st: 1.0,
    billed_volume_gb=lambda st: float(st.aws.volume_size_gb),
    agent_extras=lambda st: ({"imds_endpoint": st.aws.imds_endpoint}
                             if st.aws.imds_endpoint else {}),
    billing_rules=lambda: AWS_RULES, doctor=_doctor, reconcile=_reconcile,
    rdzv_port=29400,
    # EC2 issues the notice "two minutes before Amazon EC2 stops or terminates your Spot
    # Instance", and "interruption notices are emitted on a best effort basis" (EC2 User Guide,
    # "Spot Instance interruption notices"). AWS publishes no rate of missed notices: 0.9 says
    # "usually", and the job's own reclaims correct it (costmodel/notice_loss.py).
    notice_window_s=lambda st: 120.0, notice_prior=0.9,
    # The same two minutes are what EC2 gives a spot instance to save and be gone: the
    # budget stop margin's prior until stops are measured.
    terminate_wall_s=lambda st: 120.0,
    # A notice closes its pool to launches for 720 s: the 120 s notice up to the reclaim, then
    # 600 s in which a pool's reclaims come in clusters. In the 4-node p3.2xlarge trace (real
    # reclaims of running instances, 5-minute rows) an instance alive in a zone at the row
    # that showed a reclaim there was itself reclaimed by the next row 37% of the time, 22x
    # the 1.6% of any row; by the row after that 9.8% (6x); then about 2x, which the pool's
    # reclaim rate (weighing that reclaim fully) carries. docs/cost-model.md, "Notice quarantine".
    notice_quarantine_s=720.0,
    job_dir=lambda st: JOB_DIR, catalog="aws", features=AWS_FEATURES,
    store_scheme="s3", store_uri=lambda st: st.aws.store_uri)
