"""The `aws` provider: EC2 spot and on-demand through boto3.

Instances are found by tag (`spotrun:managed`, `spotrun:job`, `spotrun:attempt`), so
the daemon can crash at any point and reconcile from EC2 alone. A launch is
idempotent twice over: an instance already tagged with the attempt's client token is
returned without a call, and every call carries a ClientToken.
"""

from __future__ import annotations

import logging
import re
from datetime import datetime, timezone
from typing import Any, Callable

from spotrun.aws_clients import (CAPACITY_CODES, RetryPolicy, error_code, make_client,
                                 use_retries)
from spotrun.catalog import Catalog, load_catalog
from spotrun.errors import CapacityError, ConfigError, ProviderError
from spotrun.providers.aws import AWS_FEATURES
from spotrun.providers.aws.group import GroupActs
from spotrun.providers.aws.launch import (TAG_TOKEN, LaunchConfig, build_calls, build_group_calls,
                                         ec2_error)
from spotrun.providers.aws.prices import SpotPrices
from spotrun.providers.aws.risk import AdvisorFeed, AwsRisk
from spotrun.providers.capacity import CapacityFailure, pools_cooling, record_capacity
from spotrun.providers.base import (TAG_JOB, TAG_MANAGED, InstanceInfo, LaunchPlan,
                                    LaunchRequest, PricePoint)
from spotrun.providers.pricing import Pricing
from spotrun.states import InstanceState, Market, TerminationCause

log = logging.getLogger(__name__)

_STATES = {"pending": InstanceState.PENDING, "running": InstanceState.RUNNING,
           "shutting-down": InstanceState.SHUTTING_DOWN,
           "terminated": InstanceState.TERMINATED,
           # Shutdown behaviour is terminate; a stopped instance is on its way out.
           "stopping": InstanceState.SHUTTING_DOWN, "stopped": InstanceState.SHUTTING_DOWN}
_CAUSES = {"Server.SpotInstanceTermination": TerminationCause.SPOT_RECLAIM,
           "Client.InstanceInitiatedShutdown": TerminationCause.INSTANCE_SHUTDOWN,
           "Client.UserInitiatedShutdown": TerminationCause.USER}
_RECLAIM_REQUEST_CODES = ("instance-terminated-by-price", "instance-terminated-no-capacity",
                          "instance-terminated-capacity-oversubscribed",
                          "instance-terminated-launch-group-constraint",
                          "instance-terminated-by-experiment")
_REASON_TIME = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) (?:GMT|UTC)\)")
_NOT_FOUND = ("InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed")
DESCRIBE_PAGE_SIZE = 500     # reservations per DescribeInstances page (EC2 allows 5 to 1000)


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class AwsProvider(Pricing, GroupActs):
    """EC2 behind the Provider interface (group launch and interrupt: aws_group.GroupActs;
    on-demand prices and price history: pricing.Pricing)."""

    name = "aws"
    features = AWS_FEATURES
    snapshot_source = "live"

    def __init__(self, *, ec2: Any, launch: LaunchConfig, region: str = "us-east-1",
                 catalog: Catalog | None = None, retry: RetryPolicy | None = None,
                 clock: Callable[[], datetime] = _utcnow,
                 capacity_cooldown_s: float = 600.0, advisor: AdvisorFeed | None = None,
                 placement_scores: bool = True, fis: Callable[[], Any] | None = None,
                 fis_role_arn: str = "") -> None:
        self.retry = retry or RetryPolicy()
        self.ec2 = use_retries(ec2, self.retry)
        self._make_fis = fis        # () -> a boto3 "fis" client, called on first interrupt
        self._fis: Any = None
        self.fis_role_arn = fis_role_arn
        self.cfg = launch
        self.region = region
        self.catalog = catalog or load_catalog("aws")
        self.clock = clock
        self.capacity_cooldown_s = capacity_cooldown_s
        self.prices = SpotPrices(ec2, clock)
        self.capacity_failures: list[CapacityFailure] = []
        self._zones: list[str] | None = sorted(launch.subnets) or None
        self._first_seen_ended: dict[str, datetime] = {}
        self.risk = AwsRisk(call=self._call, pages=self._pages, region=region, advisor=advisor,
                            placement=placement_scores, clock=lambda: self.clock().timestamp())

    @classmethod
    def from_settings(cls, settings: Any, *, ec2: Any = None,
                      clock: Callable[[], datetime] | None = None, **_: Any) -> "AwsProvider":
        """Build from Settings (region, aws.*); ec2 and clock may be injected."""
        aws = settings.aws
        client = ec2 or make_client("ec2", region=settings.region, endpoint_url=aws.endpoint_url)
        clock = clock or _utcnow
        advisor = AdvisorFeed(aws.spot_advisor_url, cache_dir=settings.home_path / "cache",
                              max_age_s=aws.spot_advisor_max_age_s,
                              clock=lambda: clock().timestamp()) if aws.spot_advisor_url else None
        return cls(ec2=client, launch=LaunchConfig.from_settings(aws), region=settings.region,
                   retry=RetryPolicy.from_settings(aws), clock=clock,
                   capacity_cooldown_s=aws.capacity_cooldown_s, advisor=advisor,
                   placement_scores=aws.placement_scores,
                   fis=lambda: make_client("fis", region=settings.region,
                                           endpoint_url=aws.endpoint_url),
                   fis_role_arn=aws.fis_role_arn)

    def _call(self, method: str, **kw: Any) -> Any:
        return getattr(self.ec2, method)(**kw)   # botocore retries with self.retry

    def _pages(self, method: str, **kw: Any) -> Any:
        """Every response page of one EC2 call (its boto3 paginator; retried as _call is)."""
        return self.ec2.get_paginator(method).paginate(**kw)

    # ------------------------------------------------------------ basics

    def now(self) -> datetime:
        """UTC now (EC2 bills by the wall clock)."""
        return self.clock()

    def zones(self) -> list[str]:
        """Configured subnet zones, else the region's available zones."""
        if self._zones is None:
            resp = self._call("describe_availability_zones",
                              Filters=[{"Name": "state", "Values": ["available"]}])
            self._zones = sorted(z["ZoneName"] for z in resp.get("AvailabilityZones", []))
        return list(self._zones)

    def spot_price(self, instance_type: str, zone: str) -> float | None:
        """The spot price in effect now (cached a few minutes)."""
        return self.prices.current(instance_type, zone)

    def risk_hints(self, instance_types: list[str], zones: list[str]) -> dict[tuple[str, str], Any]:
        """RiskHints per (type, zone): advisor bucket, placement score; {} on any error (logged)."""
        try:
            return self.risk.hints(instance_types, zones)
        except Exception as exc:  # noqa: BLE001 - risk evidence is optional, a plan is not
            log.warning("risk hints unavailable: %s", exc)
            return {}

    def offline_tick_s(self) -> float | None:
        """None: EC2 prices move when they move; the policy's own interval applies."""
        return None

    def _price_points(self, instance_type: str, zones: list[str], start: datetime,
                      end: datetime) -> list[PricePoint]:
        """Change points from describe_spot_price_history (every page)."""
        return self.prices.history(instance_type, zones, start, end)

    # ------------------------------------------------------------ launch

    def plan_launch(self, request: LaunchRequest) -> LaunchPlan:
        """Pure: the EC2 calls a launch (or, for count > 1, a group launch) makes."""
        if request.count > 1:
            return LaunchPlan(provider=self.name, request=request, calls=build_group_calls(
                self.cfg, request, self._efa_types(request), elide_user_data=True))
        return LaunchPlan(provider=self.name, request=request,
                          calls=build_calls(self.cfg, request, elide_user_data=True))

    def _efa_types(self, request: LaunchRequest) -> frozenset[str]:
        return frozenset(p.instance_type for p in request.candidates
                         if p.instance_type in self.catalog
                         and self.catalog.get(p.instance_type).efa)

    def pools_cooling(self) -> set[str]:
        """Pool keys that refused capacity within the cooldown (for the scheduler)."""
        return pools_cooling(self.capacity_failures, self.now(), self.capacity_cooldown_s)

    def _record_capacity(self, pool: str, code: str) -> None:
        record_capacity(self.capacity_failures, pool, code, self.now())

    def launch(self, plan: LaunchPlan) -> InstanceInfo:
        """Try the calls in order; the first instance started wins."""
        request = plan.single()
        existing = self._by_token(request)
        if existing is not None:
            return existing
        failed: list[tuple[str, str]] = []
        for c in build_calls(self.cfg, request):
            method = c["api"].split(".", 1)[1]
            if method == "create_launch_template":
                self._ensure_template(c["params"])
                continue
            resp = self._launch_call(method, c, failed)
            if resp is None:
                continue
            ids = self._ids_from(method, resp, c["pools"], failed)
            if ids:
                self._cleanup_template(plan)
                return self._wait_visible(ids[0])
        self._cleanup_template(plan)
        if failed and not any(code in CAPACITY_CODES for _, code in failed):
            raise ProviderError(f"launch failed: {failed}"[:400], field="aws",
                                value=failed[-1][1])
        pool, code = failed[-1] if failed else ("", "InsufficientInstanceCapacity")
        itype, zone, market = (pool.split("/") + ["", "", ""])[:3]
        err = CapacityError(f"no capacity in any candidate: "
                            f"{', '.join(f'{p} ({c})' for p, c in failed)}"[:400],
                            instance_type=itype, zone=zone, market=market, code=code)
        err.failures = failed  # type: ignore[attr-defined]
        raise err

    def _ids_from(self, method: str, resp: dict[str, Any], pools: list[str],
                  failed: list[tuple[str, str]]) -> list[str]:
        if method == "run_instances":
            return [i["InstanceId"] for i in resp.get("Instances", [])]
        for e in resp.get("Errors", []) or []:
            ov = (e.get("LaunchTemplateAndOverrides") or {}).get("Overrides") or {}
            code = e.get("ErrorCode", "")
            match = [p for p in pools if p.startswith(f"{ov.get('InstanceType')}/"
                                                      f"{ov.get('AvailabilityZone', '')}")]
            pool = match[0] if match else f"{ov.get('InstanceType')}/?"
            if code in CAPACITY_CODES:
                self._record_capacity(pool, code)
            failed.append((pool, code))
        return [i for group in resp.get("Instances", []) or [] for i in group["InstanceIds"]]

    def _ensure_template(self, params: dict[str, Any]) -> None:
        try:
            self._call("create_launch_template", **params)
        except Exception as exc:
            if "AlreadyExists" not in error_code(exc):
                raise ec2_error(exc, "create_launch_template") from None

    def _cleanup_template(self, plan: LaunchPlan) -> None:
        if self.cfg.launch_api != "fleet":
            return
        name = plan.calls[0]["params"]["LaunchTemplateName"]
        try:
            self._call("delete_launch_template", LaunchTemplateName=name)
        except Exception as exc:  # noqa: BLE001 - a leftover template costs nothing
            log.info("could not delete launch template %s: %s", name, error_code(exc))

    def _by_token(self, request: LaunchRequest) -> InstanceInfo | None:
        """An instance this attempt already started (crash between launch and DB write)."""
        found = self._describe_filters([
            {"Name": f"tag:{TAG_JOB}", "Values": [request.job_id]},
            {"Name": f"tag:{TAG_TOKEN}", "Values": [request.client_token]}])
        alive = [i for i in found if i.state is not InstanceState.TERMINATED]
        return (alive or found or [None])[0]

    def _wait_visible(self, instance_id: str) -> InstanceInfo:
        # EC2 is eventually consistent: a just-launched id may not describe yet. botocore's
        # own waiter polls for it (once a second, a bounded number of times).
        found = self.describe(instance_ids=[instance_id])
        if not found:
            try:
                self.ec2.get_waiter("instance_exists").wait(
                    InstanceIds=[instance_id], WaiterConfig={"Delay": 1, "MaxAttempts": 10})
            except Exception as exc:  # noqa: BLE001 - WaiterError or a client error
                raise ProviderError("launched instance not visible", field="instance_id",
                                    value=instance_id,
                                    hint="reconcile will find it by tag") from exc
            found = self.describe(instance_ids=[instance_id])
        if not found:
            raise ProviderError("launched instance not visible", field="instance_id",
                                value=instance_id, hint="reconcile will find it by tag")
        return found[0]

    # ------------------------------------------------------------ describe / terminate

    def describe(self, *, job_id: str | None = None,
                 instance_ids: list[str] | None = None) -> list[InstanceInfo]:
        """Managed instances (of one job, or these ids), terminated ones included."""
        filters = [{"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]}]
        if job_id is not None:
            filters.append({"Name": f"tag:{TAG_JOB}", "Values": [job_id]})
        if instance_ids is not None:
            if not instance_ids:
                return []
            filters.append({"Name": "instance-id", "Values": list(instance_ids)})
        return self._describe_filters(filters)

    def _describe_filters(self, filters: list[dict[str, Any]]) -> list[InstanceInfo]:
        try:
            pages = self._pages("describe_instances", Filters=filters,
                                PaginationConfig={"PageSize": DESCRIBE_PAGE_SIZE})
            raw = [i for page in pages for r in page.get("Reservations", [])
                   for i in r.get("Instances", [])]
        except Exception as exc:
            raise ec2_error(exc, "describe_instances") from None
        reclaimed = self._reclaimed_by_request(raw)
        return sorted((self._info(i, reclaimed) for i in raw), key=lambda x: x.launched_at)

    def _reclaimed_by_request(self, raw: list[dict[str, Any]]) -> set[str]:
        """Instance ids whose spot request status says EC2 took them back."""
        ids = [i["SpotInstanceRequestId"] for i in raw if i.get("SpotInstanceRequestId")
               and i["State"]["Name"] in ("shutting-down", "terminated")
               and (i.get("StateReason") or {}).get("Code") not in _CAUSES]
        if not ids:
            return set()
        try:
            resp = self._call("describe_spot_instance_requests", SpotInstanceRequestIds=ids)
        except Exception as exc:  # noqa: BLE001 - the state reason alone still works
            log.info("spot request lookup failed: %s", error_code(exc))
            return set()
        return {r["InstanceId"] for r in resp.get("SpotInstanceRequests", [])
                if r.get("InstanceId")
                and (r.get("Status") or {}).get("Code", "").startswith(_RECLAIM_REQUEST_CODES)}

    def _info(self, i: dict[str, Any], reclaimed: set[str]) -> InstanceInfo:
        tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
        state = _STATES.get(i["State"]["Name"], InstanceState.PENDING)
        market = Market.SPOT if i.get("InstanceLifecycle") == "spot" else Market.ON_DEMAND
        zone = (i.get("Placement") or {}).get("AvailabilityZone", "")
        cause = ended = None
        if state in (InstanceState.SHUTTING_DOWN, InstanceState.TERMINATED):
            code = (i.get("StateReason") or {}).get("Code", "")
            cause = _CAUSES.get(code, TerminationCause.UNKNOWN)
            if i["InstanceId"] in reclaimed:
                cause = TerminationCause.SPOT_RECLAIM
            if state is InstanceState.TERMINATED:
                ended = self._ended_at(i)
        price = None
        try:
            price = (self.spot_price(i["InstanceType"], zone) if market is Market.SPOT
                     else self.on_demand_price(i["InstanceType"]))
        except (ConfigError, ProviderError):
            price = None
        return InstanceInfo(instance_id=i["InstanceId"], instance_type=i["InstanceType"],
                            zone=zone, market=market, state=state,
                            launched_at=_as_utc(i["LaunchTime"]), ended_at=ended, cause=cause,
                            tags=tags, price_usd_per_hour=price,
                            client_token=tags.get(TAG_TOKEN) or i.get("ClientToken") or None,
                            private_ip=i.get("PrivateIpAddress") or None)

    def _ended_at(self, i: dict[str, Any]) -> datetime:
        """Termination time from the transition reason, else when we first saw it ended."""
        m = _REASON_TIME.search(i.get("StateTransitionReason") or "")
        if m:
            return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
        return self._first_seen_ended.setdefault(i["InstanceId"], self.now())

    def terminate(self, instance_id: str) -> None:
        """Terminate; an unknown or already terminated instance is fine."""
        try:
            self._call("terminate_instances", InstanceIds=[instance_id])
        except Exception as exc:
            if error_code(exc) in _NOT_FOUND:
                return
            raise ec2_error(exc, "terminate_instances") from None


def _as_utc(ts: datetime) -> datetime:
    return ts.replace(tzinfo=timezone.utc) if ts.tzinfo is None else ts.astimezone(timezone.utc)
