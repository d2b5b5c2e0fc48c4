"""The gcp provider's multi-node acts: a group of `count` VMs in one pool, and interrupts.

A group is all `count` VMs of one pool or none. Per candidate pool: the job's compact
placement policy where the machine series has one (A2, A3, G2), then one insert per rank,
each labelled with its rank (`spotrun_node`) from the start. GCE's bulkInsert would give
all-or-nothing by itself (minCount), but every VM of a bulk insert carries the same labels,
so spotrun inserts them one by one and deletes a partial group before it tries the next pool.
A retry with the same client token asks for the same names and request ids, so it gets the
VMs already made instead of new ones.

`interrupt` is GCP's own rehearsal of a preemption: `instances.simulateMaintenanceEvent` on a
Spot VM (which cannot live-migrate) preempts it, soft-off first, hard-off 30 s later
(docs: Spot VMs, "Simulate a preemption"; docs/gcp.md).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from spotrun.errors import BadInputError, ProviderError
from spotrun.providers.base import TAG_NODE, InstanceInfo, Interruption, LaunchPlan
from spotrun.providers.gcp import PREEMPTION_WINDOW_S
from spotrun.providers.gcp.launch import build_group_calls, zone_of
from spotrun.providers.gcp.ops import error_code, gce_error, op_error, wait_op
from spotrun.states import Market

log = logging.getLogger(__name__)


class GroupActs:
    """launch_group and interrupt for GcpProvider (which supplies clients, describe, ...)."""

    def launch_group(self, plan: LaunchPlan) -> list[InstanceInfo]:
        """All `count` VMs in the first candidate pool that has room for every one."""
        request = plan.request
        done = self._by_token(request)
        alive = [i for i in done if not i.state.is_terminal()]
        if len(alive) >= request.count:
            return self._by_rank(alive)[:request.count]
        failed: list[tuple[str, str]] = []
        calls = build_group_calls(self.cfg, self.catalog, request)
        for g in sorted({c["group"] for c in calls}):
            mine = [c for c in calls if c["group"] == g]
            for c in mine:
                if c["api"] == "compute.resourcePolicies.insert":
                    self._ensure_policy(c["params"])
            inserts = [c for c in mine if c["api"] == "compute.instances.insert"]
            got: list[InstanceInfo] = []
            refused: list[tuple[str, str]] = []
            for c in inserts:   # stop at the first refusal: the pool cannot hold them all
                info = self._insert(c, refused)
                if info is None:
                    break
                got.append(info)
            if len(got) == request.count:
                return self._by_rank(got)
            for info in got:   # a partial group is worth nothing: never leave it running
                self.terminate(info.instance_id)
            code = refused[-1][1] if refused else "ZONE_RESOURCE_POOL_EXHAUSTED"
            if got:
                log.info("pool %s gave %d of %d VMs: deleted them", inserts[0]["pools"][0],
                         len(got), request.count)
                self._record_capacity(inserts[0]["pools"][0], code)
            failed.append((inserts[0]["pools"][0], code))
        raise self._launch_failure(failed, f"no pool has room for all {request.count} VMs")

    @staticmethod
    def _by_rank(infos: list[InstanceInfo]) -> list[InstanceInfo]:
        return sorted(infos, key=lambda i: int(i.tags.get(TAG_NODE, "0")))

    def _ensure_policy(self, params: dict[str, Any]) -> None:
        """Create the job's compact placement policy once (alreadyExists is fine)."""
        from google.cloud import compute_v1
        body = compute_v1.ResourcePolicy.from_json(json.dumps(params["resourcePolicyResource"]))
        try:
            op = self.clients.policies.insert_unary(
                request=compute_v1.InsertResourcePolicyRequest(
                    project=params["project"], region=params["region"],
                    request_id=params["requestId"], resource_policy_resource=body))
        except Exception as exc:  # noqa: BLE001 - sorted below
            if error_code(exc) == "alreadyExists":
                return
            raise gce_error(exc, "resourcePolicies.insert") from None
        op = wait_op(self.clients, self.project, op, region=params["region"],
                     timeout_s=self.operation_timeout_s)
        err = op_error(op)
        if err is not None and err[0] not in ("alreadyExists", "RESOURCE_ALREADY_EXISTS"):
            raise ProviderError(f"resource policy failed: {err[0]}: {err[1]}"[:400],
                                field="gcp", value=err[0])

    # ------------------------------------------------------------ interrupt

    def interrupt(self, instance_ids: list[str], notice_s: float = 30.0) -> list[Interruption]:
        """Preempt these Spot VMs through simulateMaintenanceEvent. GCP's window is its own
        (30 s from soft-off to hard-off): notice_s cannot change it, and a preemption GCP has
        already begun keeps its own hard-off, so the reclaim comes in 30 s or sooner."""
        ids = list(dict.fromkeys(instance_ids))
        if not ids:
            return []
        live = {i.instance_id: i for i in self.describe(instance_ids=ids)
                if not i.state.is_terminal()}
        for iid in ids:
            if iid not in live or zone_of(iid) is None:
                raise BadInputError("no running instance spotrun manages has this id",
                                    field="instance_id", value=iid)
            if live[iid].market is not Market.SPOT:
                raise BadInputError("only Spot VMs can be preempted; it is on-demand",
                                    field="instance_id", value=iid)
        for iid in ids:
            zone = zone_of(iid)
            try:
                op = self.clients.instances.simulate_maintenance_event_unary(
                    project=self.project, zone=zone, instance=iid)
            except Exception as exc:  # noqa: BLE001 - one clear error
                raise gce_error(exc, "instances.simulateMaintenanceEvent") from None
            op = wait_op(self.clients, self.project, op, zone=zone,
                         timeout_s=self.operation_timeout_s)
            err = op_error(op)
            if err is not None:
                raise ProviderError(f"simulateMaintenanceEvent on {iid} failed: "
                                    f"{err[0]}: {err[1]}"[:400], field="gcp", value=err[0])
        window_s = PREEMPTION_WINDOW_S
        note = "" if abs(notice_s - window_s) <= 1e-9 else f"GCP's window is always {window_s:g} s"
        return [Interruption(instance_id=i, reclaim_in_s=window_s, at_most=True, note=note)
                for i in ids]
