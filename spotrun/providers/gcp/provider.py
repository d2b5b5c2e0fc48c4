"""The `gcp` provider: Compute Engine Spot and on-demand VMs through google-cloud-compute (REST).

Instances are found by label (`spotrun_managed`, `spotrun_job`, `spotrun_attempt`,
`spotrun_token`) in one aggregatedList, so the daemon can crash at any point and reconcile
from GCE alone. An instance id is the VM's name, which carries its zone
(`sr-<zone>-<hash>`), so terminate and describe need no lookup.

GCE forgets a deleted VM: a preempted Spot VM (termination action DELETE) and a deleted one
vanish from instances.list. Their end is read from the zone's operations: a
`compute.instances.preempted` system operation is a reclaim, `compute.instances.guestTerminate`
the guest powering off (the agent at the end of an attempt), a `delete` spotrun's (or a
user's) act. A VM the guest stopped stays TERMINATED with its disk billing, so describe
deletes it on sight: spotrun never restarts a VM.
"""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any, Callable

from spotrun.catalog import Catalog, load_catalog
from spotrun.errors import CapacityError, ConfigError, ProviderError
from spotrun.providers.capacity import CapacityFailure, pools_cooling, record_capacity
from spotrun.providers.base import (TAG_JOB, InstanceInfo, LaunchPlan, LaunchRequest,
                                    PricePoint)
from spotrun.providers.gcp import GCP_FEATURES, zones_of
from spotrun.providers.gcp.group import GroupActs
from spotrun.providers.gcp.launch import (TOKEN_LABEL, LaunchConfig, build_calls,
                                         build_group_calls, label_key, label_value,
                                         need_project, tag_of, token_label, zone_of)
from spotrun.providers.gcp.ops import (CAPACITY_CODES, Clients, error_code, gce_error,
                                      http_status, op_error, wait_op)
from spotrun.providers.gcp.prices import CatalogPrices
from spotrun.providers.gcp.startup import TOKEN_KEY, metadata_value
from spotrun.providers.pricing import Pricing
from spotrun.states import InstanceState, Market, TerminationCause


_STATES = {"PROVISIONING": InstanceState.PENDING, "STAGING": InstanceState.PENDING,
           "RUNNING": InstanceState.RUNNING, "REPAIRING": InstanceState.RUNNING,
           "STOPPING": InstanceState.SHUTTING_DOWN, "SUSPENDING": InstanceState.SHUTTING_DOWN,
           "SUSPENDED": InstanceState.SHUTTING_DOWN, "STOPPED": InstanceState.TERMINATED,
           "TERMINATED": InstanceState.TERMINATED}
# How a VM ended, by the operation that ended it (the first of these found wins).
_ENDINGS = (("compute.instances.preempted", TerminationCause.SPOT_RECLAIM),
            ("compute.instances.guestTerminate", TerminationCause.INSTANCE_SHUTDOWN),
            ("delete", TerminationCause.USER))
MANAGED = f'labels.{label_key("spotrun:managed")} = "true"'


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _ts(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(timezone.utc)


class GcpProvider(Pricing, GroupActs):
    """Compute Engine behind the Provider interface (groups and interrupt: group.GroupActs;
    on-demand prices and price history: pricing.Pricing)."""

    name = "gcp"
    features = GCP_FEATURES
    # What plan and dry-run say the prices are: GCP has no live spot price feed, so the
    # daemon decides on the catalog's price list as well (prices.py).
    snapshot_source = "catalog prices (GCP's Spot price list in gcp.yaml; GCP has no live feed)"

    def __init__(self, *, clients: Clients, launch: LaunchConfig, zones: list[str],
                 catalog: Catalog | None = None, clock: Callable[[], datetime] = _utcnow,
                 capacity_cooldown_s: float = 600.0, operation_timeout_s: float = 120.0) -> None:
        self.clients = clients
        self.cfg = launch
        self.project = launch.project
        self.region = launch.region
        self.catalog = catalog or load_catalog("gcp")
        self.prices = CatalogPrices(self.catalog, launch.region)
        self.clock = clock
        self.capacity_cooldown_s = capacity_cooldown_s
        self.operation_timeout_s = operation_timeout_s
        self.capacity_failures: list[CapacityFailure] = []
        self._zones = list(zones)
        self._lock = threading.Lock()
        self._seen: dict[str, InstanceInfo] = {}      # the last view of each live VM
        self._ended: dict[str, InstanceInfo] = {}     # VMs known to be over (final)
        self._deleted: set[str] = set()               # VMs this provider deleted

    @classmethod
    def from_settings(cls, settings: Any, *, clients: Clients | None = None,
                      clock: Callable[[], datetime] | None = None, **_: Any) -> "GcpProvider":
        """Build from Settings (gcp.*); clients and clock may be injected."""
        gcp = settings.gcp
        return cls(clients=clients or Clients(gcp.endpoint_url),
                   launch=LaunchConfig.from_settings(gcp), zones=zones_of(settings),
                   clock=clock or _utcnow, capacity_cooldown_s=gcp.capacity_cooldown_s,
                   operation_timeout_s=gcp.operation_timeout_s)

    # ------------------------------------------------------------ basics

    def now(self) -> datetime:
        """UTC now (Compute Engine bills by the wall clock)."""
        return self.clock()

    def zones(self) -> list[str]:
        """The configured zones (gcp.zones, else the region's)."""
        return list(self._zones)

    def spot_price(self, instance_type: str, zone: str) -> float | None:
        """The catalog's Spot price in the zone's region; None where the type is not offered."""
        return self.prices.spot(instance_type, zone)

    def _price_points(self, instance_type: str, zones: list[str], start: datetime,
                      end: datetime) -> list[PricePoint]:
        """Flat: the catalog's Spot price per zone, in effect from start."""
        return self.prices.history(instance_type, zones, start, end)

    def risk_hints(self, instance_types: list[str], zones: list[str]) -> dict[tuple[str, str], Any]:
        """{}: GCP publishes no per-pool interruption evidence (the catalog's priors apply)."""
        return {}

    def offline_tick_s(self) -> float | None:
        """None: GCP prices hold for days; the policy's own interval applies."""
        return None

    def pools_cooling(self) -> set[str]:
        """Pool keys that refused capacity within the cooldown."""
        return pools_cooling(self.capacity_failures, self.now(), self.capacity_cooldown_s)

    def _record_capacity(self, pool: str, code: str) -> None:
        record_capacity(self.capacity_failures, pool, code, self.now())

    # ------------------------------------------------------------ launch

    def plan_launch(self, request: LaunchRequest) -> LaunchPlan:
        """Pure: the Compute Engine calls a launch (or, for count > 1, a group launch) makes."""
        build = build_group_calls if request.count > 1 else build_calls
        return LaunchPlan(provider=self.name, request=request,
                          calls=build(self.cfg, self.catalog, request, elide_user_data=True))

    def launch(self, plan: LaunchPlan) -> InstanceInfo:
        """Insert into the candidates in order; the first VM started wins."""
        request = plan.single()
        existing = self._by_token(request)
        if existing:
            return existing[0]
        failed: list[tuple[str, str]] = []
        for c in build_calls(self.cfg, self.catalog, request):
            info = self._insert(c, failed)
            if info is not None:
                return info
        raise self._launch_failure(failed, "no capacity in any candidate")

    def _launch_failure(self, failed: list[tuple[str, str]], what: str) -> ProviderError:
        if failed and not any(code in CAPACITY_CODES or code == "SPOT_ONLY"
                              for _, code in failed):
            return ProviderError(f"launch failed: {failed}"[:400], field="gcp",
                                 value=failed[-1][1])
        pool, code = failed[-1] if failed else ("", "ZONE_RESOURCE_POOL_EXHAUSTED")
        itype, zone, market = (pool.split("/") + ["", "", ""])[:3]
        err = CapacityError(f"{what}: {', '.join(f'{p} ({c})' for p, c in failed)}"[:400],
                            instance_type=itype, zone=zone, market=market, code=code)
        err.failures = failed  # type: ignore[attr-defined]
        return err

    def _insert(self, c: dict[str, Any], failed: list[tuple[str, str]]) -> InstanceInfo | None:
        """One insert; None when its pool refused it (noted in failed)."""
        from google.cloud import compute_v1
        pool, p = c["pools"][0], c["params"]
        itype, _, market = pool.split("/")
        if market == Market.ON_DEMAND.value and self.prices.spot_only(itype):
            failed.append((pool, "SPOT_ONLY"))   # GCP sells it as Spot only: not a market
            return None
        body = compute_v1.Instance.from_json(json.dumps(p["instanceResource"]))
        try:
            op = self.clients.instances.insert_unary(request=compute_v1.InsertInstanceRequest(
                project=p["project"], zone=p["zone"], request_id=p["requestId"],
                instance_resource=body))
        except Exception as exc:  # noqa: BLE001 - sorted below
            code = error_code(exc)
            if code == "alreadyExists":   # a retry after a crash: the VM is ours already
                return self._wait_visible(p["zone"], c["name"])
            if code in CAPACITY_CODES:
                self._record_capacity(pool, "QUOTA_EXCEEDED")
                failed.append((pool, "QUOTA_EXCEEDED"))
                return None
            raise gce_error(exc, "instances.insert") from None
        op = wait_op(self.clients, self.project, op, zone=p["zone"],
                     timeout_s=self.operation_timeout_s)
        err = op_error(op)
        if err is not None:
            code, message = err
            if code in CAPACITY_CODES:
                self._record_capacity(pool, code)
                failed.append((pool, code))
                return None
            raise ProviderError(f"gce insert into {pool} failed: {code}: {message}"[:400],
                                field="gcp", value=code)
        return self._wait_visible(p["zone"], c["name"])

    def _wait_visible(self, zone: str, name: str) -> InstanceInfo:
        try:
            raw = self.clients.instances.get(project=self.project, zone=zone, instance=name)
        except Exception as exc:  # noqa: BLE001 - GCE reads its own writes: a real failure
            raise ProviderError("launched instance not visible", field="instance_id",
                                value=name, hint="reconcile will find it by label") from exc
        return self._remember(self._info(raw))

    def _by_token(self, request: LaunchRequest) -> list[InstanceInfo]:
        """VMs this attempt's token already started, alive first (a crash after the launch)."""
        found = self._list(f'{MANAGED} labels.{TOKEN_LABEL} = "{token_label(request.client_token)}"'
                           f' labels.{label_key(TAG_JOB)} = "{label_value(request.job_id)}"')
        alive = [i for i in found if not i.state.is_terminal()]
        return alive or found

    # ------------------------------------------------------------ describe / terminate

    def describe(self, *, job_id: str | None = None,
                 instance_ids: list[str] | None = None) -> list[InstanceInfo]:
        """Managed VMs (of one job, or these ids), ended ones included while known."""
        if instance_ids is not None and not instance_ids:
            return []
        flt = MANAGED
        if job_id is not None:
            flt += f' labels.{label_key(TAG_JOB)} = "{label_value(job_id)}"'
        listed = {i.instance_id: i for i in self._list(flt)}
        if instance_ids is not None:
            wanted = list(dict.fromkeys(instance_ids))
        else:
            with self._lock:
                known = [n for n, i in {**self._seen, **self._ended}.items()
                         if job_id is None or i.tags.get(TAG_JOB) == job_id]
            wanted = list(dict.fromkeys(list(listed) + known))
        out = []
        for name in wanted:
            info = listed.get(name) or self._gone(name)
            if info is not None:
                out.append(info)
        return sorted(out, key=lambda i: i.launched_at)

    def _list(self, flt: str) -> list[InstanceInfo]:
        """aggregatedList (every page, every zone) as InstanceInfos; stopped VMs resolved."""
        from google.cloud import compute_v1
        need_project(self.project)
        try:
            pages = self.clients.instances.aggregated_list(
                request=compute_v1.AggregatedListInstancesRequest(
                    project=self.project, filter=flt, max_results=500))
            raw = [i for _, scoped in pages for i in scoped.instances]
        except Exception as exc:  # noqa: BLE001 - the caller decides
            raise gce_error(exc, "instances.aggregatedList") from None
        out = []
        for r in raw:
            info = self._info(r)
            if info.state is InstanceState.TERMINATED:
                info = self._stopped(r, info)
            else:
                self._remember(info)
            out.append(info)
        return out

    def _remember(self, info: InstanceInfo) -> InstanceInfo:
        with self._lock:
            if info.instance_id not in self._ended:
                self._seen[info.instance_id] = info
        return info

    def _info(self, r: Any) -> InstanceInfo:
        labels = dict(r.labels)
        tags = {tag_of(k): v for k, v in labels.items() if k != TOKEN_LABEL}
        sched = r.scheduling
        market = Market.SPOT if sched.provisioning_model == "SPOT" else Market.ON_DEMAND
        zone = r.zone.rsplit("/", 1)[-1]
        itype = self._type_of(r)
        state = _STATES.get(r.status, InstanceState.PENDING)
        cause = TerminationCause.USER if (state is InstanceState.SHUTTING_DOWN
                                          and r.name in self._deleted) else None
        try:
            price = (self.spot_price(itype, zone) if market is Market.SPOT
                     else self.on_demand_price(itype))
        except ConfigError:
            price = None
        nics = list(r.network_interfaces)
        return InstanceInfo(
            instance_id=r.name, instance_type=itype, zone=zone, market=market, state=state,
            launched_at=_ts(r.last_start_timestamp or r.creation_timestamp) or self.now(),
            cause=cause, tags=tags, price_usd_per_hour=price,
            client_token=metadata_value(r.metadata.items, TOKEN_KEY) if r.metadata else None,
            private_ip=(nics[0].network_i_p or None) if nics else None)

    def _type_of(self, r: Any) -> str:
        """The catalog type of a VM: its machine type, plus its attached GPUs for N1."""
        machine = r.machine_type.rsplit("/", 1)[-1]
        accels = list(r.guest_accelerators)
        for name, t in self.catalog.types.items():
            if t.extra.get("machine_type", name) != machine:
                continue
            if not t.extra.get("attach_accelerator"):
                return name
            if accels and accels[0].accelerator_type.rsplit("/", 1)[-1] == t.extra.get(
                    "accelerator") and accels[0].accelerator_count == int(t.extra.get("count")):
                return name
        return machine

    def _stopped(self, r: Any, info: InstanceInfo) -> InstanceInfo:
        """A TERMINATED (stopped) VM: why it stopped, and delete it (its disk still bills)."""
        cause, ended = self._ending(info.zone, r.name)
        if cause is TerminationCause.USER or cause is None:
            cause = TerminationCause.INSTANCE_SHUTDOWN
        done = replace(info, cause=cause, ended_at=_ts(r.last_stop_timestamp) or ended
                       or self.now())
        with self._lock:
            self._seen.pop(r.name, None)
            self._ended[r.name] = done
            first = r.name not in self._deleted
        if first:
            self.terminate(r.name)
        return done

    def _gone(self, name: str) -> InstanceInfo | None:
        """A managed VM not listed any more: its end from the zone's operations (cached)."""
        with self._lock:
            if name in self._ended:
                return self._ended[name]
            seen = self._seen.get(name)
        zone = zone_of(name)
        if zone is None:
            return None
        cause, ended = self._ending(zone, name)
        if seen is None:
            if cause is None:
                return None   # never seen and no trace: not ours, or not visible yet
            seen = InstanceInfo(instance_id=name, instance_type="", zone=zone,
                                market=Market.SPOT, state=InstanceState.TERMINATED,
                                launched_at=ended or self.now())
        done = replace(seen, state=InstanceState.TERMINATED,
                       cause=cause or TerminationCause.UNKNOWN, ended_at=ended or self.now())
        with self._lock:
            self._seen.pop(name, None)
            self._ended[name] = done
        return done

    def _ending(self, zone: str, name: str) -> tuple[TerminationCause | None, datetime | None]:
        """(cause, end time) from the operations on a VM; (None, None) when there are none."""
        from google.cloud import compute_v1
        link = f"https://www.googleapis.com/compute/v1/projects/{self.project}/zones/{zone}" \
               f"/instances/{name}"
        try:
            ops = list(self.clients.zone_ops.list(request=compute_v1.ListZoneOperationsRequest(
                project=self.project, zone=zone, filter=f'targetLink = "{link}"')))
        except Exception as exc:  # noqa: BLE001 - unknown is not "ended": ask again next time
            raise gce_error(exc, "zoneOperations.list") from None
        for kind, cause in _ENDINGS:
            mine = [o for o in ops if o.operation_type == kind]
            if mine:
                op = max(mine, key=lambda o: o.insert_time)
                return cause, _ts(op.end_time or op.insert_time)
        return None, None

    def terminate(self, instance_id: str) -> None:
        """Delete; an unknown, deleted or already deleting VM is fine."""
        zone = zone_of(instance_id)
        if zone is None:
            return
        need_project(self.project)
        with self._lock:
            self._deleted.add(instance_id)
        try:
            self.clients.instances.delete_unary(project=self.project, zone=zone,
                                                instance=instance_id)
        except Exception as exc:  # noqa: BLE001 - sorted below
            if http_status(exc) == 404 or error_code(exc) in ("notFound", "resourceNotReady"):
                return
            raise gce_error(exc, "instances.delete") from None
