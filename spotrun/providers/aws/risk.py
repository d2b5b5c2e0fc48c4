"""Live reclaim-risk evidence on AWS: the Spot Instance Advisor file and spot placement scores.

- The Spot Instance Advisor publishes one public JSON file (the data behind
  aws.amazon.com/ec2/spot/instance-advisor/): `ranges` (interruption-frequency buckets, each
  `{index, label, max}` with `max` the bucket's upper bound in percent) and
  `spot_advisor[region][os][type] = {"r": bucket index, "s": savings %}`. "Frequency of
  interruption" is the share of a type's spot capacity reclaimed in the trailing month. It is
  fetched at run time from a configurable URL and cached on disk for a max age; a failed fetch
  falls back to the stale cache, else to no advisor figure.
- `ec2.get_spot_placement_scores` scores 1-10 how likely a spot request for a type succeeds in
  each zone (SingleAvailabilityZone); one call per type so each type gets its own score, cached
  in memory for a max age (AWS limits how many distinct requests an account may make a day).
Both become `RiskHint`s per (type, zone) for `spotrun.costmodel.risk.risk_model`. Nothing here
ever raises to its caller: a failing source is logged and left out.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterable

from spotrun.costmodel.risk import RiskHint, region_of, traced_types

log = logging.getLogger(__name__)

ADVISOR_URL = "https://spot-bid-advisor.s3.amazonaws.com/spot-advisor-data.json"
ADVISOR_OS = "Linux"
# The top bucket (">20%", max 100 in the file) is open; it counts as this wide (10 points), so
# its midpoint stays near its neighbours' spacing instead of at 61%.
OPEN_BUCKET_WIDTH = 0.10
_CACHE_NAME = "spot-advisor-data.json"
# After a failed fetch, wait this long before the next try (a daemon plans every few seconds;
# an unreachable URL must not cost a timeout each time).
RETRY_AFTER_S = 600.0


class AdvisorFeed:
    """The advisor's JSON from `url`, fetched at most once per `max_age_s`, cached on disk."""

    def __init__(self, url: str = ADVISOR_URL, *, cache_dir: str | Path,
                 max_age_s: float = 86400.0, clock: Callable[[], float] = time.time,
                 timeout_s: float = 10.0) -> None:
        self.url = url
        self.cache_dir = Path(cache_dir)
        self.max_age_s = max_age_s
        self.clock = clock
        self.timeout_s = timeout_s
        # The real file is ~1-2 MB: parse it once per process, not at every plan.
        self._mem: tuple[dict[str, Any], float] | None = None
        self._failed_at: float | None = None

    @property
    def _body(self) -> Path:
        return self.cache_dir / _CACHE_NAME

    @property
    def _meta(self) -> Path:
        return self.cache_dir / (_CACHE_NAME + ".meta")

    def load(self) -> dict[str, Any] | None:
        """The parsed file: a fresh cache, else a fetch, else the stale cache, else None."""
        if self._mem is not None and self.clock() - self._mem[1] < self.max_age_s:
            return self._mem[0]
        cached, fetched_at = self._read_cache()
        if cached is not None and self.clock() - fetched_at < self.max_age_s:
            self._mem = (cached, fetched_at)
            return cached
        if self._failed_at is not None and self.clock() - self._failed_at < RETRY_AFTER_S:
            return cached
        try:
            data = self._fetch()
        except Exception as exc:  # noqa: BLE001 - any network/format failure: fall back
            self._failed_at = self.clock()
            log.warning("spot advisor: cannot fetch %s (%s); %s", self.url, exc,
                        "using the stale cache" if cached is not None else "no advisor figures")
            return cached
        self._failed_at = None
        return data

    def _read_cache(self) -> tuple[dict[str, Any] | None, float]:
        try:
            meta = json.loads(self._meta.read_text(encoding="utf-8"))
            if meta.get("url") != self.url:
                return None, 0.0
            return json.loads(self._body.read_text(encoding="utf-8")), float(meta["fetched_at"])
        except (OSError, ValueError, KeyError, TypeError):
            return None, 0.0

    def _fetch(self) -> dict[str, Any]:
        req = urllib.request.Request(self.url, headers={"User-Agent": "spotrun"})
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
            body = resp.read()
        data = json.loads(body)
        parse_ranges(data)          # refuse to cache a file of another shape
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        # Body first, then the meta that vouches for it: a crash leaves no fresh-looking junk.
        _atomic_write(self._body, body)
        meta = {"url": self.url, "fetched_at": self.clock()}
        _atomic_write(self._meta, json.dumps(meta).encode())
        self._mem = (data, meta["fetched_at"])
        return data


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def parse_ranges(data: dict[str, Any]) -> dict[int, tuple[float, float, str]]:
    """Bucket index -> (lo, hi, label) as monthly fractions; ValueError if the file is malformed."""
    raw = data.get("ranges") if isinstance(data, dict) else None
    if not isinstance(raw, list) or not raw or not isinstance(data.get("spot_advisor"), dict):
        raise ValueError("not a spot advisor file (needs `ranges` and `spot_advisor`)")
    out: dict[int, tuple[float, float, str]] = {}
    lo = 0.0
    for r in sorted(raw, key=lambda r: int(r["index"])):
        hi = float(r["max"]) / 100.0
        if hi >= 1.0:
            hi = lo + OPEN_BUCKET_WIDTH
        out[int(r["index"])] = (lo, hi, str(r.get("label", "")))
        lo = hi
    return out


def advisor_hints(data: dict[str, Any], instance_types: Iterable[str], zones: Iterable[str],
                  os_name: str = ADVISOR_OS) -> dict[tuple[str, str], RiskHint]:
    """Per (type, zone): the type's bucket in the zone's region, where the file has one."""
    ranges = parse_ranges(data)
    out: dict[tuple[str, str], RiskHint] = {}
    for zone in zones:
        region = region_of(zone)
        rows = ((data["spot_advisor"].get(region) or {}).get(os_name)) or {}
        for itype in instance_types:
            row = rows.get(itype)
            if not isinstance(row, dict) or row.get("r") not in ranges:
                continue
            lo, hi, label = ranges[row["r"]]
            out[(itype, zone)] = RiskHint(advisor_range=(lo, hi), advisor_label=label,
                                          origin=f"spot advisor {region} {os_name}")
    return out


PLACEMENT_PAGE_SIZE = 100    # scores per GetSpotPlacementScores page (EC2 allows 10 to 1000)


def placement_scores(pages: Callable[..., Iterable[dict[str, Any]]],
                     instance_types: Iterable[str], region: str,
                     zone_names: dict[str, str]) -> dict[tuple[str, str], int]:
    """Per (type, zone name): get_spot_placement_scores for one instance of that type alone.

    pages(method, **params): every response page of an EC2 call (a boto3 paginator's).
    """
    out: dict[tuple[str, str], int] = {}
    for itype in instance_types:
        for page in pages("get_spot_placement_scores", InstanceTypes=[itype], TargetCapacity=1,
                          SingleAvailabilityZone=True, RegionNames=[region],
                          PaginationConfig={"PageSize": PLACEMENT_PAGE_SIZE}):
            for s in page.get("SpotPlacementScores") or []:
                zone = zone_names.get(s.get("AvailabilityZoneId", ""))
                if zone and s.get("Score") is not None:
                    out[(itype, zone)] = int(s["Score"])
    return out


class AwsRisk:
    """Builds RiskHints for the aws provider; every failure is logged, never raised."""

    def __init__(self, *, call: Callable[..., Any], region: str, advisor: AdvisorFeed | None,
                 pages: Callable[..., Iterable[dict[str, Any]]] | None = None,
                 placement: bool = True, placement_max_age_s: float = 3600.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.call = call
        self.pages = pages          # every page of an EC2 call (placement scores need it)
        self.region = region
        self.advisor = advisor
        self.placement = placement and pages is not None
        self.placement_max_age_s = placement_max_age_s
        self.clock = clock
        self._scores: dict[str, tuple[float, dict[str, int]]] = {}   # type -> (at, zone -> score)
        self._zone_names: dict[str, str] | None = None

    def hints(self, instance_types: Iterable[str],
              zones: Iterable[str]) -> dict[tuple[str, str], RiskHint]:
        """Advisor bucket and placement score per (type, zone), for the risk model."""
        types, zones = list(dict.fromkeys(instance_types)), list(dict.fromkeys(zones))
        out: dict[tuple[str, str], RiskHint] = {}
        if self.advisor is not None:
            try:
                data = self.advisor.load()
                if data is not None:
                    # The traced types are the advisor's reference (its ratio scales the trace).
                    ref = list(dict.fromkeys(types + traced_types()))
                    out.update(advisor_hints(data, ref, zones))
            except Exception as exc:  # noqa: BLE001 - a malformed file must not stop a plan
                log.warning("spot advisor: unusable data (%s); no advisor figures", exc)
        if self.placement:
            try:
                for (itype, zone), score in self._placement(types, zones).items():
                    old = out.get((itype, zone), RiskHint())
                    out[(itype, zone)] = RiskHint(
                        advisor_range=old.advisor_range, advisor_label=old.advisor_label,
                        placement_score=score,
                        origin=", ".join(x for x in (old.origin, "placement score") if x))
            except Exception as exc:  # noqa: BLE001 - permissions, limits, network
                log.warning("spot placement scores: %s; none used", exc)
        return out

    def _placement(self, types: list[str], zones: list[str]) -> dict[tuple[str, str], int]:
        now = self.clock()
        stale = [t for t in types
                 if t not in self._scores or now - self._scores[t][0] >= self.placement_max_age_s]
        if stale:
            if self._zone_names is None:
                resp = self.call("describe_availability_zones")
                self._zone_names = {z["ZoneId"]: z["ZoneName"]
                                    for z in resp.get("AvailabilityZones", []) if z.get("ZoneId")}
            got = placement_scores(self.pages, stale, self.region, self._zone_names)
            for t in stale:
                self._scores[t] = (now, {z: s for (tt, z), s in got.items() if tt == t})
        want = set(zones)
        return {(t, z): s for t in types for z, s in self._scores[t][1].items() if z in want}
