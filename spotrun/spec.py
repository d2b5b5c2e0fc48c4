"""The job spec (YAML): typed dataclasses, validated per field by pydantic.

Every error names the dotted field path and what is allowed; nothing here writes. The
dataclasses are the stored form too: `to_dict` writes it, `spec_from_dict` reads it back.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Annotated, Any, Callable, Iterable, Literal, get_args

import yaml
from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, Strict, ValidationInfo

from spotrun.contracts import adapter, fail, field_names, validate
from spotrun.errors import SpecError
from spotrun.states import MarketPolicy
from spotrun.yamlload import safe_load

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SECRET_RE = re.compile(r"^(env:[A-Za-z_][A-Za-z0-9_]*|ssm:/\S+|secretsmanager:\S+)$")
COUNT_RANGE_RE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")
CHECKPOINT_URI_RE = re.compile(
    r"^((s3|gs)://[a-z0-9][a-z0-9._\-]{1,61}[a-z0-9](/[^\s]*)?|file:///[^\s]*)$")
Precision = Literal["fp32", "tf32", "fp16", "bf16", "fp8"]
Optimizer = Literal["adamw", "adam", "sgd", "adafactor", "lion"]
Sharding = Literal["none", "fsdp"]
PRECISIONS, OPTIMIZERS, SHARDINGS = get_args(Precision), get_args(Optimizer), get_args(Sharding)
_STRICT = ConfigDict(extra="forbid")


# ---------------------------------------------------------------- validators

def _known(kind: str, message: Callable[[str, Any, Any], str]) -> AfterValidator:
    """A name that must be in the submit-time context's set (no context: a stored spec).

    message(value, allowed, context) says what is wrong and what is allowed.
    """
    def check(value: str, info: ValidationInfo) -> str:
        allowed = (info.context or {}).get(kind)
        if allowed is not None and value not in allowed:
            raise fail(message(value, allowed, info.context))
        return value
    return AfterValidator(check)


def _not_in_catalog(value: str, types: Iterable[str], context: dict[str, Any]) -> str:
    """An unknown type's message: the catalog in use, and the closest names or a few."""
    names = list(types)
    close = difflib.get_close_matches(value, names, n=3, cutoff=0.6)
    if close:
        some = "closest: " + ", ".join(close)
    else:
        # One of each family (a2-, g2-, p4d., ...), in catalog order: the smallest first.
        family: dict[str, str] = {}
        for name in names:
            family.setdefault(re.split(r"[.-]", name, maxsplit=1)[0], name)
        some = "e.g. " + ", ".join(list(family.values())[:5])
    catalog = context.get("catalog") or "the catalog"
    return (f"unknown instance type {value!r}: not in {catalog}; allowed: one of its "
            f"{len(names)} types, {some}")


_CATALOG_TYPE = _known("types", _not_in_catalog)
_ZONE = _known("zones", lambda v, zones, _: (
    f"unknown zone {v!r}; allowed: {', '.join(sorted(zones))}"))
_REFERENCE = _known("types", _not_in_catalog)
_CLOUD = _known("clouds", lambda v, clouds, _: (
    f"cloud {v!r} is not configured here; allowed: {', '.join(clouds)} (settings `providers`)"))


def _workdir(value: str, info: ValidationInfo) -> str:
    ctx = info.context
    if ctx is None:
        return value
    path = (ctx["base_dir"] / value).resolve()
    if not path.is_dir():
        raise fail(f"must be an existing directory; {path} is "
                   f"{'a file' if path.exists() else 'missing'}")
    return str(path)


def _str_list(raw: Any) -> Any:
    """None is empty; else a list of non-empty strings (a tuple when rebuilt in code)."""
    if raw is None:
        return ()
    if not isinstance(raw, (list, tuple)) or not all(isinstance(x, str) and x for x in raw):
        raise fail("allowed: a list of strings")
    return tuple(raw)


def _relative(value: str) -> str:
    parts = value.replace("\\", "/").split("/")
    if value.startswith(("/", "~")) or ".." in parts:
        raise fail("allowed: paths or globs relative to the job's directory, no '..'")
    return value


def _checkpoint_uri(value: str) -> str:
    if not CHECKPOINT_URI_RE.match(value):
        raise fail("allowed: s3://bucket/prefix, gs://bucket/prefix or file:///absolute/path")
    if ".." in value.split("/"):
        raise fail("must not contain '..'")
    return value


def _env_in(raw: Any) -> Any:
    # YAML reads `A: 3` as a number and `A: yes` as true; the process sees strings.
    for key, value in (raw.items() if isinstance(raw, dict) else ()):
        if isinstance(value, (bool, int, float)):
            raise fail(f"allowed: a string (quote it: {key}: '{value}')", key)
    return {} if raw is None else raw


def _empty_if_none(raw: Any) -> Any:
    return {} if raw is None else raw


def _auto(raw: Any) -> Any:
    return None if raw == "auto" else raw


# ---------------------------------------------------------------- field types

Positive = Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False,
                                            description="a number > 0")]
Count = Annotated[int, Strict(), Field(ge=1, le=64, description=(
    'an integer 1-64, or a range "MIN-MAX"'))]
EnvKey = Annotated[str, Strict(), Field(pattern=ENV_KEY_RE.pattern)]
Name = Annotated[str, Strict(), Field(pattern=NAME_RE.pattern, description=(
    "^[a-z0-9][a-z0-9-]{0,62}$ (lower-case letters, digits, '-')"))]
Command = Annotated[str, Strict(), Field(pattern=r"\S", description="a non-empty string")]
Workdir = Annotated[str, Strict(), Field(min_length=1, description="a path string"),
                    AfterValidator(_workdir)]
Env = Annotated[dict[EnvKey, Annotated[str, Strict()]], BeforeValidator(_env_in),
                Field(description="a string (quote numbers and yes/no)")]
Secrets = Annotated[
    dict[EnvKey, Annotated[str, Strict(), Field(pattern=SECRET_RE.pattern)]],
    BeforeValidator(_empty_if_none),
    Field(description="env:NAME, ssm:/path or secretsmanager:NAME")]
InstanceTypes = Annotated[tuple[Annotated[str, _CATALOG_TYPE], ...],
                          BeforeValidator(_str_list)]
Zones = Annotated[tuple[Annotated[str, _ZONE], ...], BeforeValidator(_str_list)]
Clouds = Annotated[tuple[Annotated[str, Strict(), _CLOUD], ...], BeforeValidator(_str_list)]
Outputs = Annotated[tuple[Annotated[str, AfterValidator(_relative)], ...],
                    BeforeValidator(_str_list)]
# What Lightning writes by default (logs, ModelCheckpoint's files); integrations register more.
DEFAULT_PERSIST = ("lightning_logs",)


def _count_range(raw: str, key: str) -> tuple[int, int]:
    """resources.gpus / resources.nodes given as "MIN-MAX"."""
    hit = COUNT_RANGE_RE.match(raw)
    lo, hi = (int(hit.group(1)), int(hit.group(2))) if hit else (0, 0)
    if not 1 <= lo < hi <= 64:
        raise fail('allowed: an integer 1-64, or a range "MIN-MAX" with 1 <= MIN < MAX <= 64',
                   key)
    return lo, hi


def _resources_in(raw: Any, info: ValidationInfo) -> Any:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        return raw
    m = dict(raw)
    for key in Resources._stored_only if info.context is not None else ():
        if key in m:   # the stored form of a range: the spec says "MIN-MAX"
            raise fail(f"unknown field; allowed here: {', '.join(field_names(Resources))}", key)
    if isinstance(m.get("gpus"), str):
        m["gpus"], m["gpus_max"] = _count_range(m["gpus"], "gpus")
    if isinstance(m.get("nodes"), str):
        m["nodes_min"], m["nodes"] = _count_range(m["nodes"], "nodes")
    return m


def _model_in(raw: Any) -> Any:
    if isinstance(raw, dict) and raw and "params_billion" not in raw:
        raise fail("is required when model is given; allowed: a number > 0", "params_billion")
    return {} if raw is None else raw


_SCALING = dict[Annotated[int, Strict(), Field(ge=1, le=1024)],
                Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]]


def _scaling_in(raw: Any, info: ValidationInfo) -> Any:
    """work.scaling: {gpus: speedup over one GPU}, stored as sorted ((gpus, speedup), ...)."""
    if raw is None:
        return ()
    if isinstance(raw, (list, tuple)) and info.context is None:
        return tuple((int(n), float(v)) for n, v in raw)
    try:
        if not isinstance(raw, dict) or not raw:
            raise ValueError(raw)
        return tuple(sorted(adapter(_SCALING).validate_python(raw).items()))
    except ValueError:
        raise fail("allowed: a mapping {gpus 1-1024: speedup > 0}, e.g. {1: 1.0, 8: 6.5}") \
            from None


def _work_pairs(work: WorkSpec) -> WorkSpec:
    if (work.reference_hours is None) != (work.reference_instance is None):
        missing = "reference_instance" if work.reference_instance is None else "reference_hours"
        raise fail("reference_hours and reference_instance go together", missing)
    return work


def _policy_in(raw: Any, info: ValidationInfo) -> Any:
    """deadline_hours becomes deadline; a deadline given at submit must be in the future."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        return raw
    m, ctx = dict(raw), info.context
    if "deadline" in m and "deadline_hours" in m:
        raise fail("give deadline or deadline_hours, not both", "deadline")
    now = (ctx or {}).get("now") or datetime.now(timezone.utc)
    if "deadline_hours" in m:
        try:
            hours = adapter(Positive).validate_python(m.pop("deadline_hours"))
        except ValueError:
            raise fail("allowed: a number > 0", "deadline_hours") from None
        m["deadline"] = (now + timedelta(hours=hours)).astimezone(timezone.utc).isoformat()
    elif ctx is not None and "deadline" in m:
        m["deadline"] = _future(m["deadline"], now)
    return m


def _future(raw: Any, now: datetime) -> str:
    when = raw if isinstance(raw, datetime) else None
    if isinstance(raw, str):
        try:
            when = datetime.fromisoformat(raw.replace("Z", "+00:00"))
        except ValueError:
            when = None
    if when is None:
        raise fail("allowed: an ISO-8601 time such as 2030-01-31T12:00:00Z", "deadline")
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    if when <= now:
        raise fail("is in the past; allowed: a time in the future", "deadline")
    return when.astimezone(timezone.utc).isoformat()


# ---------------------------------------------------------------- the spec

@dataclass(frozen=True)
class Resources:
    """What each node needs, and where it may run."""

    __pydantic_config__ = _STRICT
    _stored_only = ("gpus_max", "nodes_min")   # the spec writes these as "MIN-MAX"

    gpus: Count = 1                 # GPUs used per node: exactly this many (the range's low end)
    nodes: Count = 1
    gpu_memory_gb: Positive | None = None
    instance_types: InstanceTypes = ()
    zones: Zones = ()
    clouds: Clouds = ()             # the providers it may run on; () = every one configured
    gpus_max: Count | None = None   # a range "MIN-MAX": the plan picks the count per type
    nodes_min: Count | None = None  # elastic "MIN-MAX": nodes is MAX (launched), MIN keeps running

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

    __pydantic_config__ = _STRICT

    params_billion: Positive | None = None
    precision: Annotated[Precision, Field(description=", ".join(PRECISIONS))] = "bf16"
    optimizer: Annotated[Optimizer, Field(description=", ".join(OPTIMIZERS))] = "adamw"
    sharding: Annotated[Sharding, Field(description=", ".join(SHARDINGS))] = "none"


@dataclass(frozen=True)
class WorkSpec:
    """How much work the job is: steps, and/or hours on a reference instance."""

    __pydantic_config__ = _STRICT

    total_steps: Annotated[int, Strict(), Field(ge=1, description="an integer >= 1")] | None = None
    reference_hours: Positive | None = None
    reference_instance: Annotated[str, Strict(), _REFERENCE, Field(
        description="an instance type in the catalog")] | None = None
    # ((gpus, speedup), ...); () = catalog default
    scaling: Annotated[tuple[tuple[int, float], ...], BeforeValidator(_scaling_in)] = ()


@dataclass(frozen=True)
class CheckpointSpec:
    """Where and how often checkpoints go."""

    __pydantic_config__ = _STRICT

    uri: Annotated[str, Strict(), AfterValidator(_checkpoint_uri), Field(
        description="s3://bucket/prefix, gs://bucket/prefix or file:///absolute/path")] | None = None
    interval_minutes: Annotated[Positive | None, BeforeValidator(_auto), Field(
        description="a number > 0 or 'auto'")] = None   # None = auto (Young/Daly)
    keep: Annotated[int, Strict(), Field(ge=1, description="an integer >= 1")] = 3


@dataclass(frozen=True)
class PolicySpec:
    """Market, deadline and money limits."""

    __pydantic_config__ = _STRICT
    _input_only = ("deadline_hours",)   # becomes deadline at submit

    market: Annotated[MarketPolicy, Field(description=", ".join(p.value for p in MarketPolicy))
                      ] = MarketPolicy.AUTO
    deadline: Annotated[str, Strict()] | None = None   # ISO-8601 UTC, resolved at submit
    budget_usd: Positive | None = None
    max_price_usd_per_hour: Positive | None = None
    max_restarts_on_error: Annotated[int, Strict(), Field(ge=0, le=100, description=(
        "an integer 0-100"))] = 3


@dataclass(frozen=True)
class JobSpec:
    """A validated job spec."""

    __pydantic_config__ = _STRICT

    name: Name
    command: Command
    # Whose money: the project budget it spends from (docs/budgets.md); also a cloud tag.
    project: Name = "default"
    workdir: Workdir | None = None
    env: Env = field(default_factory=dict)
    secrets: Secrets = field(default_factory=dict)
    resources: Annotated[Resources, BeforeValidator(_resources_in)] = field(
        default_factory=Resources)
    model: Annotated[ModelSpec, BeforeValidator(_model_in)] = field(default_factory=ModelSpec)
    work: Annotated[WorkSpec, BeforeValidator(_empty_if_none), AfterValidator(_work_pairs)] = \
        field(default_factory=WorkSpec)
    checkpoint: Annotated[CheckpointSpec, BeforeValidator(_empty_if_none)] = field(
        default_factory=CheckpointSpec)
    policy: Annotated[PolicySpec, BeforeValidator(_policy_in)] = field(
        default_factory=PolicySpec)
    outputs: Outputs = ()   # paths/globs relative to the job's directory
    # Saved with every checkpoint and restored before the command starts on the next
    # instance (docs/job-spec.md, "persist"); None: DEFAULT_PERSIST plus `outputs`.
    persist: Outputs | None = None

    def persist_patterns(self) -> list[str]:
        """The globs the job's checkpoints carry (framework integrations add their own)."""
        chosen = (*DEFAULT_PERSIST, *self.outputs) if self.persist is None else self.persist
        return list(dict.fromkeys(chosen))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able mapping that `spec_from_dict` reads back."""
        out = adapter(JobSpec).dump_python(self, mode="json")
        if out.get("persist") is None:
            out.pop("persist", None)   # the default: stored specs keep their older form
        if out.get("project") == "default":
            out.pop("project")         # likewise
        if not (out.get("resources") or {}).get("clouds", True):
            out["resources"].pop("clouds")   # likewise: every cloud configured
        return out


def job_spec(job: Any) -> JobSpec:
    """A stored job's spec, its deadline on the provider's clock once the daemon fixed it."""
    spec = spec_from_dict(job.spec)
    deadline_at = job.deadline_at
    if deadline_at is not None and spec.policy.deadline is not None:
        spec = replace(spec, policy=replace(spec.policy, deadline=deadline_at.isoformat()))
    return spec


def spec_from_dict(d: dict[str, Any]) -> JobSpec:
    """Rebuild a JobSpec stored with `to_dict` (no submit-time checks: it passed them once)."""
    return validate(JobSpec, d, SpecError, redact=("secrets",))


# ---------------------------------------------------------------- loading

def load_spec_file(path: str | Path, *, instance_types: Iterable[str], zones: Iterable[str],
                   now: datetime | None = None, catalog: str = "",
                   clouds: Iterable[str] = ()) -> JobSpec:
    """Read and validate a YAML job spec file (catalog: how errors name the types' catalog)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise SpecError(f"cannot read {p}: {exc.strerror}", field="file", value=str(p)) from None
    return parse_spec_bytes(data, str(p), base_dir=p.resolve().parent,
                            instance_types=instance_types, zones=zones, now=now,
                            catalog=catalog, clouds=clouds)


def read_spec_yaml(data: bytes, label: str) -> Any:
    """The decoded YAML of a spec file's bytes (label names the file in errors)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError("file is not UTF-8 text", field="file", value=label) from None
    try:
        return safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise SpecError(f"not valid YAML{where}", field="file", value=label) from None


def parse_spec_bytes(data: bytes, label: str, *, base_dir: Path, instance_types: Iterable[str],
                     zones: Iterable[str], now: datetime | None = None, catalog: str = "",
                     workdir: str | None = None, clouds: Iterable[str] = ()) -> JobSpec:
    """Validate a spec file's bytes; workdir, when given, stands in for the spec's own
    (the team server's copy of the uploaded bundle)."""
    raw = read_spec_yaml(data, label)
    if workdir is not None and isinstance(raw, dict) and raw.get("workdir") is not None:
        raw = {**raw, "workdir": workdir}
    return parse_spec(raw, base_dir=base_dir, instance_types=instance_types, zones=zones,
                      now=now, catalog=catalog, clouds=clouds)


def parse_spec(raw: Any, *, base_dir: Path, instance_types: Iterable[str], zones: Iterable[str],
               now: datetime | None = None, catalog: str = "", clouds: Iterable[str] = ()
               ) -> JobSpec:
    """Validate a decoded spec mapping; raises SpecError naming the field.

    catalog: how an unknown type's error names the catalog instance_types come from
    (e.g. "the gcp provider's catalog (gcp.yaml)"); "" says "the catalog". clouds: the
    providers configured (resources.clouds must name only these); () checks nothing.
    """
    if raw is None:
        raise SpecError("the file is empty; allowed: a mapping with name and command",
                        field="spec")
    if not isinstance(raw, dict):
        raise SpecError(f"must be a mapping, got {type(raw).__name__}", field="spec")
    # Types keep the catalog's order (an error names a few, the smallest of each family).
    context = {"base_dir": base_dir, "types": dict.fromkeys(instance_types), "zones": set(zones),
               "now": now or datetime.now(timezone.utc), "catalog": catalog,
               "clouds": tuple(clouds) or None}
    return validate(JobSpec, raw, SpecError, context=context, redact=("secrets",))
