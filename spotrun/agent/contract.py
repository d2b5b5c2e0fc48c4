"""The daemon's side of the agent contract: what one attempt's agent is told (an AttemptPlan
made into the AgentConfig that is its instance's user data), and the one launch request that
carries it, the same for the scheduler, a node's replacement and `submit --dry-run`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from spotrun.agent.config import AgentConfig
from spotrun.config import Settings
from spotrun.providers.base import (TAG_ATTEMPT, TAG_JOB, TAG_MANAGED, TAG_NODE, TAG_OWNER,
                                    TAG_PROJECT, LaunchRequest, Pool)
from spotrun.providers.facts import facts_for
from spotrun.spec import JobSpec, spec_from_dict


def spec_is_multi(spec: Any) -> bool:
    """True for a job spec that runs on several nodes (or is elastic)."""
    return spec.resources.nodes > 1 or spec.resources.nodes_min is not None


@dataclass(frozen=True)
class AttemptPlan:
    """What an attempt's agent is told: the job, where its files live, and the placement."""

    job_id: str
    spec: JobSpec
    store_uri: str
    checkpoint_uri: str
    bundle_key: str | None
    attempt: int
    gpus: int                                # GPUs the job uses per node (SPOTRUN_GPUS)
    checkpoint_interval_s: float | None      # provider clock, from the decision
    project: str = "default"                 # whose budget: the cloud's bill groups alike
    owner: str = ""

    @classmethod
    def of(cls, job: Any, attempt: Any, store_uri: str | None = None) -> "AttemptPlan":
        """The plan of an attempt's rows (spotrun.db Job and Attempt); store_uri: the store of
        the attempt's cloud when it is not the job's own (several clouds: the same keys below
        that store's root)."""
        store = store_uri or job.store_uri
        return cls(job_id=job.id, spec=spec_from_dict(job.spec), store_uri=store,
                   checkpoint_uri=rehome(job.checkpoint_uri, job.store_uri, store),
                   bundle_key=job.bundle_key,
                   attempt=attempt.number, gpus=attempt.gpus,
                   checkpoint_interval_s=attempt.checkpoint_interval_s,
                   project=job.project, owner=job.owner)


def rehome(uri: str, old_root: str, new_root: str) -> str:
    """A URI under old_root at the same place under new_root; a URI elsewhere (a pinned
    checkpoint store) stays as is."""
    root = old_root.rstrip("/")
    if uri.rstrip("/") == root or uri.startswith(root + "/"):
        return new_root.rstrip("/") + uri[len(root):]
    return uri


def build_agent_config(settings: Settings, plan: AttemptPlan) -> AgentConfig:
    """The agent's configuration for one attempt (the instance's user data)."""
    spec = plan.spec
    st = settings
    facts = facts_for(st)
    # The provider's clock may run faster than the wall (the local market); agents time things
    # in wall seconds.
    scale = facts.time_scale(st)
    interval_s = plan.checkpoint_interval_s / scale if plan.checkpoint_interval_s else None
    return AgentConfig(
        job_id=plan.job_id, attempt=plan.attempt, store_uri=plan.store_uri,
        checkpoint_uri=plan.checkpoint_uri, command=spec.command, env=dict(spec.env),
        secrets=dict(spec.secrets), bundle_key=plan.bundle_key, gpus=plan.gpus,
        nodes=spec.resources.nodes, nodes_min=spec.resources.nodes_min,
        total_steps=spec.work.total_steps, checkpoint_interval_s=interval_s,
        checkpoint_keep=spec.checkpoint.keep, time_scale=scale, outputs=list(spec.outputs),
        persist=spec.persist_patterns(), job_dir=facts.job_dir(st),
        heartbeat_interval_s=st.agent.heartbeat_interval_s,
        notice_poll_interval_s=st.agent.notice_poll_interval_s,
        log_flush_interval_s=st.agent.log_flush_interval_s,
        deadman_timeout_s=st.daemon.deadman_timeout_s, region=st.region,
        **facts.agent_extras(st))


def first_ranks(spec: JobSpec) -> list[int] | None:
    """The node ranks of a job's first launch: all of a multi-node job's, None for one node."""
    return list(range(spec.resources.nodes)) if spec_is_multi(spec) else None


def launch_request(settings: Settings, plan: AttemptPlan, pools: Sequence[Pool], *,
                   client_token: str, ranks: Sequence[int] | None = None) -> LaunchRequest:
    """The launch request of an attempt's instance (ranks None), or of some of its nodes: the
    whole group, or one replacement (tagged with its rank)."""
    tags = {TAG_JOB: plan.job_id, TAG_ATTEMPT: str(plan.attempt), TAG_MANAGED: "true",
            TAG_PROJECT: plan.project, TAG_OWNER: plan.owner}
    nodes: dict[str, Any] = {}
    if ranks is not None:
        nodes = {"count": len(ranks), "node_ranks": tuple(ranks)}
        if len(ranks) == 1:
            tags[TAG_NODE] = str(ranks[0])
    return LaunchRequest(job_id=plan.job_id, attempt_number=plan.attempt,
                         client_token=client_token, candidates=tuple(pools),
                         user_data=build_agent_config(settings, plan).to_json(), tags=tags,
                         max_price_usd_per_hour=plan.spec.policy.max_price_usd_per_hour,
                         **nodes)
