"""Daemon/CLI settings: typed defaults declared once, read from `$SPOTRUN_HOME/spotrun.toml`.

Precedence: built-in default < spotrun.toml < environment (`SPOTRUN_HOME`, `SPOTRUN_DB_URL`).
Every setting is validated with an error naming its dotted key.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, get_type_hints

from spotrun.errors import ConfigError

CONFIG_FILE = "spotrun.toml"


@dataclass(frozen=True)
class LocalMarketSettings:
    """The local provider's simulated spot market (a separate, durable process)."""

    trace: str = ""                 # availability CSV; "" = the packaged demo extract
    prices: str = ""                # price change-point CSV; "" = the packaged extract
    pools: tuple[str, ...] = ()     # trace columns to offer; () = all
    instance_type: str = "p3.2xlarge"  # the type the trace measured
    time_scale: float = 60.0        # market seconds per wall second
    start_tick: int = 0             # trace tick at market start
    notice_s: float = 120.0         # interruption notice lead time, market seconds
    spot_price_usd_per_hour: float = 0.0  # used when there is no price file


@dataclass(frozen=True)
class DaemonSettings:
    """Loop intervals and timeouts of `spotrun daemon` (wall seconds)."""

    schedule_interval_s: float = 1.0
    reconcile_interval_s: float = 1.0
    heartbeat_interval_s: float = 1.0
    spend_interval_s: float = 5.0
    heartbeat_timeout_s: float = 300.0   # no heartbeat this long: instance is stuck
    launch_timeout_s: float = 600.0      # no running instance this long after launch
    liveness_interval_s: float = 5.0     # how often the daemon proves it is alive to agents
    deadman_timeout_s: float = 1800.0    # agents shut down after this much daemon silence
    lease_ttl_s: float = 30.0            # a daemon lease not renewed this long is free
    lease_renew_interval_s: float = 5.0  # how often the lease holder renews it
    orphan_interval_s: float = 10.0      # how often the orphan sweeper looks
    orphan_grace_s: float = 60.0         # an unowned spotrun instance lives this long first
    # Deadline jobs: the shared placement policy (spotrun.policy) decides each interval.
    policy: str = "spotrun"              # a name in spotrun.policy.POLICIES
    policy_tick_s: float = 0.0           # decision interval, provider-clock seconds;
    #   0 = the local market's trace tick, else 300
    policy_changeover_s: float = 0.0     # restart overhead the policy assumes, provider
    #   seconds; 0 = the cost model's restart estimate for the pool
    price_interval_s: float = 300.0      # how often spot price history is recorded (PricePoint)


@dataclass(frozen=True)
class AgentSettings:
    """Defaults for agents on instances (wall seconds, before market time scaling)."""

    heartbeat_interval_s: float = 2.0
    notice_poll_interval_s: float = 5.0
    log_flush_interval_s: float = 2.0


@dataclass(frozen=True)
class AwsSettings:
    """The `aws` provider: where instances launch and how the client behaves."""

    ami_id: str = ""                       # an AMI with NVIDIA drivers (e.g. a Deep Learning AMI)
    subnets: tuple[str, ...] = ()          # "zone=subnet-id" each; () = default VPC by zone
    security_group_ids: tuple[str, ...] = ()
    key_name: str = ""                     # "" = no SSH key
    instance_profile_arn: str = ""         # role the agent uses for S3 (and SSM secrets)
    endpoint_url: str = ""                 # "" = AWS; tests point it at moto on 127.0.0.1
    spotrun_install: str = "spotrun"       # pip spec the user data installs on the instance
    volume_size_gb: int = 200              # root volume (gp3), deleted with the instance
    launch_api: str = "fleet"              # "fleet" (create_fleet instant) or "run_instances"
    retry_attempts: int = 6                # tries per call on throttling / 5xx
    retry_base_s: float = 0.5              # jittered exponential back-off base
    retry_max_s: float = 20.0              # longest single back-off
    capacity_cooldown_s: float = 600.0     # skip a pool this long after a capacity error
    imds_endpoint: str = "http://169.254.169.254"   # what agents poll for notices
    # Reclaim risk (docs/cost-model.md "Reclaim risk per pool"); "" = no advisor file.
    spot_advisor_url: str = "https://spot-bid-advisor.s3.amazonaws.com/spot-advisor-data.json"
    spot_advisor_max_age_s: float = 86400.0   # refetch the cached advisor file after this
    placement_scores: bool = True             # ask ec2 get_spot_placement_scores per type


@dataclass(frozen=True)
class NotifySettings:
    """Alerts (`[notify]`, see docs/alerts.md): Slack-compatible webhooks and what goes where."""

    webhooks: tuple[str, ...] = ()       # "name=https://hooks..." each; () = no alerts
    routes: tuple[str, ...] = ()         # "event=name,name" each; an event not named goes
    #   to every webhook; "event=" sends it nowhere (events: spotrun.notify.EVENTS)
    budget_warn_fraction: float = 0.8    # the "budget 80%" alert's threshold
    interval_s: float = 2.0              # how often the daemon looks for new events (wall)
    timeout_s: float = 10.0              # one HTTP POST
    retry_attempts: int = 4              # tries per delivery round (tenacity)
    retry_base_s: float = 1.0            # exponential back-off between tries
    retry_max_s: float = 30.0
    max_rounds: int = 20                 # rounds before a message is given up (logged)


@dataclass(frozen=True)
class Settings:
    """All settings; `home` and `db_url` are derived when empty."""

    home: str = ""
    db_url: str = ""                 # any SQLAlchemy URL; "" = sqlite under home
    store_uri: str = ""              # file:///abs/path or s3://bucket/prefix; "" = home/store
    provider: str = "local"          # key of spotrun.providers.PROVIDERS
    db_busy_timeout_s: float = 10.0  # longest wait for a database lock (open, read, write)
    region: str = "us-east-1"
    local: LocalMarketSettings = field(default_factory=LocalMarketSettings)
    daemon: DaemonSettings = field(default_factory=DaemonSettings)
    agent: AgentSettings = field(default_factory=AgentSettings)
    aws: AwsSettings = field(default_factory=AwsSettings)
    notify: NotifySettings = field(default_factory=NotifySettings)

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
    settings = _build(Settings, raw, "")
    _check_provider(settings.provider)
    return settings


def _check_provider(name: str) -> None:
    # Checked with the settings, before any verb opens the database or starts a market:
    # bad input writes nothing.
    from spotrun.providers import PROVIDERS
    if name not in PROVIDERS:
        raise ConfigError(f"unknown provider; allowed: {', '.join(PROVIDERS)}",
                          field="provider", value=name)


def with_overrides(settings: Settings, **changes: Any) -> Settings:
    """A copy of settings with top-level fields replaced."""
    return replace(settings, **changes)


def _set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = raw
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def _build(cls: type, raw: Any, prefix: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError("must be a table", field=prefix.rstrip(".") or "config", value=raw)
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    for key in raw:
        if key not in known:
            raise ConfigError(f"unknown setting; allowed: {', '.join(sorted(known))}",
                              field=f"{prefix}{key}", value=key)
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in raw:
            continue
        kwargs[f.name] = _coerce(hints[f.name], raw[f.name], f"{prefix}{f.name}")
    return cls(**kwargs)


def _coerce(typ: Any, value: Any, name: str) -> Any:
    if is_dataclass(typ):
        return _build(typ, value, name + ".")
    if typ is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError("must be true or false", field=name, value=value)
    if typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
            return float(value)
        raise ConfigError("must be a number >= 0", field=name, value=value)
    if typ is int:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        raise ConfigError("must be an integer >= 0", field=name, value=value)
    if typ is str:
        if isinstance(value, str):
            return value
        raise ConfigError("must be a string", field=name, value=value)
    if getattr(typ, "__origin__", None) is tuple:
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ConfigError("must be a list of strings", field=name, value=value)
    return value
