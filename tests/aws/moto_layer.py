"""A WSGI layer in front of moto's app: what moto lacks, added the way AWS behaves.

- chosen actions answer with an AWS error (503 RequestLimitExceeded, capacity errors);
- capacity per pool (type, zone): RunInstances fails with InsufficientInstanceCapacity,
  CreateFleet drops those overrides and reports them in `errorSet`, as an instant fleet does;
- ClientToken idempotency: a repeated token returns the first response, a token reused
  with other parameters answers IdempotentParameterMismatch (moto ignores tokens);
- DescribeSpotPriceHistory answers from injected change points (moto's is a constant);
- GetSpotPlacementScores (moto lacks it) answers from injected scores per type and zone id;
- a pool may have room for only n instances (set_capacity): an instant fleet asking for more
  gets n and an errorSet entry for the rest (MinTargetCapacity is not enforced, so a caller
  sees a partial fleet and must clean it up itself);
- CreatePlacementGroup / DescribePlacementGroups (moto lacks them), and CreateFleet refuses an
  override naming an unknown group (InvalidPlacementGroup.Unknown);
- Fault Injection Service: moto keeps the templates and experiments; StartExperiment of an
  `aws:ec2:send-spot-instance-interruptions` action also does what EC2 then does: a notice for
  each target now (on_notice hooks; the IMDS fakes serve it), and after
  durationBeforeInterruption x fis_time_scale (default 0.01) the instance is reclaimed
  (Server.SpotInstanceTermination).
"""

from __future__ import annotations

import hashlib
import io
import re
import threading
import uuid
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable
from urllib.parse import parse_qsl, urlencode
from xml.sax.saxutils import escape

from moto.core.base_backend import backend_lock

from .moto_layer_multinode import EC2_NS, MultiNodeActs

_IDEMPOTENT = ("RunInstances", "CreateFleet")
# AWS ignores these when comparing a retried request with the first one.
_VOLATILE = ("ClientToken",)


@dataclass
class Rule:
    """Answer `action` with an error `times` times (None = always) when `match` holds."""

    action: str
    code: str
    status: int = 400
    times: int | None = 1
    match: Callable[[dict[str, str]], bool] | None = None
    hits: int = 0


@dataclass
class Call:
    """One request seen by the layer."""

    action: str
    params: dict[str, str]
    status: int = 0


@dataclass
class LayerState:
    """Everything the layer remembers; reset per test."""

    rules: list[Rule] = field(default_factory=list)
    no_capacity: dict[tuple[str, str], str] = field(default_factory=dict)
    tokens: dict[tuple[str, str], tuple[str, int, list, bytes]] = field(default_factory=dict)
    prices: list[tuple[str, str, datetime, float]] = field(default_factory=list)
    placement: list[tuple[str, str, str, int]] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    capacity: dict[tuple[str, str], int] = field(default_factory=dict)
    placement_groups: dict[str, str] = field(default_factory=dict)   # name -> strategy
    notices: dict[str, str] = field(default_factory=dict)    # instance id -> action time (ISO)
    fis_time_scale: float = 0.01   # FIS minutes pass in hundredths (2 min notice: 1.2 s)
    timers: list[threading.Timer] = field(default_factory=list)
    notice_hooks: list[Callable[[str, str], None]] = field(default_factory=list)


_FIS_SCOPE = re.compile(r"Credential=[^/]+/\d{8}/[^/]+/fis/aws4_request")


class FaultLayer(MultiNodeActs):
    """WSGI middleware around moto's DomainDispatcherApplication."""

    def __init__(self, app: Callable[..., Any], zone_of_subnet: Callable[[str], str],
                 reclaim: Callable[[str], None] | None = None) -> None:
        self.app = app
        self.zone_of_subnet = zone_of_subnet
        self.reclaim = reclaim or (lambda _iid: None)
        self.lock = threading.Lock()
        self.state = LayerState()

    # ---------------------------------------------------------------- test API

    def reset(self) -> None:
        """Forget rules, tokens, prices and calls; cancel interruptions not yet delivered."""
        with self.lock:
            for t in self.state.timers:
                t.cancel()
            self.state = LayerState()

    def set_capacity(self, instance_type: str, zone: str, instances: int) -> None:
        """The pool (type, zone) has room for this many instances per fleet until reset."""
        with self.lock:
            self.state.capacity[(instance_type, zone)] = instances

    def set_fis_time_scale(self, scale: float) -> None:
        """Deliver FIS interruptions after durationBeforeInterruption x scale (0 = at once)."""
        with self.lock:
            self.state.fis_time_scale = scale

    def on_notice(self, hook: Callable[[str, str], None]) -> None:
        """Call hook(instance_id, action_time_iso) when FIS sends an instance its notice."""
        with self.lock:
            self.state.notice_hooks.append(hook)

    def notices(self) -> dict[str, str]:
        """Instance id -> interruption time, for every notice FIS sent."""
        with self.lock:
            return dict(self.state.notices)

    def placement_groups(self) -> dict[str, str]:
        """Placement group name -> strategy."""
        with self.lock:
            return dict(self.state.placement_groups)

    def fail(self, action: str, code: str, *, status: int = 400, times: int | None = 1,
             match: Callable[[dict[str, str]], bool] | None = None) -> Rule:
        """Make the next `times` calls of action fail with code (S3: action 's3:PUT' etc.)."""
        rule = Rule(action=action, code=code, status=status, times=times, match=match)
        with self.lock:
            self.state.rules.append(rule)
        return rule

    def set_no_capacity(self, instance_type: str, zone: str,
                        code: str = "InsufficientInstanceCapacity") -> None:
        """The pool (type, zone) has no capacity until reset."""
        with self.lock:
            self.state.no_capacity[(instance_type, zone)] = code

    def set_prices(self, points: list[tuple[str, str, datetime, float]]) -> None:
        """Spot price change points (type, zone, ts, usd/h) that DescribeSpotPriceHistory serves."""
        with self.lock:
            self.state.prices = list(points)

    def set_placement_scores(self, scores: list[tuple[str, str, str, int]]) -> None:
        """Scores (type, region, availability zone id, 1-10) GetSpotPlacementScores serves."""
        with self.lock:
            self.state.placement = list(scores)

    def calls(self, action: str | None = None) -> list[Call]:
        """Requests seen (of one action)."""
        with self.lock:
            return [c for c in self.state.calls if action is None or c.action == action]

    # ---------------------------------------------------------------- WSGI

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(body)
        params: dict[str, str] = {}
        if b"Action=" in body[:4096] and environ.get("REQUEST_METHOD") == "POST":
            params = dict(parse_qsl(body.decode("utf-8"), keep_blank_values=True))
        action = params.get("Action") or f"s3:{environ.get('REQUEST_METHOD', '')}"
        if _FIS_SCOPE.search(environ.get("HTTP_AUTHORIZATION", "")):
            action = f"fis:{environ.get('REQUEST_METHOD', '')} {environ.get('PATH_INFO', '')}"
        call = Call(action=action, params=params)
        with self.lock:
            self.state.calls.append(call)
            rule = self._take_rule(action, params)
        if rule is not None:
            call.status = rule.status
            return self._error(start_response, rule.status, rule.code, bool(params))
        if action == "DescribeSpotPriceHistory":
            return self._prices(start_response, params)
        if action == "GetSpotPlacementScores":
            call.status = 200
            return self._placement_scores(start_response, params, call)
        if action == "CreatePlacementGroup":
            return self._create_placement_group(start_response, params, call)
        if action == "DescribePlacementGroups":
            return self._describe_placement_groups(start_response, call)
        if action == "CreateFleet":
            unknown = [v for k, v in params.items() if k.endswith(".Placement.GroupName")
                       and v not in self.state.placement_groups]
            if unknown:
                call.status = 400
                return self._error(start_response, 400, "InvalidPlacementGroup.Unknown", True)
        if action == "fis:POST /experiments":
            return self._start_experiment(environ, start_response, action, params, call)
        if action == "RunInstances":
            zone = self._zone(params, "Placement.AvailabilityZone", "SubnetId")
            code = self.state.no_capacity.get((params.get("InstanceType", ""), zone))
            if code:
                call.status = 500 if code == "InsufficientInstanceCapacity" else 400
                return self._error(start_response, call.status, code, True)
        if action in _IDEMPOTENT and params.get("ClientToken"):
            return self._idempotent(environ, start_response, action, params, call)
        return self._forward(environ, start_response, action, params, call)

    # ---------------------------------------------------------------- pieces

    def _take_rule(self, action: str, params: dict[str, str]) -> Rule | None:
        for rule in self.state.rules:
            if rule.action != action or (rule.times is not None and rule.hits >= rule.times):
                continue
            if rule.match is not None and not rule.match(params):
                continue
            rule.hits += 1
            return rule
        return None

    def _zone(self, params: dict[str, str], zone_key: str, subnet_key: str) -> str:
        if params.get(zone_key):
            return params[zone_key]
        if params.get(subnet_key):
            return self.zone_of_subnet(params[subnet_key])
        return ""

    def _idempotent(self, environ, start_response, action, params, call):
        token = params["ClientToken"]
        fingerprint = _fingerprint(params)
        with self.lock:
            seen = self.state.tokens.get((action, token))
        if seen is not None:
            if seen[0] != fingerprint:
                call.status = 400
                return self._error(start_response, 400, "IdempotentParameterMismatch", True)
            call.status = seen[1]
            start_response(f"{seen[1]} OK", seen[2])
            return [seen[3]]
        # AWS serialises calls with one token; so does the layer.
        with _token_lock(token):
            with self.lock:
                seen = self.state.tokens.get((action, token))
            if seen is not None:
                return self._idempotent(environ, start_response, action, params, call)
            status, headers, out = self._run(environ, action, params)
            call.status = status
            if status < 400:
                with self.lock:
                    self.state.tokens[(action, token)] = (fingerprint, status, headers, out)
        start_response(f"{status} OK", headers)
        return [out]

    def _forward(self, environ, start_response, action, params, call):
        status, headers, out = self._run(environ, action, params)
        call.status = status
        start_response(f"{status} {'OK' if status < 400 else 'Error'}", headers)
        return [out]

    def _run(self, environ, action, params) -> tuple[int, list, bytes]:
        fleet_errors: list[tuple[dict[str, str], str]] = []
        if action == "CreateFleet":
            params, fleet_errors = self._drop_full_pools(params)
            params = self._cap_capacity(params, fleet_errors)
            if not any(k.endswith(".InstanceType") for k in params):
                return 200, [("Content-Type", "text/xml")], _fleet_only_errors(fleet_errors)
            body = urlencode(params).encode()
            environ["wsgi.input"] = io.BytesIO(body)
            environ["CONTENT_LENGTH"] = str(len(body))
        captured: dict[str, Any] = {}

        def sr(status: str, headers: list, exc_info: Any = None) -> Callable[[bytes], None]:
            captured["status"] = int(status.split()[0])
            captured["headers"] = list(headers)
            return lambda _b: None

        # A reclaim (moto_fixtures._reclaim) terminates and then sets the spot reason under
        # moto's backend lock; a describe must not read between the two (it saw a terminated
        # instance with a user's reason under load).
        with backend_lock if action.startswith("Describe") else nullcontext():
            chunks = self.app(environ, sr)
            try:
                out = b"".join(chunks)
            finally:
                if hasattr(chunks, "close"):
                    chunks.close()
        headers = captured["headers"]
        if fleet_errors and captured["status"] < 400:
            out = out.replace(b"</CreateFleetResponse>",
                              _error_set(fleet_errors) + b"</CreateFleetResponse>", 1)
            # The body grew; a HEAD keeps moto's length, everything else gets the real one.
            headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
            headers.append(("Content-Length", str(len(out))))
        return captured["status"], headers, out

    def _drop_full_pools(self, params: dict[str, str]):
        """Remove overrides of pools without capacity; renumber the rest."""
        prefix = "LaunchTemplateConfigs.1.Overrides."
        overrides: dict[int, dict[str, str]] = {}
        rest: dict[str, str] = {}
        for k, v in params.items():
            if k.startswith(prefix):
                n, _, sub = k[len(prefix):].partition(".")
                overrides.setdefault(int(n), {})[sub] = v
            else:
                rest[k] = v
        errors: list[tuple[dict[str, str], str]] = []
        kept: list[dict[str, str]] = []
        for n in sorted(overrides):
            ov = overrides[n]
            zone = self._zone(ov, "AvailabilityZone", "SubnetId")
            code = self.state.no_capacity.get((ov.get("InstanceType", ""), zone))
            if code:
                errors.append(({**ov, "AvailabilityZone": zone}, code))
            else:
                kept.append(ov)
        for i, ov in enumerate(kept, start=1):
            for sub, v in ov.items():
                rest[f"{prefix}{i}.{sub}"] = v
        return rest, errors

    def _cap_capacity(self, params: dict[str, str], errors: list) -> dict[str, str]:
        """Lower TotalTargetCapacity to the room of the pools left; the rest is an error."""
        prefix = "LaunchTemplateConfigs.1.Overrides."
        pools = {}
        for k, v in params.items():
            if k.startswith(prefix) and k.endswith(".InstanceType"):
                n = k[len(prefix):].split(".")[0]
                ov = {kk[len(f"{prefix}{n}."):]: vv for kk, vv in params.items()
                      if kk.startswith(f"{prefix}{n}.")}
                pools[(v, self._zone(ov, "AvailabilityZone", "SubnetId"))] = ov
        rooms = [self.state.capacity.get(p) for p in pools]
        if not rooms or any(r is None for r in rooms):
            return params
        want = int(params.get("TargetCapacitySpecification.TotalTargetCapacity", "1"))
        room = max(r for r in rooms if r is not None)
        if room >= want:
            return params
        (itype, zone), ov = next(iter(pools.items()))
        errors.append(({**ov, "AvailabilityZone": zone}, "InsufficientInstanceCapacity"))
        out = dict(params)
        out["TargetCapacitySpecification.TotalTargetCapacity"] = str(room)
        if room == 0:
            for k in [k for k in out if k.startswith(prefix)]:
                del out[k]
        return out

    def _prices(self, start_response, params):
        types = {v for k, v in params.items() if k.startswith("InstanceType.")}
        zone = params.get("AvailabilityZone")
        filters = _filters(params)
        start = _parse_ts(params.get("StartTime"))
        end = _parse_ts(params.get("EndTime"))
        with self.lock:
            points = list(self.state.prices)
        rows = []
        for itype, z, ts, price in sorted(points, key=lambda p: p[2], reverse=True):
            if types and itype not in types:
                continue
            if zone and z != zone:
                continue
            if "availability-zone" in filters and z not in filters["availability-zone"]:
                continue
            if "instance-type" in filters and itype not in filters["instance-type"]:
                continue
            if end and ts > end:
                continue
            rows.append((itype, z, ts, price))
        if start:
            # AWS includes the point in effect at StartTime, then changes after it.
            keep, in_effect = [], set()
            for r in rows:
                if r[2] >= start:
                    keep.append(r)
                elif (r[0], r[1]) not in in_effect:
                    in_effect.add((r[0], r[1]))
                    keep.append(r)
            rows = keep
        offset = int(params.get("NextToken") or 0)
        limit = int(params.get("MaxResults") or 1000)
        page = rows[offset:offset + limit]
        next_token = str(offset + limit) if offset + limit < len(rows) else ""
        items = b"".join(
            b"<item><instanceType>%s</instanceType><productDescription>Linux/UNIX"
            b"</productDescription><spotPrice>%s</spotPrice><timestamp>%s</timestamp>"
            b"<availabilityZone>%s</availabilityZone></item>"
            % (t.encode(), f"{p:.6f}".encode(), _iso(ts).encode(), z.encode())
            for t, z, ts, p in page)
        out = (b'<?xml version="1.0" encoding="UTF-8"?><DescribeSpotPriceHistoryResponse xmlns="'
               + EC2_NS.encode() + b'"><requestId>' + str(uuid.uuid4()).encode()
               + b"</requestId><spotPriceHistorySet>" + items + b"</spotPriceHistorySet>"
               + b"<nextToken>" + next_token.encode() + b"</nextToken>"
               + b"</DescribeSpotPriceHistoryResponse>")
        start_response("200 OK", [("Content-Type", "text/xml"),
                                   ("Content-Length", str(len(out)))])
        return [out]

    def _placement_scores(self, start_response, params, call):
        """As AWS: one score per zone (or region) for the request's types taken together."""
        if not params.get("TargetCapacity"):
            call.status = 400
            return self._error(start_response, 400, "MissingParameter", True)
        types = {v for k, v in params.items() if k.startswith("InstanceType.")}
        regions = {v for k, v in params.items() if k.startswith("RegionName.")}
        single = params.get("SingleAvailabilityZone", "false").lower() == "true"
        with self.lock:
            configured = list(self.state.placement)
        best: dict[tuple[str, str], int] = {}
        for itype, region, az_id, score in configured:
            if itype not in types or (regions and region not in regions):
                continue
            # A fleet of several types may use any of them: the best type's score counts.
            key = (region, az_id if single else "")
            best[key] = max(best.get(key, 0), score)
        rows = sorted(best.items())
        offset = int(params.get("NextToken") or 0)
        limit = int(params.get("MaxResults") or 1000)
        page = rows[offset:offset + limit]
        next_token = str(offset + limit) if offset + limit < len(rows) else ""
        items = b"".join(
            b"<item><region>%s</region>%s<score>%d</score></item>"
            % (r.encode(), (b"<availabilityZoneId>%s</availabilityZoneId>" % z.encode()) if z
               else b"", sc)
            for (r, z), sc in page)
        out = (b'<?xml version="1.0" encoding="UTF-8"?><GetSpotPlacementScoresResponse xmlns="'
               + EC2_NS.encode() + b'"><requestId>' + str(uuid.uuid4()).encode()
               + b"</requestId><spotPlacementScoreSet>" + items + b"</spotPlacementScoreSet>"
               + b"<nextToken>" + next_token.encode() + b"</nextToken>"
               + b"</GetSpotPlacementScoresResponse>")
        start_response("200 OK", [("Content-Type", "text/xml"),
                                   ("Content-Length", str(len(out)))])
        return [out]

    @staticmethod
    def _error(start_response, status: int, code: str, ec2: bool):
        msg = escape(f"injected by the test layer: {code}")
        if ec2:
            out = (f'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>{code}'
                   f"</Code><Message>{msg}</Message></Error></Errors><RequestID>"
                   f"{uuid.uuid4()}</RequestID></Response>").encode()
        else:
            out = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                   f"<Message>{msg}</Message></Error>").encode()
        start_response(f"{status} Error", [("Content-Type", "text/xml"),
                                           ("Content-Length", str(len(out)))])
        return [out]


_token_locks: dict[str, threading.Lock] = {}
_token_locks_guard = threading.Lock()


def _token_lock(token: str) -> threading.Lock:
    with _token_locks_guard:
        return _token_locks.setdefault(token, threading.Lock())


def _fingerprint(params: dict[str, str]) -> str:
    items = sorted((k, v) for k, v in params.items() if k not in _VOLATILE)
    return hashlib.sha256(repr(items).encode()).hexdigest()


def _filters(params: dict[str, str]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for k, v in params.items():
        if k.startswith("Filter.") and k.endswith(".Name"):
            n = k.split(".")[1]
            vals = {pv for pk, pv in params.items() if pk.startswith(f"Filter.{n}.Value.")}
            out[v] = vals
    return out


def _parse_ts(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(timezone.utc)


def _iso(ts: datetime) -> str:
    return ts.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _error_set(errors: list[tuple[dict[str, str], str]]) -> bytes:
    items = []
    for ov, code in errors:
        items.append(
            "<item><launchTemplateAndOverrides><overrides>"
            f"<instanceType>{escape(ov.get('InstanceType', ''))}</instanceType>"
            f"<availabilityZone>{escape(ov.get('AvailabilityZone', ''))}</availabilityZone>"
            f"<subnetId>{escape(ov.get('SubnetId', ''))}</subnetId>"
            "</overrides></launchTemplateAndOverrides><lifecycle>spot</lifecycle>"
            f"<errorCode>{code}</errorCode><errorMessage>no capacity (test layer)"
            "</errorMessage></item>")
    return ("<errorSet>" + "".join(items) + "</errorSet>").encode()


def _fleet_only_errors(errors: list[tuple[dict[str, str], str]]) -> bytes:
    return (b'<?xml version="1.0" encoding="UTF-8"?><CreateFleetResponse xmlns="'
            + EC2_NS.encode() + b'"><requestId>' + str(uuid.uuid4()).encode()
            + b"</requestId><fleetId>fleet-" + uuid.uuid4().hex[:17].encode()
            + b"</fleetId>" + _error_set(errors) + b"<fleetInstanceSet/></CreateFleetResponse>")
