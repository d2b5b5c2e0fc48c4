"""The test layer's multi-node answers: placement groups (moto lacks them) and what EC2 does
after a Fault Injection Service spot interruption starts (moto keeps only the bookkeeping)."""

from __future__ import annotations

import json
import re
import threading
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any
from xml.sax.saxutils import escape

EC2_NS = "http://ec2.amazonaws.com/doc/2016-11-15/"
FIS_ACTION = "aws:ec2:send-spot-instance-interruptions"
_ISO_DURATION = re.compile(r"^PT(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?$")


class MultiNodeActs:
    """Mixed into FaultLayer (which has state, lock, reclaim, _run, _error)."""

    def _create_placement_group(self, start_response, params, call):
        name = params.get("GroupName", "")
        with self.lock:
            exists = name in self.state.placement_groups
            if not exists:
                self.state.placement_groups[name] = params.get("Strategy", "")
        if exists:
            call.status = 400
            return self._error(start_response, 400, "InvalidPlacementGroup.Duplicate", True)
        call.status = 200
        out = (b'<?xml version="1.0" encoding="UTF-8"?><CreatePlacementGroupResponse xmlns="'
               + EC2_NS.encode() + b'"><requestId>' + str(uuid.uuid4()).encode()
               + b"</requestId><return>true</return><placementGroup><groupName>"
               + escape(name).encode() + b"</groupName><strategy>"
               + escape(params.get("Strategy", "")).encode()
               + b"</strategy><state>available</state></placementGroup>"
               + b"</CreatePlacementGroupResponse>")
        start_response("200 OK", [("Content-Type", "text/xml"),
                                   ("Content-Length", str(len(out)))])
        return [out]

    def _describe_placement_groups(self, start_response, call):
        call.status = 200
        items = b"".join(b"<item><groupName>%s</groupName><strategy>%s</strategy>"
                         b"<state>available</state></item>" % (escape(n).encode(),
                                                               escape(st).encode())
                         for n, st in sorted(self.placement_groups().items()))
        out = (b'<?xml version="1.0" encoding="UTF-8"?><DescribePlacementGroupsResponse xmlns="'
               + EC2_NS.encode() + b'"><requestId>' + str(uuid.uuid4()).encode()
               + b"</requestId><placementGroupSet>" + items + b"</placementGroupSet>"
               + b"</DescribePlacementGroupsResponse>")
        start_response("200 OK", [("Content-Type", "text/xml"),
                                   ("Content-Length", str(len(out)))])
        return [out]

    def _start_experiment(self, environ, start_response, action, params, call):
        """moto starts the experiment; the layer then interrupts its spot targets."""
        status, headers, out = self._run(environ, action, params)
        call.status = status
        if status < 400:
            self._interrupt_targets(json.loads(out or b"{}").get("experiment") or {})
        start_response(f"{status} {'OK' if status < 400 else 'Error'}", headers)
        return [out]

    def _interrupt_targets(self, experiment: dict[str, Any]) -> None:
        targets = experiment.get("targets") or {}
        for action in (experiment.get("actions") or {}).values():
            if action.get("actionId") != FIS_ACTION:
                continue
            delay_s = _iso_duration_s((action.get("parameters") or {}).get(
                "durationBeforeInterruption", "PT2M"))
            for name in (action.get("targets") or {}).values():
                for arn in (targets.get(name) or {}).get("resourceArns") or []:
                    self._spot_interruption(arn.rsplit("/", 1)[-1], delay_s)

    def _spot_interruption(self, instance_id: str, delay_s: float) -> None:
        at = datetime.now(timezone.utc) + timedelta(seconds=delay_s)
        when = at.strftime("%Y-%m-%dT%H:%M:%SZ")
        with self.lock:
            self.state.notices[instance_id] = when
            hooks = list(self.state.notice_hooks)
            timer = threading.Timer(delay_s * self.state.fis_time_scale, self.reclaim,
                                    [instance_id])
            timer.daemon = True
            self.state.timers.append(timer)
        for hook in hooks:
            hook(instance_id, when)
        timer.start()


def _iso_duration_s(text: str) -> float:
    m = _ISO_DURATION.match(text or "")
    if not m:
        return 120.0
    h, mi, se = (int(x or 0) for x in m.groups())
    return h * 3600.0 + mi * 60.0 + se
