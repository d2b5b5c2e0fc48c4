"""Daemon/CLI settings: typed defaults declared once, read from `$SPOTRUN_HOME/spotrun.toml`.

Precedence: built-in default < spotrun.toml < environment (`SPOTRUN_HOME`, `SPOTRUN_DB_URL`).
Every setting is validated (pydantic, through spotrun.contracts) with an error naming its
dotted key and what is allowed.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, Strict

from spotrun.contracts import fail, validate
from spotrun.errors import ConfigError
from spotrun.providers import FACTS, PROVIDERS

CONFIG_FILE = "spotrun.toml"
_STRICT = ConfigDict(extra="forbid")
Num = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False, description="a number >= 0")]
Int = Annotated[int, Strict(), Field(ge=0, description="an integer >= 0")]
Str = Annotated[str, Strict(), Field(description="a string")]
Bool = Annotated[bool, Strict(), Field(description="true or false")]
StrList = Annotated[tuple[Annotated[str, Strict()], ...], Field(description="a list of strings")]


@dataclass(frozen=True)
class LocalMarketSettings:
    """The local provider's simulated spot market (a separate, durable process)."""

    __pydantic_config__ = _STRICT

    trace: Str = ""                 # availability CSV; "" = the packaged demo extract
    prices: Str = ""                # price change-point CSV; "" = the packaged extract
    pools: StrList = ()     # trace columns to offer; () = all
    instance_type: Str = "p3.2xlarge"  # the type the trace measured
    time_scale: Num = 60.0        # market seconds per wall second
    start_tick: Int = 0             # trace tick at market start
    notice_s: Num = 120.0         # interruption notice lead time, market seconds
    spot_price_usd_per_hour: Num = 0.0  # used when there is no price file
    # "rehearsal": real time (x1) while a job starts up, notice_wall_s per notice, time_scale
    # otherwise (docs/local-provider.md); "fixed": time_scale always.
    pacing: Literal["rehearsal", "fixed"] = "rehearsal"
    startup_max_s: Num = 300.0    # wall seconds of real-time start-up at most per instance
    notice_wall_s: Num = 20.0     # rehearsal: wall seconds an interruption notice lasts
    boot_s: Num = 60.0            # market seconds an instance boots before its job starts
    boot_s_by_type: dict[Str, Num] = field(default_factory=dict)   # per-type boot_s


@dataclass(frozen=True)
class DaemonSettings:
    """Loop intervals and timeouts of `spotrun daemon` (wall seconds)."""

    __pydantic_config__ = _STRICT

    schedule_interval_s: Num = 1.0
    reconcile_interval_s: Num = 1.0
    heartbeat_interval_s: Num = 1.0
    spend_interval_s: Num = 5.0
    heartbeat_timeout_s: Num = 300.0   # no heartbeat this long: instance is stuck
    launch_timeout_s: Num = 600.0      # no running instance this long after launch
    liveness_interval_s: Num = 5.0     # how often the daemon proves it is alive to agents
    deadman_timeout_s: Num = 1800.0    # agents shut down after this much daemon silence
    lease_ttl_s: Num = 30.0            # a daemon lease not renewed this long is free
    lease_renew_interval_s: Num = 5.0  # how often the lease holder renews it
    orphan_interval_s: Num = 10.0      # how often the orphan sweeper looks
    orphan_grace_s: Num = 60.0         # an unowned spotrun instance lives this long first
    # Deadline jobs: the shared placement policy (spotrun.policy) decides each interval.
    policy: Str = "spotrun"              # a name in spotrun.policy.POLICIES
    policy_tick_s: Num = 0.0           # decision interval, provider-clock seconds;
    #   0 = the local market's trace tick, else 300
    policy_changeover_s: Num = 0.0     # restart overhead the policy assumes, provider
    #   seconds; 0 = the cost model's restart estimate for the pool
    price_interval_s: Num = 300.0      # how often spot price history is recorded (PricePoint)


@dataclass(frozen=True)
class AgentSettings:
    """Defaults for agents on instances (wall seconds, before market time scaling)."""

    __pydantic_config__ = _STRICT

    heartbeat_interval_s: Num = 2.0
    notice_poll_interval_s: Num = 5.0
    log_flush_interval_s: Num = 2.0


@dataclass(frozen=True)
class AwsSettings:
    """The `aws` provider: where instances launch and how the client behaves."""

    __pydantic_config__ = _STRICT

    ami_id: Str = ""                       # an AMI with NVIDIA drivers (e.g. a Deep Learning AMI)
    subnets: StrList = ()          # "zone=subnet-id" each; () = default VPC by zone
    security_group_ids: StrList = ()
    key_name: Str = ""                     # "" = no SSH key
    instance_profile_arn: Str = ""         # role the agent uses for S3 (and SSM secrets)
    endpoint_url: Str = ""                 # "" = AWS; tests point it at moto on 127.0.0.1
    spotrun_install: Str = "spotrun"       # pip spec the user data installs on the instance
    volume_size_gb: Int = 200              # root volume (gp3), deleted with the instance
    launch_api: Str = "fleet"              # "fleet" (create_fleet instant) or "run_instances"
    retry_attempts: Int = 6                # tries per call on throttling / 5xx
    retry_base_s: Num = 0.5              # jittered exponential back-off base
    retry_max_s: Num = 20.0              # longest single back-off
    capacity_cooldown_s: Num = 600.0     # skip a pool this long after a capacity error
    imds_endpoint: Str = "http://169.254.169.254"   # what agents poll for notices
    # Reclaim risk (docs/cost-model.md "Reclaim risk per pool"); "" = no advisor file.
    spot_advisor_url: Str = "https://spot-bid-advisor.s3.amazonaws.com/spot-advisor-data.json"
    spot_advisor_max_age_s: Num = 86400.0   # refetch the cached advisor file after this
    placement_scores: Bool = True             # ask ec2 get_spot_placement_scores per type
    fis_role_arn: Str = ""                    # FIS role for `spotrun interrupt`; "" = spotrun-fis
    # With several clouds (`providers`): AWS's store (s3://bucket/prefix), where a job's
    # checkpoint lives while it runs on AWS; "" = the top-level store_uri (docs/clouds.md).
    store_uri: Str = ""


@dataclass(frozen=True)
class GcpSettings:
    """The `gcp` provider: the project, where Spot VMs launch and what they boot
    (docs/gcp.md)."""

    __pydantic_config__ = _STRICT

    project: Str = ""                      # the project id instances launch in
    region: Str = "us-central1"            # catalog prices and the default zones are this region's
    zones: StrList = ()            # () = the region's zones (spotrun.providers.gcp.ZONES)
    endpoint_url: Str = ""                 # "" = compute.googleapis.com; tests: a fake on 127.0.0.1
    metadata_host: Str = "metadata.google.internal"   # what agents poll (GCE_METADATA_HOST wins)
    network: Str = ""                      # "" = the project's `default` network
    subnetwork: Str = ""                   # "" = the network's auto subnet in the region
    service_account: Str = ""              # the VMs' identity for gs:// ("" = the default one)
    image: Str = ""                        # boot image with NVIDIA drivers (projects/.../images/..)
    boot_disk_gb: Int = 200                # boot disk, deleted with the VM
    boot_disk_type: Str = "pd-balanced"
    spotrun_install: Str = "spotrun"       # pip spec the startup script installs
    external_ip: Bool = True               # False: no public address (needs Cloud NAT for pip)
    capacity_cooldown_s: Num = 600.0       # skip a pool this long after a capacity error
    operation_timeout_s: Num = 120.0       # longest wait for one zone operation
    # With several clouds (`providers`): GCP's store (gs://bucket/prefix), where a job's
    # checkpoint lives while it runs on GCP; "" = the top-level store_uri (docs/clouds.md).
    store_uri: Str = ""


@dataclass(frozen=True)
class NotifySettings:
    """Alerts (`[notify]`, see docs/alerts.md): Slack-compatible webhooks and what goes where."""

    __pydantic_config__ = _STRICT

    webhooks: StrList = ()       # "name=https://hooks..." each; () = no alerts
    routes: StrList = ()         # "event=name,name" each; an event not named goes
    #   to every webhook; "event=" sends it nowhere (events: spotrun.notify.EVENTS)
    budget_warn_fraction: Num = 0.8    # the "budget 80%" alert's threshold
    interval_s: Num = 2.0              # how often the daemon looks for new events (wall)
    timeout_s: Num = 10.0              # one HTTP POST
    retry_attempts: Int = 4              # tries per delivery round (tenacity)
    retry_base_s: Num = 1.0            # exponential back-off between tries
    retry_max_s: Num = 30.0
    max_rounds: Int = 20                 # rounds before a message is given up (logged)


@dataclass(frozen=True)
class ServerSettings:
    """`[server]`: the team server's limits (docs/server.md)."""

    __pydantic_config__ = _STRICT

    # The largest code bundle (the workdir's tar.gz) a remote `spotrun submit` may upload;
    # a bigger one is refused, naming this key, before anything is written.
    max_bundle_mb: Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False,
                                                    description="a number > 0 (MB)")] = 512.0
    # How long a dashboard login lasts (from the login, not from the last click): then the
    # browser is sent back to the login page.
    session_hours: Annotated[float, Strict(), Field(gt=0, le=720, allow_inf_nan=False,
                                                    description="a number of hours in (0, 720]")
                             ] = 12.0
    # How old the shared `status` list may get before one call starts its rebuild (others
    # are served the last build meanwhile); a job this server changed is always current.
    status_max_age_s: Annotated[float, Strict(), Field(ge=0, le=300, allow_inf_nan=False,
                                                       description="seconds in [0, 300]")
                                ] = 2.0


# ---------------------------------------------------------------- [budgets]
# Dollar budgets per project and per owner (docs/budgets.md):
#
#   [budgets]
#   allow_owner_override = false          # true: `spotrun submit --owner NAME` may name another
#   [budgets.project.ml-research]
#   usd = 2000
#   period = "month"                      # day | week | month (UTC calendar) | total
#
# Every problem names its dotted key (`budgets.project.ml-research.usd`) and what is allowed.

PERIODS = ("day", "week", "month", "total")
Period = Literal["day", "week", "month", "total"]
SCOPES = ("project", "owner")
DEFAULT_PROJECT = "default"
UNKNOWN_OWNER = "unknown"      # jobs submitted before owners existed
# A project is named like a job (spec.name's rule); an owner like a user name. Both stay
# valid as AWS tag values and as the key of a TOML table.
PROJECT_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
OWNER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}$")
PROJECT_RULE = "lower-case letters, digits and '-', 1-63 characters, not starting with '-'"
OWNER_RULE = "letters, digits, '_', '.', '@' and '-', 1-64 characters"


def _named(pattern: re.Pattern[str], rule: str) -> AfterValidator:
    def check(value: str) -> str:
        if not pattern.match(value):
            raise fail(f"not a valid name; allowed: {rule}")
        return value
    return AfterValidator(check)


ProjectName = Annotated[str, Strict(), _named(PROJECT_RE, PROJECT_RULE)]
OwnerName = Annotated[str, Strict(), _named(OWNER_RE, OWNER_RULE)]


@dataclass(frozen=True)
class ScopeBudget:
    """One budget: at most `usd` per `period` (a UTC calendar day, ISO week, month, or ever)."""

    __pydantic_config__ = _STRICT

    usd: Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False,
                                          description="a number > 0 (USD)")]
    period: Annotated[Period, Field(description="day, week, month or total")]


@dataclass(frozen=True)
class BudgetsSettings:
    """`[budgets]`: who may name another owner, and the budgets by project and by owner."""

    __pydantic_config__ = _STRICT

    allow_owner_override: Annotated[bool, Strict(), Field(description="true or false")] = False
    project: dict[ProjectName, ScopeBudget] = field(default_factory=dict)
    owner: dict[OwnerName, ScopeBudget] = field(default_factory=dict)

    def configured(self) -> list[tuple[str, str, ScopeBudget]]:
        """Every budget as (scope, name, budget), projects first, each by name."""
        return ([("project", n, b) for n, b in sorted(self.project.items())]
                + [("owner", n, b) for n, b in sorted(self.owner.items())])

    def of_job(self, project: str, owner: str) -> list[tuple[str, str, ScopeBudget]]:
        """The budgets a job of this project and owner spends from."""
        out = []
        if project in self.project:
            out.append(("project", project, self.project[project]))
        if owner in self.owner:
            out.append(("owner", owner, self.owner[owner]))
        return out


def scope_key(scope: str, name: str) -> str:
    """`project:ml` / `owner:alice`: a budget's key (events, alerts, locks)."""
    return f"{scope}:{name}"


@dataclass(frozen=True)
class Settings:
    """All settings; `home` and `db_url` are derived when empty."""

    __pydantic_config__ = _STRICT

    home: Str = ""
    db_url: Str = ""                 # any SQLAlchemy URL; "" = sqlite under home
    store_uri: Str = ""              # file:///abs/path or s3://bucket/prefix; "" = home/store
    provider: Str = "local"          # key of spotrun.providers.PROVIDERS
    # Several clouds in one daemon (docs/clouds.md): every decision ranks the candidates of
    # all of them together; () = `provider` alone. `local` simulates one market: alone only.
    providers: StrList = ()
    db_busy_timeout_s: Num = 10.0  # longest wait for a database lock (open, read, write)
    region: Str = "us-east-1"
    local: LocalMarketSettings = field(default_factory=LocalMarketSettings)
    daemon: DaemonSettings = field(default_factory=DaemonSettings)
    agent: AgentSettings = field(default_factory=AgentSettings)
    aws: AwsSettings = field(default_factory=AwsSettings)
    gcp: GcpSettings = field(default_factory=GcpSettings)
    notify: NotifySettings = field(default_factory=NotifySettings)
    budgets: BudgetsSettings = field(default_factory=BudgetsSettings)  # docs/budgets.md
    server: ServerSettings = field(default_factory=ServerSettings)     # docs/server.md

    @property
    def clouds(self) -> tuple[str, ...]:
        """The providers this daemon places jobs on, in the order settings name them."""
        return self.providers or (self.provider,)

    @property
    def home_path(self) -> Path:
        """The resolved SPOTRUN_HOME directory."""
        return Path(self.home).expanduser().resolve()

    @property
    def database_url(self) -> str:
        """The SQLAlchemy URL of the state database."""
        return self.db_url or f"sqlite:///{self.home_path / 'spotrun.db'}"

    @property
    def store_url(self) -> str:
        """The URI of the daemon's default object store."""
        return self.store_uri or (self.home_path / "store").as_uri()


def default_home() -> str:
    """`$SPOTRUN_HOME`, else `~/.spotrun`."""
    return os.environ.get("SPOTRUN_HOME") or str(Path("~/.spotrun").expanduser())


def load_settings(home: str | None = None, overrides: dict[str, Any] | None = None) -> Settings:
    """Read settings from defaults, `spotrun.toml` under home, the environment and overrides."""
    home = home or default_home()
    raw: dict[str, Any] = {}
    path = Path(home).expanduser() / CONFIG_FILE
    if path.exists():
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot parse {path}: {exc}", field=CONFIG_FILE) from None
    raw = dict(raw)
    raw["home"] = str(Path(home).expanduser().resolve())
    if os.environ.get("SPOTRUN_DB_URL"):
        raw["db_url"] = os.environ["SPOTRUN_DB_URL"]
    for key, value in (overrides or {}).items():
        _set_dotted(raw, key, value)
    settings = validate(Settings, raw, ConfigError)
    _check_provider(settings.provider)
    _check_providers(settings.providers)
    if settings.providers:
        if "provider" in raw and raw["provider"] not in settings.providers:
            raise ConfigError(f"`provider` must be one of `providers` "
                              f"({', '.join(settings.providers)}) when both are set",
                              field="provider", value=raw["provider"],
                              hint="drop `provider`: `providers` names every cloud in use")
        # The first cloud named is the home one: its store is the jobs' own (bundles, the
        # first checkpoints) unless store_uri names one, and a verb that reads one provider
        # (doctor's first table) starts from it.
        home = raw.get("provider") or settings.providers[0]
        settings = replace(settings, provider=home, store_uri=settings.store_uri
                           or FACTS[home].store_uri(settings))
    return settings


def _check_provider(name: str, key: str = "provider") -> None:
    # Checked with the settings, before any verb opens the database or starts a market:
    # bad input writes nothing.
    if name not in PROVIDERS:
        raise ConfigError(f"unknown provider; allowed: {', '.join(PROVIDERS)}",
                          field=key, value=name)


def _check_providers(names: tuple[str, ...]) -> None:
    for name in names:
        _check_provider(name, "providers")
    if len(set(names)) != len(names):
        raise ConfigError("a provider is listed twice; allowed: each once", field="providers",
                          value=list(names))
    alone = [n for n in names if FACTS[n].runs_alone]
    if alone and len(names) > 1:
        raise ConfigError(f"`{alone[0]}` runs alone; allowed: clouds together (aws, gcp) or "
                          f"{alone[0]} alone", field="providers", value=list(names))


def _set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = raw
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
