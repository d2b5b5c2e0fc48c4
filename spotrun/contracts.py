"""Typed contracts on pydantic v2: validate a mapping into a dataclass, fail with our one line.

The dataclasses stay plain (frozen, `dataclasses.replace`, cheap to build); pydantic checks
them where data comes in (YAML, TOML, JSON from the store) through a cached TypeAdapter. A
`ValidationError` becomes a `SpotrunError` whose field is the first error's path
(`resources.instance_types[0]`, `env.A`) and whose message says what is allowed: the
field's `description`, or the message a validator raised with `fail`.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from enum import Enum
from functools import cache
from types import UnionType
from typing import Annotated, Any, Iterable, Union, get_args, get_origin, get_type_hints

from pydantic import TypeAdapter, ValidationError, WrapValidator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from spotrun.errors import BadInputError, SpotrunError

_MAPPING_TYPES = {"dataclass_type", "dataclass_exact_type", "dict_type", "model_type"}


@cache
def adapter(typ: Any) -> TypeAdapter:
    """The TypeAdapter of a type, built once (schema building is the slow part)."""
    return TypeAdapter(typ)


def fail(message: str, *at: str | int) -> PydanticCustomError:
    """An error a validator raises; `at` extends the path below the validated value."""
    return PydanticCustomError("spotrun", message, {"at": at})


def validate(typ: Any, raw: Any, error: type[SpotrunError], *, context: Any = None,
             prefix: str = "", redact: Iterable[str] = ()) -> Any:
    """`raw` validated into `typ`; raises `error` naming the first bad field."""
    try:
        return adapter(typ).validate_python(raw, context=context)
    except ValidationError as exc:
        raise as_error(exc, typ, error, prefix=prefix, redact=redact) from None


def as_error(exc: ValidationError, root: Any, error: type[SpotrunError], *, prefix: str = "",
             redact: Iterable[str] = ()) -> SpotrunError:
    """Our one-line error for the first problem pydantic found."""
    e = exc.errors(include_url=False)[0]
    at = (e.get("ctx") or {}).get("at", ())
    loc = list(e["loc"]) + list(at)
    value = e.get("input")
    for part in at:   # the value itself, not the mapping the validator saw
        value = value.get(part) if isinstance(value, dict) else value
    is_key = "[key]" in loc
    loc = [p for p in loc if p != "[key]"]
    rel = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    path = prefix + rel if rel else prefix.rstrip(".") or "input"
    kind = e["type"]
    if kind == "spotrun" or is_key:
        message = e["msg"]
    elif kind == "missing":
        message = "is required"
    elif kind in ("extra_forbidden", "unexpected_keyword_argument"):
        keys = ", ".join(sorted(field_names(_walk(root, loc[:-1])[0])))
        message = f"unknown field; allowed here: {keys}"
    elif kind in _MAPPING_TYPES:
        message = f"must be a mapping, got {type(e['input']).__name__}"
    else:
        desc = _walk(root, loc)[1]
        message = f"allowed: {desc}" if desc else e["msg"]
    secret = bool(loc) and loc[0] in set(redact)
    value = "<redacted>" if secret else (None if kind == "missing" else value)
    return error(message, field=path, value=value)


def field_names(cls: Any) -> list[str]:
    """The keys a dataclass takes as input: its fields, less `_stored_only`, plus `_input_only`."""
    if not dataclasses.is_dataclass(cls):
        return []
    names = {f.name for f in dataclasses.fields(cls)} - set(getattr(cls, "_stored_only", ()))
    return sorted(names | set(getattr(cls, "_input_only", ())))


def _walk(root: Any, loc: list[Any]) -> tuple[Any, str | None]:
    """Follow `loc` through dataclass fields: (the last dataclass, the deepest description)."""
    cls, desc = root, None
    for part in loc:
        if not (isinstance(part, str) and dataclasses.is_dataclass(cls)) \
                or part not in _hints(cls):
            break
        cls, here = _peel(_hints(cls)[part])
        desc = here or desc
    return cls, desc


@cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls, include_extras=True)


def _peel(typ: Any) -> tuple[Any, str | None]:
    """The class under Annotated and `| None`, and the outermost Field description met."""
    desc = None
    while True:
        if get_origin(typ) is Annotated:
            desc = desc or next((m.description for m in typ.__metadata__
                                 if isinstance(m, FieldInfo) and m.description), None)
            typ = get_args(typ)[0]
            continue
        args = [a for a in get_args(typ) if a is not type(None)]
        if get_origin(typ) not in (Union, UnionType) or len(args) != 1:
            return typ, desc
        typ = args[0]


def _or_none(value: Any, handler: Any) -> Any:
    try:
        return handler(value)
    except ValidationError:
        return None


Lenient = WrapValidator(_or_none)   # a report field of the wrong type reads as absent


def json_default(o: Any) -> Any:
    """json.dumps default for what goes out as JSON (CLI, dashboard): datetimes and enums."""
    if isinstance(o, datetime):
        return o.isoformat()
    if isinstance(o, Enum):
        return o.value
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def parse_time(value: str | None, name: str) -> datetime | None:
    """An ISO-8601 time given by a user (`--since`, a query parameter), UTC if it names no
    zone; bad input naming the field otherwise."""
    if value is None:
        return None
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise BadInputError("allowed: an ISO-8601 time such as 2030-01-31T12:00:00Z",
                            field=name, value=value) from None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)
