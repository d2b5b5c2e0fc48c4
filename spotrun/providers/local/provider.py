"""The `local` provider: instances are process groups run by the local spot market.

The market is a separate durable process (spotrun.providers.local.market); this provider only
talks HTTP to it, starting it detached when none runs, so a daemon restart finds
its instances where it left them. Times are the market's clock.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, Callable, TypeVar

from spotrun.catalog import Catalog, load_catalog
from spotrun.errors import CapacityError, ProviderError
from spotrun.providers.local.market.client import (MarketClient, MarketRefused, ensure_market,
                                                  read_live_info)
from spotrun.providers.local.market.clock import (CLOCK_FILE, MarketClock, SystemClock, WallClock,
                                                 read_clock_file, to_dt)
from spotrun.providers.local.market.options import MarketOptions
from spotrun.providers.base import (TAG_ATTEMPT, TAG_JOB, TAG_MANAGED, TAG_NODE, InstanceInfo,
                                    Interruption, LaunchPlan, LaunchRequest, Pool, PoolView,
                                    PricePoint, RestingMarket)
from spotrun.providers.local import LOCAL_FEATURES
from spotrun.states import InstanceState, Market, TerminationCause
from spotrun.providers.pricing import Pricing

T = TypeVar("T")
LOCAL_IP = "127.0.0.1"   # every local instance is a process group on this machine


def group_token(token: str, k: int, pool_index: int = 0) -> str:
    """The client token of the k-th instance of a group launch (`<token>-<k>` in the first
    pool; a later candidate pool gets its own tokens, the first pool's being spent)."""
    return f"{token}-{k}" if pool_index == 0 else f"{token}-p{pool_index}-{k}"


def _stamp(path: Path) -> tuple[int, int]:
    """Identity of a file version: each atomic rewrite is a new inode."""
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


def _dt(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def info_from_json(raw: dict[str, Any]) -> InstanceInfo:
    """InstanceInfo from the market's JSON view of an instance."""
    launched = _dt(raw["launched_at"])
    assert launched is not None
    return InstanceInfo(
        instance_id=raw["instance_id"], instance_type=raw["instance_type"], zone=raw["zone"],
        market=Market(raw["market"]), state=InstanceState(raw["state"]), launched_at=launched,
        ended_at=_dt(raw.get("ended_at")),
        cause=TerminationCause(raw["cause"]) if raw.get("cause") else None,
        tags=dict(raw.get("tags") or {}), price_usd_per_hour=raw.get("price_usd_per_hour"),
        client_token=raw.get("client_token"), notice_at=_dt(raw.get("notice_at")),
        private_ip=LOCAL_IP)


class LocalProvider(Pricing):
    """Provider backed by a local market process (see spotrun.providers.local.market)."""

    name = "local"
    features = LOCAL_FEATURES
    snapshot_source = "live (local market)"

    def __init__(self, client: MarketClient | None = None, *, region: str = "us-east-1",
                 state_dir: Path | None = None, options: MarketOptions | None = None,
                 catalog: Catalog | None = None, wall: WallClock | None = None) -> None:
        if client is None and (state_dir is None or options is None):
            raise ProviderError("a market client, or a state dir and options, are needed",
                                field="provider", value="local")
        self._client = client
        self.state_dir = state_dir
        self.options = options
        self.region = region
        self.catalog = catalog or load_catalog()
        self.wall = wall or SystemClock()
        self._clock: dict[str, Any] | None = None
        self._clock_file: tuple[tuple[int, int], MarketClock] | None = None
        self._zones: tuple[MarketClient, list[str]] | None = None

    @classmethod
    def from_settings(cls, settings: Any, **kw: Any) -> "LocalProvider":
        """The provider for settings: the market in $SPOTRUN_HOME/market, started on first use."""
        options = MarketOptions.from_settings(settings)
        return cls(state_dir=settings.home_path / "market", options=options,
                   region=settings.region, **kw)

    # ---- plumbing -------------------------------------------------------------------
    @property
    def client(self) -> MarketClient:
        """The market client (starts the market detached if none runs yet)."""
        if self._client is None:
            assert self.state_dir is not None and self.options is not None
            self._client = ensure_market(self.state_dir, self.options)
        return self._client

    def _call(self, fn: Callable[[MarketClient], T]) -> T:
        try:
            return fn(self.client)
        except MarketRefused:
            raise
        except ProviderError:
            if self.state_dir is None or self.options is None:
                raise
            # The market died: start it again on the same dir (it re-adopts its instances).
            self._client = ensure_market(self.state_dir, self.options)
            return fn(self._client)

    # ---- Provider ---------------------------------------------------------------------
    def zones(self) -> list[str]:
        """The trace's zones (asked once of each market process: its trace is fixed)."""
        held = self._zones
        if held is None or held[0] is not self._client:
            zones = sorted({p["zone"] for p in self._call(lambda c: c.pools())})
            held = self._zones = (self.client, zones)
        return list(held[1])

    def now(self) -> datetime:
        """Market time, computed from the clock the market publishes (no call per read)."""
        clock = self._market_clock()
        if clock is not None:
            return to_dt(clock.market_s(self.wall.time()))
        if self._clock is None:
            self._clock = self._call(lambda c: c.time())
        epoch = float(self._clock["epoch_wall_s"])
        return to_dt(epoch + (self.wall.time() - epoch) * float(self._clock["time_scale"]))

    def _market_clock(self) -> MarketClock | None:
        """The state dir's clock.json, re-read only when the market rewrote it (a rate change)."""
        if self.state_dir is None:
            return None
        path = self.state_dir / CLOCK_FILE
        try:
            stamp = _stamp(path)
        except OSError:
            self.client   # starts the market, which writes the file
            try:
                stamp = _stamp(path)
            except OSError:
                return None
        if self._clock_file is None or self._clock_file[0] != stamp:
            clock = read_clock_file(path, self.wall)
            if clock is None:
                return None
            self._clock_file = (stamp, clock)
        return self._clock_file[1]

    def plan_launch(self, request: LaunchRequest) -> LaunchPlan:
        """Pure: the POST /instances that launch() would send (one per instance of a group,
        shown for the first candidate pool; a later pool gets the same calls)."""
        if request.count > 1:
            return LaunchPlan(provider=self.name, request=request, calls=tuple(
                {"method": "POST", "path": "/instances",
                 "body": self._body(request, group_token(request.client_token, k),
                                    request.candidates[:1], request.rank_of(k))}
                for k in range(request.count)))
        body = self._body(request, request.client_token, request.candidates,
                          request.rank_of(0) if request.node_ranks != (0,) else None)
        return LaunchPlan(provider=self.name, request=request,
                          calls=({"method": "POST", "path": "/instances", "body": body},))

    @staticmethod
    def _body(request: LaunchRequest, token: str, pools: tuple[Pool, ...],
              rank: int | None) -> dict[str, Any]:
        tags = {**request.tags, TAG_MANAGED: "true", TAG_JOB: request.job_id,
                TAG_ATTEMPT: str(request.attempt_number)}
        if rank is not None:
            tags[TAG_NODE] = str(rank)
        return {"client_token": token,
                "candidates": [{"instance_type": p.instance_type, "zone": p.zone,
                                "market": p.market.value} for p in pools],
                "tags": tags, "max_price_usd_per_hour": request.max_price_usd_per_hour,
                "user_data": f"<{len(request.user_data)} bytes>"}

    def launch(self, plan: LaunchPlan) -> InstanceInfo:
        """Start the instance (idempotent by client token); CapacityError if no pool has room."""
        body = dict(plan.calls[0]["body"], user_data=plan.request.user_data)
        try:
            raw = self._call(lambda c: c.launch(body))
        except MarketRefused as exc:
            raise _capacity_error(exc, plan.request.candidates) from None
        return info_from_json(raw)

    def launch_group(self, plan: LaunchPlan) -> list[InstanceInfo]:
        """`count` market launches in one pool, tokens `<token>-<k>`; all or none.

        Pools are tried in order; a pool that refuses any one of them gets the ones it
        started terminated before the next is tried, so no partial group is left running.
        """
        req = plan.request
        held = self._live_group(req)
        if held is not None:
            return held
        reasons: list[str] = []
        for j, pool in enumerate(req.candidates):
            started: list[InstanceInfo] = []
            try:
                for k in range(req.count):
                    body = dict(self._body(req, group_token(req.client_token, k, j), (pool,),
                                           req.rank_of(k)), user_data=req.user_data)
                    info = info_from_json(self._call(lambda c: c.launch(body)))
                    started.append(info)
                    if info.state.is_terminal():   # a spent token from an earlier partial try
                        raise MarketRefused({pool.key(): "the group's earlier try ended"})
                return started
            except MarketRefused as exc:
                reasons.append(exc.message)
                for info in started:
                    self.terminate(info.instance_id)
        raise _capacity_error(MarketRefused({"group": "; ".join(reasons)[:400]}),
                              req.candidates)

    def _live_group(self, req: LaunchRequest) -> list[InstanceInfo] | None:
        """A retry's answer: the complete live group this token already started, if any."""
        mine = [i for i in self.describe(job_id=req.job_id)
                if i.client_token and i.client_token.startswith(req.client_token + "-")
                and not i.state.is_terminal()]
        for j in range(len(req.candidates)):
            want = [group_token(req.client_token, k, j) for k in range(req.count)]
            by_token = {i.client_token: i for i in mine if i.client_token in want}
            if len(by_token) == req.count:
                return [by_token[t] for t in want]
        return None

    def interrupt(self, instance_ids: list[str], notice_s: float = 120.0) -> list[Interruption]:
        """The market's /admin/interrupt for each: notice now, the reclaim notice_s market
        seconds later (0: reclaimed at once, without a notice); a reclaim the market already
        has is never moved later, and one with a posted notice keeps its time."""
        in_s = max(float(notice_s), 0.0)
        out = []
        for iid in instance_ids:
            got = self._call(lambda c: c.interrupt(iid, in_s=in_s, notice=in_s > 0))
            # A market process older than this client does not say: the ask is what it did.
            in_market_s = got.get("reclaim_in_s")
            out.append(Interruption(instance_id=iid, reclaim_in_s=in_s if in_market_s is None
                                    else float(in_market_s),
                                    reclaim_at=_dt(got.get("reclaim_at")),
                                    already_noticed=bool(got.get("already_noticed"))))
        return out

    def describe(self, *, job_id: str | None = None,
                 instance_ids: list[str] | None = None) -> list[InstanceInfo]:
        """Instances (terminated included), optionally of one job or these ids."""
        raws = self._call(lambda c: c.instances(job_id=job_id, ids=instance_ids))
        return [info_from_json(r) for r in raws]

    def terminate(self, instance_id: str) -> None:
        """Terminate (SIGTERM, then SIGKILL after the market's grace); idempotent."""
        self._call(lambda c: c.terminate(instance_id))

    def spot_price(self, instance_type: str, zone: str) -> float | None:
        """Spot USD/h now, or None for an unknown pool."""
        return self._call(lambda c: c.price(instance_type, zone))

    def _price_points(self, instance_type: str, zones: list[str], start: datetime,
                      end: datetime) -> list[PricePoint]:
        """Change points in [start, end] (market clock), plus the one in effect at start."""
        raws = self._call(lambda c: c.price_history(instance_type, zones, start.timestamp(),
                                                    end.timestamp()))
        return [PricePoint(instance_type, r["zone"], to_dt(r["ts_s"]), r["price_usd_per_hour"])
                for r in raws]

    def market_view(self, instance_types: list[str] | None = None) -> list[PoolView]:
        """Per (type, zone): spot available now and prices now (default: every priced type)."""
        types = instance_types or [n for n in self.catalog.names()
                                   if self.catalog.get(n).on_demand_price(self.region)]
        raws = self._call(lambda c: c.pools(types))
        return [PoolView(r["instance_type"], r["zone"], bool(r["available"]),
                         r["spot_price_usd_per_hour"], r["on_demand_price_usd_per_hour"])
                for r in raws]

    def risk_hints(self, instance_types: list[str], zones: list[str]) -> dict[tuple[str, str], Any]:
        """None: the local market's reclaims come from its trace, which the priors already use."""
        return {}

    def decision_grid(self) -> tuple[float, float]:
        """(origin, tick) in market seconds: the replayed trace's row boundaries."""
        info = self._call(lambda c: c.time())
        return float(info["epoch_wall_s"]), float(info["tick_s"])

    def resting_market(self, instance_types: list[str]) -> RestingMarket | None:
        """The market not running: its order book at the trace row it would start from, read
        in-process (nothing started, nothing written); None while it runs (read it live)."""
        if self._client is not None or (self.state_dir is not None
                                        and read_live_info(self.state_dir)):
            return None
        assert self.options is not None
        book = self.options.load_book()
        pos = float(self.options.start_tick)
        names = [t for t in instance_types if book.on_demand_price(t) is not None]
        return RestingMarket(
            at=to_dt(self.wall.time()), zones=tuple(book.zones),
            source=f"local market trace at row {self.options.start_tick} (market not running)",
            pools=tuple(PoolView(t, z, book.available(z, pos), book.spot_price(t, z, pos),
                                 book.on_demand_price(t)) for t in names for z in book.zones),
            on_demand={t: book.on_demand_price(t) for t in instance_types})

    def offline_tick_s(self) -> float:
        """The trace's tick in market seconds, read without a running market."""
        assert self.options is not None
        return float(self.options.load_trace().tick_s)


def _capacity_error(exc: MarketRefused, candidates: tuple[Pool, ...]) -> CapacityError:
    first = candidates[0] if candidates else None
    return CapacityError(exc.message, instance_type=first.instance_type if first else "",
                         zone=first.zone if first else "",
                         market=first.market.value if first else "")
