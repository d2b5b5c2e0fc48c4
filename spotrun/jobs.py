"""Submitting, cancelling and resuming jobs: what the CLI writes to the database.

Only the daemon acts on clouds; these functions record requests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from sqlalchemy import exists, update
from sqlalchemy.engine import Engine
from sqlmodel import Session

from spotrun import layout
from spotrun.budgets.submit import os_user, refuse_unfit, submit_owner
from spotrun.daemon.nodes import is_multi, members_of
from spotrun.bundle import drop_bundle, upload_bundle
from spotrun.interrupts import DEFAULT_NOTICE_S, Interrupted, check_notice_s
from spotrun.providers import make_provider
from spotrun.clouds import (catalogs_of, cloud_settings, job_clouds, spec_catalog_label,
                            spec_types, spec_zones)
from spotrun.providers.facts import facts_for
from spotrun.config import Settings
from spotrun.db import Attempt, Job, add_event, attempts_of, find_job, new_job_id, nodes_of, \
    session, utcnow
from spotrun.db.faults import check_writable
from spotrun.errors import BadInputError, NotFoundError, SpotrunError
from spotrun.ledger.budget import raise_budget
from spotrun.spec import JobSpec, load_spec_file, parse_spec_bytes
from spotrun.states import JobState, move_job
from spotrun.store import ProgressFn, open_store
from spotrun.zones import known_zones


@dataclass(frozen=True)
class Submission:
    """A validated spec plus where it will live."""

    spec: JobSpec
    job_id: str
    store_uri: str
    checkpoint_uri: str
    warnings: tuple[str, ...] = ()    # accepted, but worth saying (e.g. a price cap below all)
    owner: str = ""                   # who submits ("" = the OS user running submit)
    settings: Settings | None = None  # the settings it was validated under ([budgets])

    def job_owner(self) -> str:
        """Whose job it is: the owner given, else the OS user running submit."""
        return self.owner or os_user()


def validate_submission(path: str | Path, settings: Settings, *,
                        owner: str | None = None, history: Any = None) -> Submission:
    """Validate a spec file against the catalog and the provider's zones, and the owner
    (`--owner`, where `[budgets] allow_owner_override` allows one; writes nothing; history:
    the pool history to check against, default the state database's)."""
    owner = submit_owner(settings, owner)
    spec = load_spec_file(path, instance_types=spec_types(settings), zones=spec_zones(settings),
                          catalog=spec_catalog_label(settings), clouds=settings.clouds)
    return submission_of(spec, settings, owner, history=history)


def validate_spec_bytes(data: bytes, label: str, settings: Settings, *, owner: str,
                        base_dir: Path, workdir: str | None, history: Any = None,
                        checks: Any = None) -> Submission:
    """validate_submission for a spec sent to the team server: owner already decided (the
    authenticated user), workdir the server's extracted copy of the uploaded bundle, history
    the server's shared pool history, checks its spotrun.decide.memo.CheckMemo."""
    spec = parse_spec_bytes(data, label, base_dir=base_dir, instance_types=spec_types(settings),
                            zones=spec_zones(settings), catalog=spec_catalog_label(settings),
                            workdir=workdir, clouds=settings.clouds)
    return submission_of(spec, settings, owner, history=history, checks=checks)


def submission_of(spec: JobSpec, settings: Settings, owner: str, *,
                  history: Any = None, checks: Any = None) -> Submission:
    """A validated spec's Submission: refusals and warnings, a fresh id, where it lives
    (checks: a CheckMemo that alike specs' checks share, the team server's)."""
    if checks is None:
        warnings = refuse_never_runs(spec, settings, history=history)
    else:
        warnings = checks.get(spec, lambda: refuse_never_runs(spec, settings, history=history))
    job_id = new_job_id(spec.name)
    store_uri = settings.store_url
    if spec.checkpoint.uri:
        # One prefix per job, so no job can read or write another job's checkpoints.
        checkpoint_uri = f"{spec.checkpoint.uri.rstrip('/')}/{job_id}"
    else:
        checkpoint_uri = f"{store_uri.rstrip('/')}/{layout.default_checkpoint_prefix(job_id)}"
    return Submission(spec=spec, job_id=job_id, store_uri=store_uri, checkpoint_uri=checkpoint_uri,
                      warnings=tuple(warnings), owner=owner, settings=settings)


def refuse_never_runs(spec: JobSpec, settings: Settings, *, history: Any = None) -> list[str]:
    """Raise the refusal (exit 2) for a job no type, zone and market of any cloud it may use
    can ever run; else warnings. With several clouds, one that can run it is enough.

    The catalog's prices suffice: what can never run does not depend on prices.
    """
    # lazy: start-up cost (the decision imports numpy; `status` imports this module)
    from spotrun.decide.clouds import spec_in_cloud
    from spotrun.decide.from_settings import decide_for_cli, offline_market
    catalogs = catalogs_of(settings)
    warnings: list[str] = []
    refusals: list[SpotrunError] = []
    for cloud in job_clouds(settings, spec.resources.clouds):
        view = cloud_settings(settings, cloud)
        zones = known_zones(view)
        cut, why = spec_in_cloud(spec, catalogs[cloud], zones, catalogs)
        if cut is None:
            refusals.append(SpotrunError(f"{cloud}: {why}", field="resources.clouds",
                                         value=cloud))
            continue
        try:
            got = decide_for_cli(cut.spec, view, catalogs[cloud],
                                 offline_market(view, catalogs[cloud], zones),
                                 history=history).warnings
        except BadInputError:
            raise
        except SpotrunError as exc:
            refusals.append(exc)
            continue
        warnings += got if len(settings.clouds) == 1 else [f"{cloud}: {w}" for w in got]
    if len(refusals) == len(job_clouds(settings, spec.resources.clouds)):
        raise refusals[0]
    return warnings


def submit(sub: Submission, engine: Engine, progress: ProgressFn | None = None,
           bundle_file: Path | None = None, with_rows: Sequence[Any] = ()) -> Job:
    """Upload the code bundle, then record the job as queued: both or neither.

    bundle_file: an already packed (and checked) bundle to store as is, instead of packing
    the spec's workdir (the team server's upload). with_rows: rows committed with the job's
    (the server's trail row: the job and who submitted it, together or not at all).

    The database's write lock is taken once first (bounded wait), so a locked database fails
    before anything is uploaded; a row that then cannot be written takes its bundle with it.
    (The other order, a row in a 'submitting' state first, would show the daemon a job whose
    code may never arrive, and a new state every reader must skip.) Only a process killed
    between the upload and the commit can leave a bundle behind: under its own fresh job id,
    referenced by no row, so nothing ever reads it.
    """
    check_writable(engine)
    owner = sub.job_owner()
    if sub.settings is not None:   # before the upload: a refused job writes nothing
        refuse_unfit(sub.settings, engine, sub.spec.project, owner, sub.spec.policy.budget_usd)
    with session(engine) as s:
        # Ids are random; a taken one must not have its bundle overwritten (or deleted below).
        if s.get(Job, sub.job_id) is not None:
            raise SpotrunError("job id already taken", field="job", value=sub.job_id,
                               hint="submit again: a new id is drawn each time")
    bundle = None
    store = None
    if sub.spec.workdir:
        store = open_store(sub.store_uri)
        bundle = layout.bundle_key(sub.job_id)
        if bundle_file is not None:
            store.put_file(bundle, bundle_file, progress=progress)
        else:
            upload_bundle(store, sub.spec.workdir, bundle, progress)
    job = Job(id=sub.job_id, name=sub.spec.name, state=JobState.QUEUED,
              spec_json=json.dumps(sub.spec.to_dict(), sort_keys=True),
              store_uri=sub.store_uri, checkpoint_uri=sub.checkpoint_uri, bundle_key=bundle,
              budget_usd=sub.spec.policy.budget_usd, total_steps=sub.spec.work.total_steps,
              owner=owner, project=sub.spec.project)
    try:
        with session(engine) as s:
            s.add(job)
            add_event(s, job.id, "submitted", f"spec {sub.spec.name}")
            for row in with_rows:
                s.add(row)
            s.commit()
    except BaseException:
        if store is not None and bundle is not None:
            drop_bundle(store, bundle)
        raise
    return job



def request_cancel(engine: Engine, ref: str) -> Job:
    """Cancel a job (idempotent): one that never launched at once, else mark it for the
    daemon, which terminates its instances."""
    with session(engine) as s:
        job = find_job(s, ref)
        if job is None:
            raise NotFoundError("no such job", field="JOB", value=ref, hint="see `spotrun status`")
        if job.state.is_terminal() or job.cancel_requested:
            return job
        if job.state is JobState.QUEUED:
            job_id = job.id
            done = _cancel_unlaunched(s, job_id)
            if done is not None:
                return done
            s.rollback()   # a daemon launched it meanwhile: ask it to cancel instead
            s.expunge_all()
            job = s.get(Job, job_id)
            if job.state.is_terminal() or job.cancel_requested:
                return job
        job.cancel_requested = True
        job.updated_at = utcnow()
        add_event(s, job.id, "cancel_requested")
        s.add(job)
        s.commit()
        return job


def _cancel_unlaunched(s: Session, job_id: str) -> Job | None:
    """Cancel a job still queued with no attempt, in one transaction; None if it is not.

    The conditional update takes the row (and, on SQLite, the write lock) before the state
    moves, and the scheduler writes an attempt intent only through the mirror-image update
    (`scheduler._still_launchable`): of a launch and this cancel racing, exactly one wins.
    """
    now = utcnow()
    launched = exists().where(Attempt.job_id == job_id)
    res = s.execute(update(Job).where(Job.id == job_id, Job.state == JobState.QUEUED,
                                      Job.cancel_requested == False, ~launched)  # noqa: E712
                    .values(updated_at=now).execution_options(synchronize_session=False))
    if res.rowcount != 1:
        return None
    s.expunge_all()   # read the row again, under the lock the update took
    job = s.get(Job, job_id)
    move_job(job, JobState.CANCELLED)
    job.cancel_requested = True
    job.reason = "cancelled before it launched"
    job.updated_at = now
    add_event(s, job.id, "cancelled", "before any launch")
    s.add(job)
    s.commit()
    return job


def resume_job(engine: Engine, ref: str, budget_usd: float | None = None) -> Job:
    """Requeue a job stopped by its budget (or failed), optionally raising the budget."""
    with session(engine) as s:
        job = find_job(s, ref)
        if job is None:
            raise NotFoundError("no such job", field="JOB", value=ref, hint="see `spotrun status`")
        if job.state not in (JobState.BUDGET_EXHAUSTED, JobState.FAILED):
            raise BadInputError(f"job is {job.state.value}; only budget_exhausted or failed jobs "
                                "can be resumed", field="JOB", value=ref)
        if budget_usd is not None:
            raise_budget(s, job, budget_usd)
        move_job(job, JobState.RECOVERING)
        if job.budget_stop_scope is not None:
            # A project or owner budget stopped it: its launch waits for room in that budget.
            job.budget_stop_requested = False
            job.budget_stop_scope = None
        job.error_restarts = 0
        job.reason = None
        job.updated_at = utcnow()
        add_event(s, job.id, "resumed", f"budget_usd={job.budget_usd}")
        s.add(job)
        s.commit()
        return job


def current_instances(engine: Any, job_ref: str) -> tuple[str, Attempt | None, dict[int, str]]:
    """(job id, its live attempt, node rank -> instance id) of what the job runs on now."""
    with session(engine) as s:
        job = find_job(s, job_ref)
        if job is None:
            raise NotFoundError("no such job", field="job", value=job_ref)
        live = [a for a in attempts_of(s, job.id) if not a.state.is_terminal()]
        if not live:
            return job.id, None, {}
        att = live[-1]
        if is_multi(att):
            return job.id, att, {n.node_rank: n.instance_id or ""
                                 for n in members_of(nodes_of(s, att.id))}
        return job.id, att, ({0: att.instance_id} if att.instance_id else {})


def interrupt_job(settings: Settings, engine: Any, job_ref: str, *, node: int | None,
                  notice_s: float | None, provider: Any = None) -> Interrupted:
    """Send the provider's interruption to the job's current instance(s) (node: that rank
    only; notice_s None: the provider's own window; provider: default settings')."""
    check_notice_s(notice_s)
    job_id, att, ranks = current_instances(engine, job_ref)
    if not ranks:
        raise NotFoundError("the job runs on no instance now", field="job", value=job_id,
                            hint="`spotrun status JOB` shows its state")
    # Several clouds: the provider of the cloud the attempt runs on sends the interruption.
    if att is not None and att.cloud and att.cloud in settings.clouds:
        settings = cloud_settings(settings, att.cloud)
    facts = facts_for(settings)
    if notice_s is None:
        notice_s = facts.notice_window_s(settings) or DEFAULT_NOTICE_S
    if node is not None:
        if node not in ranks:
            raise BadInputError(f"no such running node; allowed: "
                                f"{', '.join(str(r) for r in sorted(ranks))}", field="--node",
                                value=node)
        ranks = {node: ranks[node]}
    provider = provider or make_provider(settings)
    done = provider.interrupt(list(ranks.values()), notice_s=notice_s)
    by_id = {d.instance_id: d for d in done}
    return Interrupted(job_id=job_id, attempt=att.number if att else None, notice_s=notice_s,
                       provider=provider.name, clock=facts.clock_name,
                       nodes=[(r, by_id[i]) for r, i in sorted(ranks.items())])
