"""Reclaim risk per pool (instance type x zone): a prior rate, and where each figure came from.

Sources, strongest first for a type's level and weakest for its zone shape (docs/cost-model.md,
"Reclaim risk per pool"):
1. trace: reclaims per hour of the type's family in the zone, from the sourced p3.2xlarge traces
   (spotrun/data/risk/reclaim_priors.yaml, made by tools/reclaim_priors.py); a family with no
   trace of its own borrows the nearest traced family, a zone with no trace its region's pool,
   else the family's whole pool.
2. advisor (AWS): the Spot Instance Advisor's interruption bucket of the type in the zone's
   region, taken relative to the traced type's bucket there: it scales the trace's zone shape
   to the type's level (the advisor's "share of instances interrupted in a month" and the
   trace's per-hour rate are different units; their ratio is not).
3. placement-score (AWS): get_spot_placement_scores 1-10 for the type in the zone, a bounded
   nudge (x2 at score 1 to x0.5 at score 10): a capacity signal, not a count of reclaims.
Torch-free, numpy-free and precomputed: `prior()` is dictionary lookups after the first call.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any


from spotrun.catalog import Catalog
from spotrun.yamlload import safe_load

# A prior counts as this many pseudo-reclaims against the pool's own record: weak on purpose
# (the traces are of another type, years old), so a pool's own reclaims take over after a few.
# It is the weight the ranking gave the zone prior before (one reclaim in one mean stretch).
# Keep it >= 1: mtbf_h divides by max(reclaims, 1).
PRIOR_RECLAIMS = 1.0
# The placement score moves the rate by at most this factor either way (score 1 / score 10).
PLACEMENT_MAX_FACTOR = 2.0
# Without any trace (an empty data file): the catalog's pooled preemption prior, else this.
FALLBACK_MTBF_H = 3.36
# The packaged priors a catalog reads unless its `reclaim_priors` key names another file.
DEFAULT_PRIORS_FILE = "reclaim_priors.yaml"
_DASH_ZONE = re.compile(r"(.+\d)-[a-z]")


@dataclass(frozen=True)
class RiskPrior:
    """A pool's prior reclaim rate as pseudo-exposure, with its source and one human line."""

    up_hours: float          # pseudo-exposure: the weight of this prior against observed history
    reclaims: float          # pseudo-reclaims in up_hours (mtbf_h = up_hours / max(reclaims, 1))
    source: str              # "trace" | "trace-nearest-family" | "default", then "+advisor"...
    detail: str              # one human line: which family, zone scope, files, factors

    @property
    def mtbf_h(self) -> float:
        """Mean hours between reclaims."""
        return self.up_hours / max(self.reclaims, 1.0)

    @property
    def reclaims_per_hour(self) -> float:
        """Expected reclaims per hour held (1 / mtbf_h)."""
        return 1.0 / self.mtbf_h if self.mtbf_h > 0 else math.inf

    def updated(self, run_hours: float, reclaims: float) -> "RiskPrior":
        """The posterior after the pool's own record (Gamma-Poisson: exposures and counts add)."""
        if run_hours <= 0 and reclaims <= 0:
            return self
        return RiskPrior(up_hours=self.up_hours + run_hours, reclaims=self.reclaims + reclaims,
                         source=self.source + "+observed",
                         detail=f"{self.detail}; observed {reclaims:g} reclaim(s) in "
                                f"{run_hours:.1f} h")


@dataclass(frozen=True)
class RiskHint:
    """Live, provider-specific evidence about one pool (type, zone); every field optional."""

    advisor_range: tuple[float, float] | None = None   # monthly interrupted share [lo, hi), 0-1
    advisor_label: str = ""                            # the advisor's own label, e.g. "<5%"
    placement_score: int | None = None                 # 1-10 from get_spot_placement_scores
    origin: str = ""                                   # e.g. "spot advisor us-east-1 Linux"

    @property
    def advisor_mid(self) -> float | None:
        """The advisor bucket's midpoint (monthly share interrupted), or None."""
        if self.advisor_range is None:
            return None
        lo, hi = self.advisor_range
        return (lo + hi) / 2.0


def family_of(instance_type: str) -> str:
    """The instance family: the name before its first '.' or '-' (g6e.xlarge -> g6e,
    a2-highgpu-1g -> a2, n1-standard-8+t4x1 -> n1)."""
    return re.split(r"[.-]", instance_type, maxsplit=1)[0]


def region_of(zone: str) -> str:
    """us-east-1f -> us-east-1 (region plus a letter); us-central1-a -> us-central1 (GCP's
    region, a dash and a letter)."""
    gcp = _DASH_ZONE.fullmatch(zone)
    if gcp:
        return gcp.group(1)
    return zone[:-1] if zone and zone[-1].isalpha() else zone


def packaged_trace_priors() -> dict[str, Any]:
    """spotrun/data/risk/reclaim_priors.yaml as a mapping (generated by tools/reclaim_priors.py)."""
    return packaged_priors(DEFAULT_PRIORS_FILE)


@lru_cache(maxsize=4)
def packaged_priors(name: str) -> dict[str, Any]:
    """spotrun/data/risk/<name> as a mapping (a catalog names its file in `reclaim_priors`)."""
    text = resources.files("spotrun.data").joinpath("risk", name).read_text("utf-8")
    return safe_load(text) or {}


def priors_for(catalog: Catalog) -> dict[str, Any]:
    """The packaged priors the catalog names (`reclaim_priors`), else reclaim_priors.yaml."""
    return packaged_priors(str(catalog.meta.get("reclaim_priors") or DEFAULT_PRIORS_FILE))


def traced_types(data: dict[str, Any] | None = None) -> list[str]:
    """The instance types the traces measured (the advisor's reference types)."""
    fams = (data if data is not None else packaged_trace_priors()).get("families") or {}
    return sorted({str(f["traced_type"]) for f in fams.values()})


@dataclass(frozen=True)
class _Pool:
    up_hours: float
    reclaims: int
    scope: str          # "in us-east-1f", "in us-east-1 pooled (...; no trace of us-east-1b)"
    files: str


class RiskModel:
    """Prior reclaim rate per (instance type, zone), built once from traces, catalog and hints."""

    def __init__(self, catalog: Catalog, data: dict[str, Any],
                 hints: dict[tuple[str, str], RiskHint] | None = None) -> None:
        self._sources = {k: str(v.get("file", k)) for k, v in (data.get("sources") or {}).items()}
        self._families: dict[str, dict[str, Any]] = dict(data.get("families") or {})
        self._hints = dict(hints or {})
        # Advisor buckets are per region; index them so any zone of the region finds them.
        self._advisor: dict[tuple[str, str], RiskHint] = {}
        for (itype, zone), h in self._hints.items():
            if h.advisor_mid is not None:
                self._advisor.setdefault((itype, region_of(zone)), h)
        self._features = _family_features(catalog)
        self._nearest = {fam: self._nearest_family(fam) for fam in self._features}
        self._default = _default_pool(catalog)
        self._memo: dict[tuple[str, str], RiskPrior] = {}

    # ------------------------------------------------------------ public

    def prior(self, instance_type: str, zone: str) -> RiskPrior:
        """The pool's prior: trace (or nearest family) x advisor ratio x placement nudge."""
        key = (instance_type, zone)
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = self._compute(instance_type, zone)
        return got

    def nearest_family(self, instance_type: str) -> tuple[str | None, str]:
        """(traced family used for this type, why); (None, reason) when nothing is traced."""
        fam = family_of(instance_type)
        if fam not in self._nearest:
            self._nearest[fam] = self._nearest_family(fam)
        return self._nearest[fam]

    # ------------------------------------------------------------ pieces

    def _compute(self, instance_type: str, zone: str) -> RiskPrior:
        fam = family_of(instance_type)
        src_fam, why = self.nearest_family(instance_type)
        if src_fam is None:
            rate = self._default.reclaims / self._default.up_hours
            source, detail = "default", f"no trace of any family: {self._default.scope}"
            ref_type = None
        else:
            pool = self._pool(src_fam, zone)
            rate = max(pool.reclaims, 1) / pool.up_hours
            detail = (f"{src_fam} family {pool.scope} from {pool.files}: "
                      f"{pool.reclaims} reclaims in {pool.up_hours:.1f} h")
            # A hand-written family (basis: estimate) says so in the source, not "trace".
            basis = str(self._families[src_fam].get("basis", "trace"))
            if src_fam == fam:
                source = basis
            else:
                source = f"{basis}-nearest-family"
                detail += f"; {fam} has no trace: nearest family {src_fam} ({why})"
            ref_type = str(self._families[src_fam]["traced_type"])
        rate, source, detail = self._advisor_scaled(instance_type, zone, ref_type, rate, source,
                                                    detail)
        hint = self._hints.get((instance_type, zone))
        if hint is not None and hint.placement_score is not None:
            score = min(max(int(hint.placement_score), 1), 10)
            factor = PLACEMENT_MAX_FACTOR ** ((5.5 - score) / 4.5)
            rate *= factor
            source += "+placement-score"
            detail += f"; placement score {score}/10 in {zone}: x{factor:.2f}"
        return RiskPrior(up_hours=PRIOR_RECLAIMS / rate, reclaims=PRIOR_RECLAIMS, source=source,
                         detail=detail)

    def _advisor_scaled(self, itype: str, zone: str, ref_type: str | None, rate: float,
                        source: str, detail: str) -> tuple[float, str, str]:
        region = region_of(zone)
        own = self._advisor.get((itype, region))
        if own is None or own.advisor_mid is None or ref_type is None or itype == ref_type:
            return rate, source, detail
        ref = self._advisor.get((ref_type, region))
        if ref is None or not ref.advisor_mid:
            return rate, source, detail + (f"; advisor {itype} {region} {own.advisor_label} "
                                           f"unused: no advisor bucket for {ref_type} there")
        factor = own.advisor_mid / ref.advisor_mid
        return (rate * factor, source + "+advisor",
                detail + f"; advisor {region}: {itype} {own.advisor_label} vs {ref_type} "
                         f"{ref.advisor_label}: x{factor:.2f}")

    def _pool(self, fam: str, zone: str) -> _Pool:
        f = self._families[fam]
        zones, regions = f.get("zones") or {}, f.get("regions") or {}
        if zone in zones:
            row = zones[zone]
            return _Pool(float(row["up_hours"]), int(row["reclaims"]), f"in {zone}",
                         self._files(set(row.get("parts") or {})))
        region = region_of(zone)
        traced_in = sorted(z for z in zones if region_of(z) == region)
        keys = {k for z in traced_in for k in (zones[z].get("parts") or {})}
        if region in regions:
            row = regions[region]
            scope = f"in {region} pooled ({', '.join(traced_in)}; no trace of {zone})"
        else:
            row = f["all"]
            keys = {k for z in zones.values() for k in (z.get("parts") or {})}
            scope = f"pooled over all traced zones (no trace in {region})"
        return _Pool(float(row["up_hours"]), int(row["reclaims"]), scope, self._files(keys))

    def _files(self, keys: set[str]) -> str:
        ordered = [k for k in self._sources if k in keys] + sorted(keys - set(self._sources))
        return ", ".join(self._sources.get(k, k) for k in ordered)

    def _nearest_family(self, fam: str) -> tuple[str | None, str]:
        """Nearest traced family; the rule is documented in docs/cost-model.md."""
        traced = sorted(self._families)
        if not traced:
            return None, "no traced family"
        if fam in self._families:
            return fam, "own trace"
        chip, cls, usd = self._features.get(fam, (None, fam[:1], None))
        same_gpu = [t for t in traced if chip and self._features.get(t, (None,))[0] == chip]
        if same_gpu:
            return self._closest(same_gpu, usd), f"same GPU {chip}"
        same_cls = [t for t in traced if t[:1] == cls]
        if same_cls:
            return self._closest(same_cls, usd), f"same instance class {cls}"
        if len(traced) == 1:
            return traced[0], "the only traced family"
        return self._closest(traced, usd), "closest on-demand $/GPU-h"

    def _closest(self, fams: list[str], usd: float | None) -> str:
        """Of fams, the one whose on-demand $/GPU-h is nearest usd (log ratio); else the first."""
        def dist(f: str) -> float:
            other = self._features.get(f, (None, None, None))[2]
            if usd is None or other is None or usd <= 0 or other <= 0:
                return math.inf
            return abs(math.log(other / usd))
        return min(fams, key=lambda f: (dist(f), f))


def _family_features(catalog: Catalog) -> dict[str, tuple[str, str, float | None]]:
    """Per family in the catalog: (GPU chip, class letter, cheapest on-demand $/GPU-h)."""
    out: dict[str, tuple[str, str, float | None]] = {}
    for t in catalog.types.values():
        fam = family_of(t.name)
        od = t.on_demand_price("us-east-1")
        per_gpu = od / t.gpus if od is not None and t.gpus > 0 else None
        chip = t.gpu.split("-", 1)[0]      # V100-32GB is a V100, A100-80GB an A100
        prev = out.get(fam)
        if prev is None or (per_gpu is not None and (prev[2] is None or per_gpu < prev[2])):
            out[fam] = (chip, fam[:1], per_gpu)
    return out


def _default_pool(catalog: Catalog) -> _Pool:
    raw = ((catalog.meta.get("preemption_priors") or {}).get("default")) or {}
    if raw.get("up_hours") and raw.get("reclaims"):
        return _Pool(float(raw["up_hours"]), int(raw["reclaims"]),
                     "the catalog's pooled preemption_priors.default", "catalog")
    return _Pool(FALLBACK_MTBF_H, 1, f"a fallback MTBF of {FALLBACK_MTBF_H} h", "-")


def risk_model(catalog: Catalog, *, hints: dict[tuple[str, str], RiskHint] | None = None,
               data: dict[str, Any] | None = None) -> RiskModel:
    """The reclaim-risk model: the catalog's packaged priors (or `data`), the catalog, hints."""
    if hints or data is not None:
        return RiskModel(catalog, data if data is not None else priors_for(catalog), hints)
    # Without hints the model is a function of the catalog alone: one per catalog, so its
    # memo of pool priors serves every decision (a team server's submits each built one).
    model = _PLAIN.get(id(catalog))
    if model is None or model[0] is not catalog:
        if len(_PLAIN) >= 16:   # catalogs made on the fly (tests, simulate): keep a few
            _PLAIN.clear()
        model = _PLAIN[id(catalog)] = (catalog, RiskModel(catalog, priors_for(catalog), None))
    return model[1]


_PLAIN: dict[int, tuple[Catalog, RiskModel]] = {}
