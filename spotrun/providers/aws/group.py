"""The aws provider's multi-node acts: a group launch by instant EC2 Fleet, and FIS interrupts.

A group is all `count` instances of one pool or none: each candidate pool gets ONE instant
fleet for `count` (MinTargetCapacity = count, so EC2 itself launches all or nothing), in the
job's cluster placement group where the type has EFA. A fleet that still returns fewer (an
account or API that ignores the minimum) has them terminated before the next pool is tried.
Fleet tags every instance alike, so the node rank (`spotrun:node`) is tagged right after; a
retry with the same client token finds the instances by tag and finishes the tagging.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import replace
from typing import Any

from spotrun.aws_clients import CAPACITY_CODES, error_code, use_retries
from spotrun.errors import BadInputError, CapacityError, ProviderError
import spotrun.providers.aws.fis as aws_fis
from spotrun.providers.aws.launch import TAG_TOKEN, build_group_calls, ec2_error
from spotrun.providers.base import (TAG_JOB, TAG_NODE, InstanceInfo, Interruption, LaunchPlan,
                                    LaunchRequest)
from spotrun.states import InstanceState

log = logging.getLogger(__name__)


class GroupActs:
    """launch_group and interrupt for AwsProvider (which supplies _call, describe, ...)."""

    def launch_group(self, plan: LaunchPlan) -> list[InstanceInfo]:
        """All `count` instances in the first candidate pool that has room for every one."""
        request = plan.request
        done = self._group_by_token(request)
        if done is not None:
            return done
        failed: list[tuple[str, str]] = []
        try:
            for c in build_group_calls(self.cfg, request, self._efa_types(request)):
                method = c["api"].split(".", 1)[1]
                if method == "create_launch_template":
                    self._ensure_template(c["params"])
                    continue
                if method == "create_placement_group":
                    self._ensure_placement_group(c["params"])
                    continue
                ids = self._fleet_ids(c, failed)
                if len(ids) >= request.count:
                    return self._tag_ranks(request, self._visible(ids[:request.count]))
                if ids:   # a partial group is worth nothing: never leave it running
                    log.info("fleet in %s gave %d of %d: terminating them", c["pools"][0],
                             len(ids), request.count)
                    self._terminate_all(ids)
                    self._record_capacity(c["pools"][0], "InsufficientInstanceCapacity")
                    failed.append((c["pools"][0], f"partial {len(ids)}/{request.count}"))
        finally:
            self._cleanup_template(plan)
        pool, code = failed[-1] if failed else ("", "InsufficientInstanceCapacity")
        itype, zone, market = (pool.split("/") + ["", "", ""])[:3]
        err = CapacityError(f"no pool has room for all {request.count} instances: "
                            f"{', '.join(f'{p} ({c})' for p, c in failed)}"[:400],
                            instance_type=itype, zone=zone, market=market,
                            code=code if code in CAPACITY_CODES else "InsufficientInstanceCapacity")
        err.failures = failed  # type: ignore[attr-defined]
        raise err

    def _fleet_ids(self, c: dict[str, Any], failed: list[tuple[str, str]]) -> list[str]:
        resp = self._launch_call("create_fleet", c, failed)
        return [] if resp is None else sorted(self._ids_from("create_fleet", resp, c["pools"],
                                                             failed))

    def _launch_call(self, method: str, c: dict[str, Any],
                     failed: list[tuple[str, str]]) -> dict[str, Any] | None:
        """One launch call; None when EC2 refused it for capacity (each pool noted in failed)."""
        try:
            return self._call(method, **c["params"])
        except Exception as exc:
            code = error_code(exc)
            if code not in CAPACITY_CODES:
                raise ec2_error(exc, method) from None
            for pool in c["pools"]:
                self._record_capacity(pool, code)
                failed.append((pool, code))
            return None

    def _ensure_placement_group(self, params: dict[str, Any]) -> None:
        try:
            self._call("create_placement_group", **params)
        except Exception as exc:
            if error_code(exc) not in ("InvalidPlacementGroup.Duplicate",):
                raise ec2_error(exc, "create_placement_group") from None

    def _group_by_token(self, request: LaunchRequest) -> list[InstanceInfo] | None:
        """The group this token already started (a crash between launch and DB write)."""
        found = self._describe_filters([
            {"Name": f"tag:{TAG_JOB}", "Values": [request.job_id]},
            {"Name": f"tag:{TAG_TOKEN}", "Values": [request.client_token]}])
        alive = [i for i in found if i.state is not InstanceState.TERMINATED]
        if len(alive) < request.count:
            return None
        return self._tag_ranks(request, alive[:request.count])

    def _visible(self, ids: list[str]) -> list[InstanceInfo]:
        seen = {i.instance_id: i for i in self.describe(instance_ids=ids)}
        for iid in ids:
            if iid not in seen:
                seen[iid] = self._wait_visible(iid)
        return [seen[i] for i in ids]

    def _tag_ranks(self, request: LaunchRequest, infos: list[InstanceInfo]) -> list[InstanceInfo]:
        """Tag each instance with its rank (kept where already tagged); ordered by rank."""
        infos = sorted(infos, key=lambda i: i.instance_id)
        taken = {i.tags[TAG_NODE] for i in infos if TAG_NODE in i.tags}
        free = [str(request.rank_of(k)) for k in range(request.count)
                if str(request.rank_of(k)) not in taken]
        out: list[InstanceInfo] = []
        for info in infos:
            if TAG_NODE not in info.tags:
                rank = free.pop(0)
                self._call("create_tags", Resources=[info.instance_id],
                           Tags=[{"Key": TAG_NODE, "Value": rank}])
                info = replace(info, tags={**info.tags, TAG_NODE: rank})
            out.append(info)
        return sorted(out, key=lambda i: int(i.tags[TAG_NODE]))

    def _terminate_all(self, ids: list[str]) -> None:
        for iid in ids:
            self.terminate(iid)

    # ------------------------------------------------------------ interrupt (FIS)

    def fis(self) -> Any:
        """The boto3 FIS client (made on first use)."""
        if self._fis is None:
            if self._make_fis is None:
                raise ProviderError("no FIS client configured", field="aws")
            self._fis = use_retries(self._make_fis(), self.retry)
        return self._fis

    def interrupt(self, instance_ids: list[str], notice_s: float = 120.0) -> list[Interruption]:
        """A spot interruption through FIS: notice now, reclaim after notice_s (2-15 min).

        EC2 shows spotrun no reclaim it already has in mind, and nothing postpones one: the
        reclaim comes after FIS's notice or sooner (`at_most`).
        """
        ids = list(dict.fromkeys(instance_ids))
        if not ids:
            return []
        raw = self._raw_instances(ids)
        missing = [i for i in ids if i not in raw]
        if missing:
            raise BadInputError("no running instance spotrun manages has this id",
                                field="instance_id", value=missing[0])
        for iid, (inst, _owner) in raw.items():
            if inst.get("InstanceLifecycle") != "spot":
                raise BadInputError("only spot instances can be interrupted; it is on-demand",
                                    field="instance_id", value=iid)
        owner = next(iter(raw.values()))[1]
        role = self.fis_role_arn or aws_fis.default_role_arn(owner)
        params = aws_fis.template_params(
            arns=[aws_fis.instance_arn(self.region, owner, i) for i in ids], notice_s=notice_s,
            role_arn=role, token=uuid.uuid4().hex, description=f"spotrun interrupt {' '.join(ids)}")
        fis = self.fis()
        try:
            tmpl = fis.create_experiment_template(**params)
            tid = tmpl["experimentTemplate"]["id"]
            fis.start_experiment(clientToken=uuid.uuid4().hex,
                                 experimentTemplateId=tid, tags={"spotrun:managed": "true"})
        except Exception as exc:
            raise ec2_error(exc, "fis") from None
        try:   # the experiment keeps its own copy; the template is only clutter now
            fis.delete_experiment_template(id=tid)
        except Exception as exc:  # noqa: BLE001 - a leftover template costs nothing
            log.info("could not delete FIS template %s: %s", tid, error_code(exc))
        used_s = float(aws_fis.fis_notice_s(notice_s))
        note = "" if used_s == notice_s else \
            f"FIS gives {aws_fis.NOTICE_MIN_S:g}-{aws_fis.NOTICE_MAX_S:g} s of notice"
        return [Interruption(instance_id=i, reclaim_in_s=used_s, at_most=True, note=note)
                for i in ids]

    def _raw_instances(self, ids: list[str]) -> dict[str, tuple[dict[str, Any], str]]:
        """{id: (EC2 instance, owner account)} of the managed, not terminated ones among ids."""
        resp = self._call("describe_instances", Filters=[
            {"Name": "tag:spotrun:managed", "Values": ["true"]},
            {"Name": "instance-id", "Values": ids},
            {"Name": "instance-state-name", "Values": ["pending", "running"]}])
        return {i["InstanceId"]: (i, r.get("OwnerId", ""))
                for r in resp.get("Reservations", []) for i in r.get("Instances", [])}

