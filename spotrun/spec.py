"""The job spec (YAML): parsing and per-field validation.

Every error names the dotted field path and what is allowed; nothing here writes.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterable

import yaml

from spotrun.errors import SpecError
from spotrun.states import MarketPolicy

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SECRET_RE = re.compile(r"^(env:[A-Za-z_][A-Za-z0-9_]*|ssm:/\S+|secretsmanager:\S+)$")
PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8")
OPTIMIZERS = ("adamw", "adam", "sgd", "adafactor", "lion")
SHARDINGS = ("none", "fsdp")
MAX_MULTI_NODE = 64  # the local path runs multi-node end to end (issue 16)


@dataclass(frozen=True)
class Resources:
    """What each node needs, and where it may run."""

    gpus: int = 1                   # GPUs used per node: exactly this many (the range's low end)
    nodes: int = 1
    gpu_memory_gb: float | None = None
    instance_types: tuple[str, ...] = ()
    zones: tuple[str, ...] = ()
    gpus_max: int | None = None     # a range "MIN-MAX": the plan picks the count per type
    nodes_min: int | None = None    # elastic "MIN-MAX": nodes is MAX (launched), MIN keeps running

    def gpu_counts(self, node_gpus: int) -> list[int]:
        """The GPU counts per node the job may use on a node with node_gpus GPUs."""
        hi = min(self.gpus_max or self.gpus, node_gpus)
        return list(range(self.gpus, hi + 1))

    def gpus_text(self) -> str:
        """`8`, or `1-8` for a range (as the spec says it)."""
        return f"{self.gpus}-{self.gpus_max}" if self.gpus_max else str(self.gpus)

    def nodes_text(self) -> str:
        """`2`, or `1-2` for an elastic range (as the spec says it)."""
        return f"{self.nodes_min}-{self.nodes}" if self.nodes_min else str(self.nodes)

    @property
    def min_nodes(self) -> int:
        """The fewest nodes the job runs on (all of them unless elastic)."""
        return self.nodes_min or self.nodes


@dataclass(frozen=True)
class ModelSpec:
    """What the model is, for memory feasibility."""

    params_billion: float | None = None
    precision: str = "bf16"
    optimizer: str = "adamw"
    sharding: str = "none"


@dataclass(frozen=True)
class WorkSpec:
    """How much work the job is: steps, and/or hours on a reference instance."""

    total_steps: int | None = None
    reference_hours: float | None = None
    reference_instance: str | None = None
    scaling: tuple[tuple[int, float], ...] = ()   # ((gpus, speedup), ...); () = catalog default


@dataclass(frozen=True)
class CheckpointSpec:
    """Where and how often checkpoints go."""

    uri: str | None = None
    interval_minutes: float | None = None   # None = auto (Young/Daly)
    keep: int = 3


@dataclass(frozen=True)
class PolicySpec:
    """Market, deadline and money limits."""

    market: MarketPolicy = MarketPolicy.AUTO
    deadline: str | None = None            # ISO-8601 UTC, resolved at submit
    budget_usd: float | None = None
    max_price_usd_per_hour: float | None = None
    max_restarts_on_error: int = 3


@dataclass(frozen=True)
class JobSpec:
    """A validated job spec."""

    name: str
    command: str
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)
    resources: Resources = field(default_factory=Resources)
    model: ModelSpec = field(default_factory=ModelSpec)
    work: WorkSpec = field(default_factory=WorkSpec)
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    policy: PolicySpec = field(default_factory=PolicySpec)
    outputs: tuple[str, ...] = ()   # paths/globs relative to the job's directory

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able mapping that `spec_from_dict` reads back."""
        d = asdict(self)
        d["policy"]["market"] = self.policy.market.value
        d["resources"]["instance_types"] = list(self.resources.instance_types)
        d["resources"]["zones"] = list(self.resources.zones)
        d["outputs"] = list(self.outputs)
        return d


def job_spec(job: Any) -> JobSpec:
    """A stored job's spec, its deadline on the provider's clock once the daemon fixed it."""
    spec = spec_from_dict(job.spec)
    deadline_at = getattr(job, "deadline_at", None)
    if deadline_at is not None and spec.policy.deadline is not None:
        spec = replace(spec, policy=replace(spec.policy, deadline=deadline_at.isoformat()))
    return spec


def spec_from_dict(d: dict[str, Any]) -> JobSpec:
    """Rebuild a JobSpec stored with `to_dict` (no validation: it was validated at submit)."""
    r = dict(d["resources"])
    r["instance_types"] = tuple(r.get("instance_types") or ())
    r["zones"] = tuple(r.get("zones") or ())
    w = dict(d["work"])
    w["scaling"] = tuple((int(n), float(v)) for n, v in (w.get("scaling") or ()))
    p = dict(d["policy"])
    p["market"] = MarketPolicy(p["market"])
    return JobSpec(name=d["name"], command=d["command"], workdir=d.get("workdir"),
                   env=dict(d.get("env") or {}), secrets=dict(d.get("secrets") or {}),
                   resources=Resources(**r), model=ModelSpec(**d["model"]),
                   work=WorkSpec(**w), checkpoint=CheckpointSpec(**d["checkpoint"]),
                   policy=PolicySpec(**p), outputs=tuple(d.get("outputs") or ()))


# ---------------------------------------------------------------- loading

def load_spec_file(path: str | Path, *, instance_types: Iterable[str], zones: Iterable[str],
                   now: datetime | None = None) -> JobSpec:
    """Read and validate a YAML job spec file."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise SpecError(f"cannot read {p}: {exc.strerror}", field="file", value=str(p)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError("file is not UTF-8 text", field="file", value=str(p)) from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise SpecError(f"not valid YAML{where}", field="file", value=str(p)) from None
    return parse_spec(raw, base_dir=p.resolve().parent, instance_types=instance_types,
                      zones=zones, now=now)


def parse_spec(raw: Any, *, base_dir: Path, instance_types: Iterable[str], zones: Iterable[str],
               now: datetime | None = None) -> JobSpec:
    """Validate a decoded spec mapping; raises SpecError naming the field."""
    now = now or datetime.now(timezone.utc)
    types = set(instance_types)
    zone_set = set(zones)
    top = _mapping(raw, "spec", {"name", "command", "workdir", "env", "secrets", "resources",
                                 "model", "work", "checkpoint", "policy", "outputs"})
    name = _req(top, "name", "spec")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise SpecError("must match ^[a-z0-9][a-z0-9-]{0,62}$ (lower-case letters, digits, '-')",
                        field="name", value=name)
    command = _req(top, "command", "spec")
    if not isinstance(command, str) or not command.strip():
        raise SpecError("must be a non-empty string", field="command", value=command)

    workdir = None
    if top.get("workdir") is not None:
        wd = top["workdir"]
        if not isinstance(wd, str) or not wd:
            raise SpecError("must be a path string", field="workdir", value=wd)
        wpath = (base_dir / wd).resolve()
        if not wpath.is_dir():
            raise SpecError(f"must be an existing directory; {wpath} is "
                            f"{'a file' if wpath.exists() else 'missing'}", field="workdir",
                            value=wd)
        workdir = str(wpath)

    env = _str_map(top.get("env"), "env", ENV_KEY_RE, None)
    secrets = _str_map(top.get("secrets"), "secrets", ENV_KEY_RE, SECRET_RE)

    resources = _resources(top.get("resources"), types, zone_set)
    model = _model(top.get("model"))
    work = _work(top.get("work"), types)
    checkpoint = _checkpoint(top.get("checkpoint"))
    policy = _policy(top.get("policy"), now)
    outputs = _outputs(top.get("outputs"))
    return JobSpec(name=name, command=command, workdir=workdir, env=env, secrets=secrets,
                   resources=resources, model=model, work=work, checkpoint=checkpoint,
                   policy=policy, outputs=outputs)


# ---------------------------------------------------------------- sections

def _resources(raw: Any, types: set[str], zones: set[str]) -> Resources:
    m = _mapping(raw, "resources", {"gpus", "nodes", "gpu_memory_gb", "instance_types", "zones"})
    gpus, gpus_max = _count_or_range(m, "gpus")
    nodes_min, nodes = _count_or_range(m, "nodes")
    if nodes_min and not nodes:
        nodes_min, nodes = None, nodes_min
    if nodes > MAX_MULTI_NODE:
        raise SpecError("multi-node jobs are not supported yet; allowed: 1", field="resources.nodes",
                        value=nodes, hint="run on one node with more GPUs per node")
    mem = _num(m, "gpu_memory_gb", "resources", None, positive=True)
    itypes = _str_list(m.get("instance_types"), "resources.instance_types")
    for i, t in enumerate(itypes):
        if t not in types:
            raise SpecError(f"unknown instance type {t!r}; allowed: a catalog type such as "
                            f"{', '.join(sorted(types)[:4])}, ...",
                            field=f"resources.instance_types[{i}]", value=t)
    zl = _str_list(m.get("zones"), "resources.zones")
    for i, z in enumerate(zl):
        if z not in zones:
            raise SpecError(f"unknown zone {z!r}; allowed: {', '.join(sorted(zones))}",
                            field=f"resources.zones[{i}]", value=z)
    return Resources(gpus=gpus, nodes=nodes, gpu_memory_gb=mem, instance_types=tuple(itypes),
                     zones=tuple(zl), gpus_max=gpus_max, nodes_min=nodes_min)


COUNT_RANGE_RE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


def _count_or_range(m: dict[str, Any], key: str) -> tuple[int, int | None]:
    """resources.gpus / resources.nodes: an integer 1-64, or a range "MIN-MAX" -> (MIN, MAX).

    A plain integer N gives (N, None).
    """
    raw, path = m.get(key), f"resources.{key}"
    if isinstance(raw, str):
        hit = COUNT_RANGE_RE.match(raw)
        lo, hi = (int(hit.group(1)), int(hit.group(2))) if hit else (0, 0)
        if not hit or not 1 <= lo < hi <= 64:
            raise SpecError('allowed: an integer 1-64, or a range "MIN-MAX" with 1 <= MIN < MAX '
                            '<= 64', field=path, value=raw)
        return lo, hi
    if raw is not None and (not isinstance(raw, int) or isinstance(raw, bool)
                            or not 1 <= raw <= 64):
        raise SpecError('allowed: an integer 1-64, or a range "MIN-MAX"', field=path, value=raw)
    return (1 if raw is None else raw), None


def _model(raw: Any) -> ModelSpec:
    m = _mapping(raw, "model", {"params_billion", "precision", "optimizer", "sharding"})
    if m and "params_billion" not in m:
        raise SpecError("is required when model is given; allowed: a number > 0",
                        field="model.params_billion")
    params = _num(m, "params_billion", "model", None, positive=True)
    return ModelSpec(params_billion=params,
                     precision=_choice(m, "precision", "model", PRECISIONS, "bf16"),
                     optimizer=_choice(m, "optimizer", "model", OPTIMIZERS, "adamw"),
                     sharding=_choice(m, "sharding", "model", SHARDINGS, "none"))


def _work(raw: Any, types: set[str]) -> WorkSpec:
    m = _mapping(raw, "work", {"total_steps", "reference_hours", "reference_instance", "scaling"})
    steps = _int(m, "total_steps", "work", 1, None, None)
    hours = _num(m, "reference_hours", "work", None, positive=True)
    ref = m.get("reference_instance")
    if ref is not None and (not isinstance(ref, str) or ref not in types):
        raise SpecError("must be an instance type in the catalog", field="work.reference_instance",
                        value=ref)
    if (hours is None) != (ref is None):
        missing = "work.reference_instance" if ref is None else "work.reference_hours"
        raise SpecError("reference_hours and reference_instance go together", field=missing)
    return WorkSpec(total_steps=steps, reference_hours=hours, reference_instance=ref,
                    scaling=_scaling(m.get("scaling")))


def _scaling(raw: Any) -> tuple[tuple[int, float], ...]:
    """work.scaling: {gpus: speedup over one GPU}, overriding the catalog's curve."""
    if raw is None:
        return ()
    ok = isinstance(raw, dict) and raw and all(
        isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= 1024
        and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
        for k, v in raw.items())
    if not ok:
        raise SpecError("allowed: a mapping {gpus 1-1024: speedup > 0}, e.g. {1: 1.0, 8: 6.5}",
                        field="work.scaling", value=raw)
    return tuple(sorted((int(k), float(v)) for k, v in raw.items()))


def _checkpoint(raw: Any) -> CheckpointSpec:
    m = _mapping(raw, "checkpoint", {"uri", "interval_minutes", "keep"})
    uri = m.get("uri")
    if uri is not None:
        ok = isinstance(uri, str) and (
            re.match(r"^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/[^\s]*)?$", uri)
            or re.match(r"^file:///[^\s]*$", uri))
        if not ok:
            raise SpecError("allowed: s3://bucket/prefix or file:///absolute/path",
                            field="checkpoint.uri", value=uri)
        if ".." in uri.split("/"):
            raise SpecError("must not contain '..'", field="checkpoint.uri", value=uri)
    interval = m.get("interval_minutes", "auto")
    if interval == "auto":
        interval_val = None
    elif isinstance(interval, (int, float)) and not isinstance(interval, bool) \
            and math.isfinite(interval) and interval > 0:
        interval_val = float(interval)
    else:
        raise SpecError("allowed: a number > 0 or 'auto'", field="checkpoint.interval_minutes",
                        value=interval)
    keep = _int(m, "keep", "checkpoint", 1, None, 3)
    return CheckpointSpec(uri=uri, interval_minutes=interval_val, keep=keep)


def _policy(raw: Any, now: datetime) -> PolicySpec:
    m = _mapping(raw, "policy", {"market", "deadline", "deadline_hours", "budget_usd",
                                 "max_price_usd_per_hour", "max_restarts_on_error"})
    market = MarketPolicy(_choice(m, "market", "policy", tuple(p.value for p in MarketPolicy),
                                  "auto"))
    if "deadline" in m and "deadline_hours" in m:
        raise SpecError("give deadline or deadline_hours, not both", field="policy.deadline")
    deadline = None
    if "deadline" in m:
        d = m["deadline"]
        when = d if isinstance(d, datetime) else None
        if isinstance(d, str):
            try:
                when = datetime.fromisoformat(d.replace("Z", "+00:00"))
            except ValueError:
                when = None
        if when is None:
            raise SpecError("allowed: an ISO-8601 time such as 2030-01-31T12:00:00Z",
                            field="policy.deadline", value=d)
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        if when <= now:
            raise SpecError("is in the past; allowed: a time in the future",
                            field="policy.deadline", value=str(d))
        deadline = when.astimezone(timezone.utc).isoformat()
    hours = _num(m, "deadline_hours", "policy", None, positive=True)
    if hours is not None:
        deadline = (now + timedelta(hours=hours)).astimezone(timezone.utc).isoformat()
    return PolicySpec(
        market=market, deadline=deadline,
        budget_usd=_num(m, "budget_usd", "policy", None, positive=True),
        max_price_usd_per_hour=_num(m, "max_price_usd_per_hour", "policy", None, positive=True),
        max_restarts_on_error=_int(m, "max_restarts_on_error", "policy", 0, 100, 3))


# ---------------------------------------------------------------- primitives

def _mapping(raw: Any, path: str, allowed: set[str]) -> dict[str, Any]:
    if raw is None:
        if path == "spec":
            raise SpecError("the file is empty; allowed: a mapping with name and command",
                            field="spec")
        return {}
    if not isinstance(raw, dict):
        raise SpecError(f"must be a mapping, got {type(raw).__name__}", field=path)
    for key in raw:
        if not isinstance(key, str) or key not in allowed:
            where = key if path == "spec" else f"{path}.{key}"
            raise SpecError(f"unknown field; allowed here: {', '.join(sorted(allowed))}",
                            field=str(where), value=key)
    return raw


def _req(m: dict[str, Any], key: str, path: str) -> Any:
    if key not in m or m[key] is None:
        raise SpecError("is required", field=key if path == "spec" else f"{path}.{key}")
    return m[key]


def _int(m: dict[str, Any], key: str, path: str, lo: int | None, hi: int | None,
         default: int | None) -> Any:
    if key not in m:
        return default
    v = m[key]
    rng = f"{lo}-{hi}" if hi is not None else f">= {lo}"
    if not isinstance(v, int) or isinstance(v, bool) or (lo is not None and v < lo) \
            or (hi is not None and v > hi):
        raise SpecError(f"allowed: an integer {rng}", field=f"{path}.{key}", value=v)
    return v


def _num(m: dict[str, Any], key: str, path: str, default: float | None, *,
         positive: bool) -> float | None:
    if key not in m:
        return default
    v = m[key]
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) \
            or (positive and v <= 0):
        raise SpecError("allowed: a number > 0", field=f"{path}.{key}", value=v)
    return float(v)


def _choice(m: dict[str, Any], key: str, path: str, allowed: tuple[str, ...], default: str) -> str:
    if key not in m:
        return default
    v = m[key]
    if v not in allowed:
        raise SpecError(f"allowed: {', '.join(allowed)}", field=f"{path}.{key}", value=v)
    return v


def _str_list(raw: Any, path: str) -> list[str]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(x, str) and x for x in raw):
        raise SpecError("allowed: a list of strings", field=path, value=raw)
    return list(raw)


def _outputs(raw: Any) -> tuple[str, ...]:
    paths = _str_list(raw, "outputs")
    for i, v in enumerate(paths):
        parts = v.replace("\\", "/").split("/")
        if v.startswith(("/", "~")) or ".." in parts:
            raise SpecError("allowed: paths or globs relative to the job's directory, no '..'",
                            field=f"outputs[{i}]", value=v)
    return tuple(paths)


def _str_map(raw: Any, path: str, key_re: re.Pattern[str], val_re: re.Pattern[str] | None
             ) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SpecError("must be a mapping of string to string", field=path)
    out: dict[str, str] = {}
    for k, v in raw.items():
        if not isinstance(k, str) or not key_re.match(k):
            raise SpecError("key must match [A-Za-z_][A-Za-z0-9_]*", field=f"{path}.{k}", value=k)
        if not isinstance(v, str):
            # YAML reads `A: 3` as a number and `A: yes` as true; the process sees strings.
            raise SpecError(f"allowed: a string (quote it: {k}: '{v}')" if path == "env"
                            else "allowed: a string", field=f"{path}.{k}",
                            value=v if path == "env" else "<redacted>")
        if val_re is not None and not val_re.match(v):
            raise SpecError("allowed: env:NAME, ssm:/path or secretsmanager:NAME",
                            field=f"{path}.{k}", value="<redacted>")
        out[k] = v
    return out
