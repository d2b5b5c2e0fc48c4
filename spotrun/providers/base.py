"""The provider interface: a pure launch plan, then the acts (launch, describe, terminate).

`local`, `aws` and `gcp` implement it; the daemon talks to nothing else. What a provider
serves beyond the protocol is a ProviderFeature it declares (its class's `features`, the same
set as its ProviderFacts'): the core reads the declaration, never probes the object.
Times in InstanceInfo are the provider's clock (the local market runs faster than
the wall), and the ledger books those times.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any, Callable, Protocol, runtime_checkable

from spotrun.errors import ConfigError
from spotrun.states import InstanceState, Market, TerminationCause

TAG_JOB = "spotrun:job"
TAG_ATTEMPT = "spotrun:attempt"
TAG_MANAGED = "spotrun:managed"
TAG_NODE = "spotrun:node"          # the node rank an instance was launched for (multi-node)
# Whose budget (docs/budgets.md), so the cloud's own bill (AWS cost-allocation tags, GCP labels)
# groups like spotrun's budgets.
TAG_PROJECT = "spotrun:project"
TAG_OWNER = "spotrun:owner"


@dataclass(frozen=True)
class Pool:
    """Where an instance can be bought: type, zone and market."""

    instance_type: str
    zone: str
    market: Market

    def key(self) -> str:
        """`type/zone/market`, for logs and error tables."""
        return f"{self.instance_type}/{self.zone}/{self.market.value}"

    @classmethod
    def from_key(cls, key: str) -> "Pool | None":
        """Parse `type/zone/market`; None if it is not one."""
        parts = str(key).split("/")
        if len(parts) != 3:
            return None
        try:
            return cls(parts[0], parts[1], Market(parts[2]))
        except ValueError:
            return None


def pools_to_json(pools: list[Pool]) -> str:
    """Pool keys as a JSON list (what an attempt records as its candidates)."""
    return json.dumps([p.key() for p in pools])


def pools_from_json(text: str | None) -> list[Pool]:
    """The pools of a JSON list of keys; unparsable input gives []."""
    try:
        keys = json.loads(text or "[]")
    except ValueError:
        return []
    pools = [Pool.from_key(k) for k in keys] if isinstance(keys, list) else []
    return [p for p in pools if p is not None]


@dataclass(frozen=True)
class LaunchRequest:
    """What the daemon wants launched for one attempt (candidates in preference order)."""

    job_id: str
    attempt_number: int
    client_token: str               # idempotency: the same token never starts two instances
    candidates: tuple[Pool, ...]
    user_data: str                  # the agent's config (JSON); cloud-init wraps it on AWS
    tags: dict[str, str] = field(default_factory=dict)
    max_price_usd_per_hour: float | None = None
    count: int = 1                  # instances launched together, all in one pool
    node_ranks: tuple[int, ...] = (0,)   # the ranks they will take (tagged TAG_NODE)

    def rank_of(self, k: int) -> int:
        """The node rank of the k-th instance of the request (k itself when not given)."""
        return self.node_ranks[k] if k < len(self.node_ranks) else k


@dataclass(frozen=True)
class LaunchPlan:
    """The calls a launch would make; printing it changes nothing."""

    provider: str
    request: LaunchRequest
    calls: tuple[dict[str, Any], ...]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able view (user data elided to its size)."""
        req = asdict(self.request)
        req["user_data"] = f"<{len(self.request.user_data)} bytes>"
        req["candidates"] = [p.key() for p in self.request.candidates]
        return {"provider": self.provider, "request": req, "calls": list(self.calls)}

    def single(self) -> LaunchRequest:
        """The request of a one-instance launch; a group's goes through launch_group."""
        if self.request.count != 1:
            raise ConfigError("launch starts one instance; a group goes through launch_group",
                              field="count", value=self.request.count)
        return self.request


@dataclass(frozen=True)
class InstanceInfo:
    """A provider's view of one instance."""

    instance_id: str
    instance_type: str
    zone: str
    market: Market
    state: InstanceState
    launched_at: datetime
    ended_at: datetime | None = None
    cause: TerminationCause | None = None
    tags: dict[str, str] = field(default_factory=dict)
    price_usd_per_hour: float | None = None
    client_token: str | None = None
    notice_at: datetime | None = None   # interruption notice time, if the provider knows
    private_ip: str | None = None       # where other nodes of a job reach it (multi-node)


@dataclass(frozen=True)
class Interruption:
    """What a provider's interrupt did to one instance (`spotrun interrupt` says it as is)."""

    instance_id: str
    reclaim_in_s: float                  # provider seconds from now to the reclaim
    reclaim_at: datetime | None = None   # that time on the provider's clock, where it knows it
    # The instance already had a notice: no new one; its reclaim keeps its time unless a
    # sooner one was asked for.
    already_noticed: bool = False
    # The provider cannot see a reclaim already due: it comes in reclaim_in_s or sooner.
    at_most: bool = False
    note: str = ""                       # the provider's own limit, where it changed the ask


@dataclass(frozen=True)
class PricePoint:
    """A spot price change point."""

    instance_type: str
    zone: str
    ts: datetime
    price_usd_per_hour: float


class ProviderFeature(str, Enum):
    """What a provider may serve beyond the Provider protocol: the method of the feature's name.

    A provider declares the features it has (`Provider.features`, `ProviderFacts.features`);
    a provider without one never has its method, and the core falls back as each says.
    """

    # market_view(instance_types) -> list[PoolView]: every pool's spot availability and
    # prices in one read. Without it a decision asks spot_price per pool it reads and takes
    # every pool as available.
    MARKET_VIEW = "market_view"
    # decision_grid() -> (origin_s, tick_s), provider seconds: the market moves on a grid (a
    # replayed trace's rows), and the deadline policy decides on its boundaries. Without it
    # the policy's own interval applies from the epoch.
    DECISION_GRID = "decision_grid"
    # resting_market(instance_types) -> RestingMarket | None: the market as a decision would
    # read it, where reading it live would start it (a local market not running); None while
    # it runs. Without it reading the market live starts nothing.
    RESTING_MARKET = "resting_market"
    # pools_cooling() -> set[str]: keys (`type/zone/market`) of the pools that refused a launch
    # for capacity within the provider's cooldown. A decision takes those spot pools as having
    # no capacity now, so the next launch goes elsewhere (another zone, type or cloud) rather
    # than into the same refusal. Without it every pool is taken as having capacity.
    CAPACITY_COOLDOWN = "pools_cooling"


@dataclass(frozen=True)
class PoolView:
    """One pool as the policy sees it now: spot availability and prices (MARKET_VIEW)."""

    instance_type: str
    zone: str
    available: bool
    spot_price_usd_per_hour: float | None
    on_demand_price_usd_per_hour: float | None


@dataclass(frozen=True)
class RestingMarket:
    """The market read without starting it (RESTING_MARKET): what a decision reads at `at`."""

    at: datetime
    source: str                                # how plan and dry-run label where it came from
    zones: tuple[str, ...]
    pools: tuple[PoolView, ...]
    on_demand: dict[str, float | None]         # USD/h by type, None where it has no price


@runtime_checkable
class Provider(Protocol):
    """What every provider implements."""

    name: str
    features: frozenset[ProviderFeature]       # what it serves beyond this protocol
    snapshot_source: str                       # how a decision labels its live market ("live")

    def zones(self) -> list[str]:
        """Zones this provider can launch into."""

    def now(self) -> datetime:
        """The provider's current time (its clock bills)."""

    def plan_launch(self, request: LaunchRequest) -> LaunchPlan:
        """Pure: the calls launch() would make for request."""

    def launch(self, plan: LaunchPlan) -> InstanceInfo:
        """Start one instance from the first candidate with capacity.

        Idempotent by client token: retrying returns the instance already started.
        Raises CapacityError when no candidate has capacity.
        """

    def launch_group(self, plan: LaunchPlan) -> list[InstanceInfo]:
        """Start `plan.request.count` instances together, all in the first candidate pool that
        has room for every one of them (in rank order).

        All or nothing: a partial group is terminated before CapacityError is raised.
        Idempotent by client token: a retry returns the instances already started.
        """

    def interrupt(self, instance_ids: list[str], notice_s: float = 120.0) -> list[Interruption]:
        """Send the provider's spot interruption to these instances: notice first, the reclaim
        notice_s provider seconds later (rehearsals and tests). Returns what was done to each,
        in order: a pending reclaim is never moved later, and the provider's own window wins."""

    def describe(self, *, job_id: str | None = None,
                 instance_ids: list[str] | None = None) -> list[InstanceInfo]:
        """Instances spotrun manages (optionally of one job or these ids), terminated included."""

    def terminate(self, instance_id: str) -> None:
        """Terminate; terminating a terminated or unknown instance is not an error."""

    def spot_price(self, instance_type: str, zone: str) -> float | None:
        """The spot price in effect now, or None if the pool has no spot price."""

    def on_demand_price(self, instance_type: str) -> float:
        """The on-demand USD/h of the type in this provider's region."""

    def price_history(self, instance_type: str, zones: list[str], start: datetime,
                      end: datetime) -> list[PricePoint]:
        """Spot price change points in [start, end] (plus the one in effect at start)."""

    def risk_hints(self, instance_types: list[str], zones: list[str]) -> dict[tuple[str, str], Any]:
        """Live reclaim-risk evidence per (type, zone) (spotrun.costmodel.risk.RiskHint); {} if none."""

    def offline_tick_s(self) -> float | None:
        """The market's natural decision interval in provider seconds, if it has one."""


@dataclass(frozen=True)
class ProviderFacts:
    """Static facts of one provider kind, read from settings."""

    name: str
    make: Callable[..., Any]                          # settings, **kw -> Provider
    known_zones: Callable[[Any], list[str]]           # zones it can launch into
    time_scale: Callable[[Any], float]                # provider-clock seconds per wall second
    billed_volume_gb: Callable[[Any], float]          # disk billed per instance beside the GPU
    agent_extras: Callable[[Any], dict[str, Any]]     # provider-specific agent settings
    clock_name: str = "wall"                          # how the CLI labels the provider's clock
    billing_rules: Callable[[], Any] = lambda: None   # spotrun.providers.billing_rules.BillingRules
    # What the cloud itself bills (the audit's truth where a provider has one), or None.
    market_truth: Callable[[Any], Any] = lambda st: None
    doctor: Callable[[Any], list[Any]] | None = None  # cloud checks for `spotrun doctor`
    # `audit --reconcile`: (settings, session, jobs, now) -> lines of ledger vs the cloud's bill
    reconcile: Callable[..., list[Any]] | None = None
    # The c10d rendezvous port of a multi-node job on its host node; 0: a free port the daemon
    # picks (every local node shares 127.0.0.1, so a fixed port would collide across jobs).
    rdzv_port: int = 0
    # The interruption notice, for the progress model (docs/cost-model.md, "Work lost per
    # reclaim"): its lead before a reclaim, provider-clock seconds read from settings, and the
    # prior chance that a reclaim brings one the job can use, before the job's own record.
    # The defaults are a provider that gives no notice.
    notice_window_s: Callable[[Any], float] = lambda st: 0.0
    # The provider's stated time for an instance asked to stop to be gone, wall seconds: the
    # budget stop margin's prior before a stop is measured (spotrun.ledger.stopmargin).
    terminate_wall_s: Callable[[Any], float] = lambda st: 120.0
    notice_prior: float = 0.0
    # After an interruption notice in a spot pool (type + zone), or a reclaim without one, no
    # launch goes there for this many provider-clock seconds: the cloud is taking capacity
    # back (spotrun/decide/quarantine.py; docs/cost-model.md, "Notice quarantine"). 0: none.
    notice_quarantine_s: float = 0.0
    # The job's directory on an instance, the same absolute path on every attempt (frameworks
    # record absolute paths): a template with {job_id} and {node_rank}; None: <agent dir>/job.
    job_dir: Callable[[Any], str | None] = lambda st: None
    # The packaged catalog its instance types come from (spotrun/data/catalog/<catalog>.yaml,
    # read through spotrun.providers.facts.catalog_for), and the region whose catalog prices apply.
    catalog: str = "aws"
    price_region: Callable[[Any], str] = lambda st: st.region
    # The instance side, for an agent whose config names this provider (`instance_side`, set
    # through agent_extras): (agent config, environ, monotonic clock) -> the agent's view of
    # its instance (spotrun.agent.imds.InstanceMetadata: the interruption notice, whether the
    # guest's shutdown signal is one, the instance id). None: the IMDSv2 protocol at the
    # config's imds_endpoint (EC2, and the local market that imitates it).
    instance_metadata: Callable[..., Any] | None = None
    # What its provider serves beyond the protocol: the same set as the provider's `features`,
    # readable from settings alone, without making a provider.
    features: frozenset[ProviderFeature] = frozenset()
    # The object-store scheme of this cloud ("s3", "gs"; "" for none): a checkpoint under it
    # lives in this cloud, and leaving it is billed as this cloud's egress (issue 43).
    store_scheme: str = ""
    # This cloud's own store when one daemon places jobs on several clouds (settings
    # `<provider>.store_uri`; "": the top-level store_uri, the first cloud's).
    store_uri: Callable[[Any], str] = lambda st: ""
    # A provider that cannot share a daemon with others (the local market simulates one whole
    # market on this machine, in its own clock): settings `providers` may name it only alone.
    runs_alone: bool = False


class MarketTruth(Protocol):
    """Availability and prices the provider really had (the audit's best source)."""

    name: str

    def zones(self) -> list[str]:
        """Zones the market offered."""

    def available(self, zone: str, at: datetime) -> bool:
        """Spot capacity in zone at provider time `at`."""

    def spot_price(self, instance_type: str, zone: str, at: datetime) -> float | None:
        """Spot USD/h at provider time `at` (None: not priced)."""

    def provider_time(self, wall: datetime) -> datetime:
        """The provider's clock reading at a wall-clock time."""
