"""What `plan` and `submit --dry-run` compute, on the market the daemon will read (pure:
nothing written); the CLI prints it, the team server sends it."""

from __future__ import annotations

from typing import Any, Sequence

from spotrun.agent.contract import AttemptPlan, first_ranks, launch_request
from spotrun.config import Settings
from spotrun.decide import Candidate, Placement
from spotrun.decide.clouds import NOWHERE, CheckpointAt
from spotrun.errors import BadInputError, SpotrunError
from spotrun.jobs import Submission
from spotrun.planning.across_clouds import decide_across
from spotrun.planning.market_view import MarketView
from spotrun.providers.base import LaunchRequest, Pool
from spotrun.clouds import cloud_settings, spec_catalog_label, spec_types, spec_zones
from spotrun.spec import JobSpec, load_spec_file

Planned = tuple[str, JobSpec, MarketView, Placement]


def plan_specs(settings: Settings, specs: list[tuple[str, JobSpec]],
               zones_opt: tuple[str, ...] | list[str], offline: bool,
               at: CheckpointAt = NOWHERE) -> list[Planned]:
    """Decide every (file, spec) on the market (also the team server's `POST /plan`); at:
    a resume checkpoint whose move each candidate in another cloud pays."""
    wanted = zones_wanted(tuple(zones_opt), spec_zones(settings))
    several = len(specs) > 1
    planned: list[Planned] = []
    for path, spec in specs:
        view, placed = _decide(path, spec, settings,
                               wanted or list(spec.resources.zones) or None, offline, several, at)
        planned.append((path, spec, view, placed))
    return planned


def plan_json(planned: list[Planned]) -> list[dict]:
    """`plan --json`'s objects, one per file."""
    return [{"spec_file": path, **view.annotate(placed.to_dict())}
            for path, _, view, placed in planned]


def load_named(path: str, settings: Settings, several: bool) -> JobSpec:
    """A spec file read for plan (every configured cloud's types and zones); an error names
    the file when there are several."""
    try:
        return load_spec_file(path, instance_types=spec_types(settings),
                              zones=spec_zones(settings), catalog=spec_catalog_label(settings),
                              clouds=settings.clouds)
    except SpotrunError as exc:
        raise naming(exc, path, several) from exc


def _decide(path: str, spec: JobSpec, settings: Settings, zones: list[str] | None,
            offline: bool, several: bool, at: CheckpointAt) -> tuple[MarketView, Placement]:
    try:
        return decide_across(spec, settings, zones, offline=offline, at=at)
    except SpotrunError as exc:
        raise naming(exc, path, several) from exc


def naming(exc: SpotrunError, path: str, several: bool) -> SpotrunError:
    """With several spec files, the error names the file it is about (same exit code)."""
    if not several:
        return exc
    named = SpotrunError(f"{path}: {exc}")
    named.exit_code = exc.exit_code
    named.http_status = exc.http_status   # the team server answers with the same status
    return named


def zones_wanted(zones_opt: tuple[str, ...], known: list[str]) -> list[str]:
    wanted = [z.strip() for item in zones_opt for z in item.split(",") if z.strip()]
    for z in wanted:
        if z not in known:
            raise BadInputError(f"unknown zone {z!r}; allowed: {', '.join(known)}",
                                field="--zones", value=z)
    return wanted


def dry_run_plan(sub: Submission, settings: Settings) -> dict[str, Any]:
    """What the first launch would do, decided on the market the daemon will see (pure)."""
    spec = sub.spec
    # The same market plan reads (spotrun/planning/market_view.py): both pick the same pool.
    view, placed = decide_across(spec, settings, list(spec.resources.zones) or None)
    provider = view.provider
    out: dict[str, Any] = {"job_id": sub.job_id, "name": spec.name,
                           "checkpoint_uri": sub.checkpoint_uri,
                           **view.annotate(placed.to_dict()), "launch": None}
    first = placed.first
    if first is None or provider is None:
        return out
    # The launch is the first candidate's cloud's (its agent settings, its store).
    request = dry_run_request(sub, cloud_settings(settings, first.cloud or settings.provider),
                              first, placed.candidates)
    out["launch"] = provider.plan_launch(request).to_dict()
    return out


def dry_run_request(sub: Submission, settings: Settings, first: Candidate,
                    candidates: Sequence[Candidate]) -> LaunchRequest:
    """The first launch's request, as the scheduler builds it (spotrun.agent.contract) from the
    values it will have: no database rows, no bundle yet."""
    plan = AttemptPlan(job_id=sub.job_id, spec=sub.spec, store_uri=sub.store_uri,
                       checkpoint_uri=sub.checkpoint_uri, bundle_key=None, attempt=1,
                       gpus=first.gpus, checkpoint_interval_s=first.checkpoint_interval_s,
                       project=sub.spec.project, owner=sub.job_owner())
    pools = [Pool(c.instance_type, c.zone, c.market) for c in candidates]
    return launch_request(settings, plan, pools, client_token="<dry-run>",
                          ranks=first_ranks(sub.spec))
