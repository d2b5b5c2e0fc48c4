"""The state of a fake Compute Engine project: instances, operations, resource policies.

Kept apart from the HTTP side (fake_compute.py) so tests can act on it the way GCP acts on
its own: a preemption (ACPI soft-off, `instance/preempted` TRUE, then after the window the
VM is stopped and, with instanceTerminationAction DELETE, deleted), a guest that powers
itself off, a pool without capacity, a region out of GPU quota.

The JSON shapes are those of the Compute Engine v1 REST reference (Instance, Operation,
ResourcePolicy); only the fields spotrun reads or sends are kept, plus the ones a real
answer always carries (kind, id, selfLink, creationTimestamp).
"""

from __future__ import annotations

import copy
import itertools
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

BASE = "https://www.googleapis.com/compute/v1"
# What GCP answers for a pool without capacity, and for a region out of quota.
NO_CAPACITY = "ZONE_RESOURCE_POOL_EXHAUSTED"
QUOTA = "QUOTA_EXCEEDED"


def rfc3339(ts: float) -> str:
    """Compute Engine's timestamp format (RFC 3339 with an offset)."""
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds")


class ApiError(Exception):
    """An HTTP error answer in Google's JSON error shape."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message

    def body(self) -> dict[str, Any]:
        """{"error": {...}} as the Google APIs send it."""
        return {"error": {"code": self.status, "message": self.message,
                          "errors": [{"message": self.message, "domain": "global",
                                      "reason": self.reason}]}}


@dataclass
class Preemption:
    """A preemption under way: the VM is stopping, its window runs until `deadline`."""

    zone: str
    name: str
    started: float
    deadline: float
    timer: threading.Timer | None = None
    op: dict[str, Any] | None = None


@dataclass
class Call:
    """One request the fake answered (method, path without the prefix, query)."""

    method: str
    path: str
    query: dict[str, str]
    body: dict[str, Any] | None = None


@dataclass
class ComputeState:
    """One project's instances and operations; every public method takes the lock."""

    project: str = "spotrun-test"
    region: str = "us-central1"
    zones: tuple[str, ...] = ("us-central1-a", "us-central1-b", "us-central1-c")
    window_s: float = 30.0              # ACPI soft-off to hard-off for a Spot VM
    op_delay_s: float = 0.05            # operations stay RUNNING this long
    boot_s: float = 0.1                 # PROVISIONING/STAGING before RUNNING
    clock: Callable[[], float] = time.time
    instances: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    ops: dict[str, dict[str, Any]] = field(default_factory=dict)
    policies: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    no_capacity: set[tuple[str, str, str]] = field(default_factory=set)   # (type, zone, model)
    quota_out: set[tuple[str, str]] = field(default_factory=set)          # (type, model)
    preempting: dict[str, Preemption] = field(default_factory=dict)
    # Hooks for the machines' side (tests/gcp/harness.py): a preemption began (soft-off),
    # an instance is gone for good (hard-off or delete).
    on_preempt: list[Callable[[str, str, float], None]] = field(default_factory=list)
    on_gone: list[Callable[[str], None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.RLock()
        self._ids = itertools.count(4_000_000_000_000_000_001)
        self._ips = itertools.count(2)
        self._request_ids: dict[tuple[str, str], str] = {}

    # ------------------------------------------------------------ links

    def zone_link(self, zone: str) -> str:
        """The zone's URL."""
        return f"{BASE}/projects/{self.project}/zones/{zone}"

    def instance_link(self, zone: str, name: str) -> str:
        """An instance's selfLink."""
        return f"{self.zone_link(zone)}/instances/{name}"

    def _check_zone(self, zone: str) -> None:
        if zone not in self.zones:
            raise ApiError(400, "invalid", f"Invalid value for field 'zone': '{zone}'. "
                                           "Unknown zone.")

    # ------------------------------------------------------------ what GCP does by itself

    def set_no_capacity(self, machine_type: str, zone: str, model: str = "SPOT") -> None:
        """Inserts of this type in this zone and provisioning model fail for capacity."""
        with self._lock:
            self.no_capacity.add((machine_type, zone, model))

    def set_quota_exceeded(self, machine_type: str, model: str = "SPOT") -> None:
        """Inserts of this type and model fail for quota (in every zone of the region)."""
        with self._lock:
            self.quota_out.add((machine_type, model))

    def preempt(self, zone: str, name: str, window_s: float | None = None) -> None:
        """Preempt a Spot VM: soft-off now, stopped (and deleted) when the guest has powered
        off or the window has run out, whichever comes first."""
        with self._lock:
            inst = self._get(zone, name)
            if name in self.preempting or inst["status"] not in ("RUNNING", "STAGING",
                                                                 "PROVISIONING"):
                return
            now = self.clock()
            window = self.window_s if window_s is None else window_s
            p = Preemption(zone, name, now, now + window)
            self.preempting[name] = p
            inst["status"] = "STOPPING"
            # The system operation runs while the VM stops; it is DONE at hard-off.
            p.op = self._system_op(zone, name, "compute.instances.preempted", now,
                                   status_message="Instance was preempted.", done=False)
            hooks = list(self.on_preempt)
        for hook in hooks:
            hook(zone, name, p.deadline)
        if window <= 0:
            self.finish_preemption(name)
            return
        p.timer = threading.Timer(window, self.finish_preemption, args=(name,))
        p.timer.daemon = True
        p.timer.start()

    def finish_preemption(self, name: str) -> None:
        """Hard-off: the preempted VM stops and (termination action DELETE) is deleted."""
        with self._lock:
            p = self.preempting.pop(name, None)
            if p is None:
                return
            if p.timer is not None:
                p.timer.cancel()
            now = self.clock()
            if p.op is not None:
                p.op.update({"status": "DONE", "progress": 100, "endTime": rfc3339(now),
                             "_done_at": now})
            inst = self.instances.get((p.zone, name))
            if inst is None:
                return
            action = inst.get("scheduling", {}).get("instanceTerminationAction", "STOP")
            if action == "DELETE":
                del self.instances[(p.zone, name)]
            else:
                inst["status"] = "TERMINATED"
                inst["lastStopTimestamp"] = rfc3339(now)
        self._fire_gone(name)

    def _fire_gone(self, name: str) -> None:
        # On threads of their own: a hook may wait for processes to die, and the lock is held.
        for hook in list(self.on_gone):
            threading.Thread(target=hook, args=(name,), daemon=True).start()

    def guest_shutdown(self, zone: str, name: str) -> None:
        """The guest powered itself off: a preemption under way ends now; otherwise the VM is
        TERMINATED (stopped; its disks stay) as `shutdown -h now` leaves it on GCE."""
        if name in self.preempting:
            self.finish_preemption(name)
            return
        with self._lock:
            inst = self.instances.get((zone, name))
            if inst is None or inst["status"] == "TERMINATED":
                return
            inst["status"] = "TERMINATED"
            now = self.clock()
            inst["lastStopTimestamp"] = rfc3339(now)
            self._system_op(zone, name, "compute.instances.guestTerminate", now)
        self._fire_gone(name)

    def backdate(self, zone: str, name: str, seconds: float) -> None:
        """Make an instance look `seconds` older (billing tests)."""
        with self._lock:
            inst = self._get(zone, name)
            for key in ("creationTimestamp", "lastStartTimestamp"):
                ts = datetime.fromisoformat(inst[key]).timestamp() - seconds
                inst[key] = rfc3339(ts)

    # ------------------------------------------------------------ instances

    def _get(self, zone: str, name: str) -> dict[str, Any]:
        self._check_zone(zone)
        self._advance()
        inst = self.instances.get((zone, name))
        if inst is None:
            raise ApiError(404, "notFound", f"The resource 'projects/{self.project}/zones/"
                                            f"{zone}/instances/{name}' was not found")
        return inst

    def get_instance(self, zone: str, name: str) -> dict[str, Any]:
        """instances.get."""
        with self._lock:
            return copy.deepcopy(self._get(zone, name))

    def insert(self, zone: str, body: dict[str, Any], request_id: str | None) -> dict[str, Any]:
        """instances.insert: an operation; its error says why no instance came of it."""
        with self._lock:
            self._check_zone(zone)
            replay = self._replay(zone, request_id)
            if replay is not None:
                return replay
            name = str(body.get("name", ""))
            if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
                raise ApiError(400, "invalid", f"Invalid value for field 'resource.name': "
                                               f"'{name}'.")
            if (zone, name) in self.instances:
                raise ApiError(409, "alreadyExists", f"The resource 'projects/{self.project}/"
                                                     f"zones/{zone}/instances/{name}' already "
                                                     "exists")
            mtype = str(body.get("machineType", "")).rsplit("/", 1)[-1]
            sched = body.get("scheduling") or {}
            model = sched.get("provisioningModel", "STANDARD")
            error = None
            if (mtype, model) in self.quota_out:
                error = (QUOTA, f"Quota 'PREEMPTIBLE_NVIDIA_GPUS' exceeded. Limit: 0.0 in region "
                                f"{self.region}." if model == "SPOT" else
                         f"Quota 'NVIDIA_GPUS' exceeded. Limit: 0.0 in region {self.region}.")
            elif (mtype, zone, model) in self.no_capacity:
                error = (NO_CAPACITY, f"The zone 'projects/{self.project}/zones/{zone}' does not "
                                      "have enough resources available to fulfill the request. "
                                      "Try a different zone, or try again later.")
            op = self._new_op(zone, "insert", name, request_id, error=error,
                              http_status=403 if error and error[0] == QUOTA else 503)
            if error is None:
                self.instances[(zone, name)] = self._instance(zone, name, mtype, body)
            return copy.deepcopy(op)

    def _instance(self, zone: str, name: str, mtype: str, body: dict[str, Any]) -> dict[str, Any]:
        now = self.clock()
        inst = copy.deepcopy(body)
        inst.update({
            "kind": "compute#instance", "id": str(next(self._ids)), "name": name,
            "creationTimestamp": rfc3339(now), "lastStartTimestamp": rfc3339(now),
            "zone": self.zone_link(zone), "status": "PROVISIONING",
            "machineType": f"{self.zone_link(zone)}/machineTypes/{mtype}",
            "selfLink": self.instance_link(zone, name),
            "labelFingerprint": uuid.uuid4().hex[:12],
            "_ready_at": now + self.boot_s})
        nics = inst.get("networkInterfaces") or [{}]
        for i, nic in enumerate(nics):
            nic.setdefault("name", f"nic{i}")
            nic["networkIP"] = f"10.128.0.{next(self._ips) % 250 + 2}"
        inst["networkInterfaces"] = nics
        meta = inst.setdefault("metadata", {})
        meta.setdefault("items", [])
        meta["fingerprint"] = uuid.uuid4().hex[:12]
        meta["kind"] = "compute#metadata"
        return inst

    def delete(self, zone: str, name: str, request_id: str | None) -> dict[str, Any]:
        """instances.delete: the VM stops, then is gone once the operation is done."""
        with self._lock:
            replay = self._replay(zone, request_id)
            if replay is not None:
                return replay
            inst = self._get(zone, name)
            if inst.get("_deleting"):
                raise ApiError(400, "resourceNotReady", f"The resource 'projects/{self.project}"
                                                        f"/zones/{zone}/instances/{name}' is not "
                                                        "ready")
            inst["_deleting"] = True
            inst["status"] = "STOPPING"
            op = self._new_op(zone, "delete", name, request_id)
            return copy.deepcopy(op)

    def simulate_maintenance(self, zone: str, name: str) -> dict[str, Any]:
        """instances.simulateMaintenanceEvent: a Spot VM cannot live-migrate, so it is
        preempted (docs: create-use-spot, "Simulate a preemption")."""
        with self._lock:
            inst = self._get(zone, name)
            spot = (inst.get("scheduling") or {}).get("provisioningModel") == "SPOT"
            op = self._new_op(zone, "simulateMaintenanceEvent", name, None)
        if spot:
            self.preempt(zone, name)
        return copy.deepcopy(op)

    def names(self) -> set[str]:
        """The names of the instances that exist now (time-driven changes applied first)."""
        with self._lock:
            self._advance()
            return {name for _, name in self.instances}

    def list_instances(self, zone: str | None, flt: str) -> list[dict[str, Any]]:
        """Instances of a zone (or all zones) that match a list filter."""
        terms = parse_filter(flt)
        with self._lock:
            self._advance()
            out = [copy.deepcopy(i) for (z, _), i in sorted(self.instances.items())
                   if (zone is None or z == zone) and matches(i, terms)]
        for i in out:
            i.pop("_ready_at", None)
            i.pop("_deleting", None)
        return out

    # ------------------------------------------------------------ resource policies

    def insert_policy(self, region: str, body: dict[str, Any],
                      request_id: str | None) -> dict[str, Any]:
        """resourcePolicies.insert (a regional operation)."""
        with self._lock:
            name = str(body.get("name", ""))
            if (region, name) in self.policies:
                raise ApiError(409, "alreadyExists", f"The resource 'projects/{self.project}/"
                                                     f"regions/{region}/resourcePolicies/{name}'"
                                                     " already exists")
            link = f"{BASE}/projects/{self.project}/regions/{region}/resourcePolicies/{name}"
            self.policies[(region, name)] = {**body, "kind": "compute#resourcePolicy",
                                             "id": str(next(self._ids)), "selfLink": link,
                                             "region": region, "status": "READY"}
            return copy.deepcopy(self._new_op(region, "insert", name, request_id,
                                              regional=True, link=link))

    def get_policy(self, region: str, name: str) -> dict[str, Any]:
        """resourcePolicies.get."""
        with self._lock:
            pol = self.policies.get((region, name))
            if pol is None:
                raise ApiError(404, "notFound", f"The resource 'projects/{self.project}/regions/"
                                                f"{region}/resourcePolicies/{name}' was not found")
            return copy.deepcopy(pol)

    # ------------------------------------------------------------ operations

    def _replay(self, scope: str, request_id: str | None) -> dict[str, Any] | None:
        # GCP: a repeated requestId returns the first request's operation (for 60 minutes).
        if not request_id:
            return None
        name = self._request_ids.get((scope, request_id))
        return copy.deepcopy(self.ops[name]) if name else None

    def _new_op(self, scope: str, kind: str, target: str, request_id: str | None, *,
                error: tuple[str, str] | None = None, http_status: int = 503,
                regional: bool = False, link: str | None = None) -> dict[str, Any]:
        now = self.clock()
        name = f"operation-{int(now * 1000)}-{uuid.uuid4().hex[:12]}"
        where = "regions" if regional else "zones"
        link = link or self.instance_link(scope, target)
        op = {"kind": "compute#operation", "id": str(next(self._ids)), "name": name,
              "operationType": kind, "targetLink": link, "status": "RUNNING", "progress": 0,
              "user": "spotrun-test@example.iam.gserviceaccount.com",
              "insertTime": rfc3339(now), "startTime": rfc3339(now),
              "selfLink": f"{BASE}/projects/{self.project}/{where}/{scope}/operations/{name}",
              ("region" if regional else "zone"): f"{BASE}/projects/{self.project}/{where}/"
                                                  f"{scope}",
              "_scope": scope, "_done_at": now + self.op_delay_s}
        if error is not None:
            op["_error"] = {"errors": [{"code": error[0], "message": error[1]}]}
            op["_http"] = (http_status, "SERVICE UNAVAILABLE" if http_status == 503
                           else "FORBIDDEN")
        self.ops[name] = op
        if request_id:
            self._request_ids[(scope, request_id)] = name
        return op

    def _system_op(self, zone: str, name: str, kind: str, now: float,
                   status_message: str = "", done: bool = True) -> dict[str, Any]:
        op = self._new_op(zone, kind, name, None)
        op["user"] = "system"
        if done:
            op.update({"status": "DONE", "progress": 100, "endTime": rfc3339(now),
                       "_done_at": now})
        else:
            op["_done_at"] = float("inf")
        if status_message:
            op["statusMessage"] = status_message
        return op

    def _advance(self) -> None:
        """Move time-driven state on: operations finish, booting VMs run, deletes land."""
        now = self.clock()
        for op in self.ops.values():
            if op["status"] != "DONE" and now >= op["_done_at"]:
                op.update({"status": "DONE", "progress": 100, "endTime": rfc3339(now)})
                if "_error" in op:
                    op["error"] = op["_error"]
                    op["httpErrorStatusCode"], op["httpErrorMessage"] = op["_http"]
                if op["operationType"] == "delete":
                    gone = op["targetLink"].rsplit("/", 1)[-1]
                    if self.instances.pop((op["_scope"], gone), None) is not None:
                        self._fire_gone(gone)
        for inst in self.instances.values():
            if inst["status"] in ("PROVISIONING", "STAGING") and now >= inst["_ready_at"]:
                inst["status"] = "RUNNING"

    def get_op(self, scope: str, name: str, *, wait_s: float = 0.0) -> dict[str, Any]:
        """zoneOperations.get / wait (wait: until DONE or wait_s)."""
        deadline = time.monotonic() + wait_s
        while True:
            with self._lock:
                self._advance()
                op = self.ops.get(name)
                if op is None or op["_scope"] != scope:
                    raise ApiError(404, "notFound", f"The resource 'operations/{name}' was not "
                                                    "found")
                if op["status"] == "DONE" or time.monotonic() >= deadline:
                    return public(op)
            time.sleep(0.01)

    def list_ops(self, scope: str, flt: str) -> list[dict[str, Any]]:
        """zoneOperations.list with a filter."""
        terms = parse_filter(flt)
        with self._lock:
            self._advance()
            return [public(op) for op in self.ops.values()
                    if op["_scope"] == scope and matches(op, terms)]


def public(obj: dict[str, Any]) -> dict[str, Any]:
    """A copy without the fake's own bookkeeping keys."""
    return {k: copy.deepcopy(v) for k, v in obj.items() if not k.startswith("_")}


_TERM = re.compile(r'\(?\s*([A-Za-z_][\w.\-]*)\s*(=|!=|eq|ne)\s*"?([^"()]*?)"?\s*\)?(?:\s|$)')


def parse_filter(flt: str) -> list[tuple[str, str, str]]:
    """`a = "x" b != "y"` or `(a = "x") (b = "y")` (AND of terms) as (field, op, value)."""
    flt = (flt or "").strip()
    if not flt:
        return []
    terms = [(f, "!=" if op in ("!=", "ne") else "=", v) for f, op, v in _TERM.findall(flt)]
    if not terms:
        raise ApiError(400, "invalid", f"Invalid list filter expression '{flt}'.")
    return terms


def matches(obj: dict[str, Any], terms: list[tuple[str, str, str]]) -> bool:
    """Every term holds (a dotted field, compared as text)."""
    for fld, op, value in terms:
        cur: Any = obj
        for part in fld.split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        text = "" if cur is None else str(cur)
        if (text == value) != (op == "="):
            return False
    return True
