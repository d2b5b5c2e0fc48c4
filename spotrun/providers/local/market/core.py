"""The market itself: launches, watches, reclaims and terminates local instances.

One object owns the state dir. A background thread (`watch`) reaps instance
processes, kills spot instances at their reclaim time and finishes terminations.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spotrun.errors import BadInputError
from spotrun.providers.local.market import procs
from spotrun.providers.local.market.clock import (CLOCK_FILE, MarketClock, SystemClock, WallClock,
                                                 read_clock_file)
from spotrun.providers.local.market.imds import TokenMinter
from spotrun.providers.local.market.options import MarketOptions
from spotrun.providers.local.market.state import InstanceRecord, MarketState, write_json_atomic
from spotrun.providers.base import Pool
from spotrun.providers.base import TAG_JOB
from spotrun.states import InstanceState, Market as MarketKind, TerminationCause

IMDS_ENV = "SPOTRUN_IMDS_ENDPOINT"
IMDS_DISCOVERY_ENV = "SPOTRUN_IMDS_DISCOVERY"   # market.json: where IMDS is after a restart
POLL_S = 0.1           # longest wall wait between watcher passes
# A reclaim carried out more than this many wall seconds after its time (the market was
# down, so nothing killed the instance) is reported when it really happened: the instance
# ran, and is billed, until then. Within it, the reclaim time itself (watcher latency).
LATE_RECLAIM_WALL_S = 1.0
_DEFINING = ("trace", "prices", "pools", "instance_type", "time_scale", "start_tick", "notice_s",
             "spot_price_usd_per_hour", "region", "pacing")
# What an instance's agent reports to a paced market (PUT latest/spotrun/phase): the job
# trains, so its start-up is over.
PHASES = ("training",)


@dataclass(frozen=True)
class Interrupted:
    """What an interrupt did: the instance after it, and when its reclaim comes."""

    record: InstanceRecord
    already_noticed: bool     # a notice was posted before: the reclaim stays or comes sooner
    reclaim_in_s: float       # market seconds from the interrupt to the reclaim


class LaunchRefused(Exception):
    """No candidate had capacity; carries the reason per pool (HTTP 409)."""

    def __init__(self, reasons: dict[str, str]) -> None:
        super().__init__("no candidate has capacity")
        self.reasons = reasons


class Market:
    """The market's behaviour; the HTTP server and tests drive it."""

    def __init__(self, state_dir: Path, options: MarketOptions, *,
                 wall: WallClock | None = None) -> None:
        self.dir = Path(state_dir)
        self.state = MarketState(self.dir)
        self.wall = wall or SystemClock()
        stored = self.state.get_meta("options")
        if stored:
            # The state dir defines the market; a restart keeps its trace, scale and epoch.
            old = MarketOptions.from_dict(json.loads(stored))
            self.ignored = [k for k in _DEFINING if getattr(old, k) != getattr(options, k)]
            options = MarketOptions.from_dict({**json.loads(options.to_json()),
                                               **{k: getattr(old, k) for k in _DEFINING}})
        else:
            self.ignored = []
        self.options = options.validate()
        self.book = options.load_book()
        self.state.set_meta("options", options.to_json())
        epoch = self.state.get_meta("epoch_wall_s")
        if epoch is None:
            epoch = repr(self.wall.time())
            self.state.set_meta("epoch_wall_s", epoch)
        secret = self.state.get_meta("secret") or secrets.token_hex(32)
        self.state.set_meta("secret", secret)
        stored_clock = read_clock_file(self.dir / CLOCK_FILE, self.wall)
        self.clock = MarketClock(float(epoch), options.time_scale, options.start_tick,
                                 self.book.trace.tick_s, self.wall,
                                 stored_clock.segments if stored_clock else [])
        self._write_clock()
        # Paced markets: the launch wall time of each instance whose job has not reported
        # training yet. In memory: instances adopted after a restart count as training.
        self._starting: dict[str, float] = {}
        self.minter = TokenMinter(secret.encode(), self.wall.time)
        self.imds_base = ""          # set by the server once its port is known
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._exited_wall: dict[str, float] = {}
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- clock and pools ------------------------------------------------------------
    def now_s(self) -> float:
        """Market time now."""
        return self.clock.now_s()

    def pools(self, instance_types: list[str] | None = None) -> list[dict[str, Any]]:
        """Per type and zone: spot availability and price now (default: the trace type)."""
        pos = self.clock.position(self.now_s())
        out = []
        for itype in instance_types or [self.options.instance_type]:
            od = self.book.on_demand_price(itype)
            out += [{"zone": z, "instance_type": itype, "available": self.book.available(z, pos),
                     "spot_price_usd_per_hour": self.book.spot_price(itype, z, pos),
                     "on_demand_price_usd_per_hour": od} for z in self.book.zones]
        return out

    # ---- launch -----------------------------------------------------------------------
    def launch(self, *, client_token: str | None, candidates: list[Pool], user_data: str,
               tags: dict[str, str], max_price_usd_per_hour: float | None = None,
               instance_env: dict[str, str] | None = None) -> InstanceRecord:
        """Start one instance in the first candidate pool with capacity (idempotent by token)."""
        if not candidates:
            raise BadInputError("at least one candidate is needed", field="candidates")
        with self._lock:
            if client_token:
                existing = self.state.by_token(client_token)
                if existing is not None:
                    return existing
            now = self.now_s()
            pos = self.clock.position(now)
            reasons: dict[str, str] = {}
            for cand in candidates:
                refusal, price = self._refusal(cand, pos, max_price_usd_per_hour)
                if refusal:
                    reasons[cand.key()] = refusal
                    continue
                return self._start(cand, client_token, user_data, tags, price, now, pos,
                                   instance_env or {})
            raise LaunchRefused(reasons)

    def _refusal(self, cand: Pool, pos: float,
                 max_price: float | None) -> tuple[str | None, float | None]:
        od = self.book.on_demand_price(cand.instance_type)
        if od is None:
            return "unknown or unpriced instance type", None
        if self.book.zone_index(cand.zone) < 0:
            return f"unknown zone (allowed: {', '.join(self.book.zones)})", None
        if cand.market is MarketKind.ON_DEMAND:
            return None, od
        if not self.book.available(cand.zone, pos):
            return "InsufficientInstanceCapacity: no spot capacity in this pool now", None
        price = self.book.spot_price(cand.instance_type, cand.zone, pos)
        if price is None:
            return "no spot price for this pool", None
        if max_price is not None and price > max_price:
            return f"spot price {price:.4f} above max {max_price:.4f}", None
        return None, price

    def _start(self, cand: Pool, token: str | None, user_data: str, tags: dict[str, str],
               price: float | None, now: float, pos: float,
               instance_env: dict[str, str]) -> InstanceRecord:
        iid = "i-" + secrets.token_hex(9)[:17]
        disk = self.dir / "instances" / iid
        disk.mkdir(parents=True)
        ud_path = disk / "user-data.json"
        ud_path.write_text(user_data, encoding="utf-8")
        notice_at = reclaim_at = None
        if cand.market is MarketKind.SPOT:
            row = self.book.next_unavailable(cand.zone, pos)
            if row is not None:
                reclaim_at = self.clock.time_of(row)
                notice_at = max(now, reclaim_at - self.options.notice_s)
        rec = InstanceRecord(instance_id=iid, client_token=token, instance_type=cand.instance_type,
                             zone=cand.zone, market=cand.market, state=InstanceState.PENDING,
                             launched_at=now, tags=dict(tags), price_usd_per_hour=price,
                             notice_at=notice_at, reclaim_at=reclaim_at)
        self.state.insert(rec)   # recorded before the process exists: a crash leaves a trace
        # The launch's own variables (its job's env: secrets) only reach the instance's
        # process; they are never written to the state dir.
        env = {**os.environ, **instance_env}
        env[procs.INSTANCE_ENV] = iid
        if self.imds_base:
            env[IMDS_ENV] = f"{self.imds_base}/{iid}"
            env[IMDS_DISCOVERY_ENV] = str((self.dir / "market.json").resolve())
        popen = procs.spawn(self._argv(ud_path), cwd=disk, env=env, log_path=disk / "console.log")
        self._children[iid] = popen
        self._starting[iid] = self.wall.time()
        threading.Thread(target=self._wait_child, args=(iid, popen), daemon=True).start()
        rec = rec.with_(state=InstanceState.RUNNING, pid=popen.pid,
                        pid_start_ticks=procs.start_ticks(popen.pid))
        self.state.save(rec)
        self._pace(self.wall.time())
        self._wake.set()
        return rec

    def _argv(self, user_data_path: Path) -> list[str]:
        if self.options.instance_command:
            return shlex.split(self.options.instance_command)
        return [sys.executable, "-m", "spotrun", "agent", "--user-data", str(user_data_path)]

    def _wait_child(self, iid: str, popen: subprocess.Popen[bytes]) -> None:
        popen.wait()   # reaps the leader and stamps its exit time precisely
        self._exited_wall[iid] = self.wall.time()
        self._wake.set()

    def user_data(self, instance_id: str) -> str | None:
        """The user data an instance was launched with."""
        try:
            return (self.dir / "instances" / instance_id / "user-data.json").read_text("utf-8")
        except OSError:
            return None

    # ---- describe / terminate / interrupt ---------------------------------------------
    def describe(self, *, job_id: str | None = None,
                 instance_ids: list[str] | None = None) -> list[InstanceRecord]:
        """Instances, terminated included, optionally of one job (tag) or these ids."""
        out = self.state.all()
        if instance_ids is not None:
            wanted = set(instance_ids)
            out = [r for r in out if r.instance_id in wanted]
        if job_id is not None:
            out = [r for r in out if r.tags.get(TAG_JOB) == job_id]
        return out

    def terminate(self, instance_id: str) -> InstanceRecord | None:
        """SIGTERM the instance; the watcher SIGKILLs it after the grace. Idempotent."""
        with self._lock:
            rec = self.state.get(instance_id)
            if rec is None or rec.state.is_terminal() or rec.term_wall_s is not None:
                return rec
            procs.signal_instance(rec.instance_id, rec.pid, rec.pid_start_ticks, signal.SIGTERM)
            rec = rec.with_(state=InstanceState.SHUTTING_DOWN, term_wall_s=self.wall.time())
            self.state.save(rec)
        self._wake.set()
        return rec

    def interrupt(self, instance_id: str, in_s: float, notice: bool = True) -> Interrupted:
        """Force a reclaim of a spot instance in_s market seconds from now, or sooner: a
        pending reclaim (the trace's, an earlier interrupt's) is never moved later, and a
        notice already posted stays posted (its job was told that reclaim time)."""
        if in_s < 0:
            raise BadInputError("must be >= 0", field="in_s", value=in_s)
        with self._lock:
            rec = self.state.get(instance_id)
            if rec is None or rec.state is not InstanceState.RUNNING:
                raise BadInputError("no running instance with this id", field="instance_id",
                                    value=instance_id)
            if rec.market is not MarketKind.SPOT:
                raise BadInputError("only spot instances are reclaimed", field="instance_id",
                                    value=instance_id)
            now = self.now_s()
            noticed = (rec.notice_at is not None and rec.reclaim_at is not None
                       and now >= rec.notice_at)
            reclaim = now + in_s
            kept = rec.reclaim_at is not None and rec.reclaim_at <= reclaim
            reclaim = min(reclaim, rec.reclaim_at if rec.reclaim_at is not None else reclaim)
            asked = max(now, reclaim - self.options.notice_s) if notice else None
            if noticed:
                notice_at = rec.notice_at
            elif kept and rec.notice_at is not None:   # the pending reclaim's own notice
                notice_at = rec.notice_at if asked is None else min(rec.notice_at, asked)
            else:
                notice_at = asked
            rec = rec.with_(reclaim_at=reclaim, notice_at=notice_at)
            self.state.save(rec)
            if reclaim <= now:
                self.step()
        self._wake.set()
        return Interrupted(self.state.get(instance_id) or rec, noticed, max(reclaim - now, 0.0))

    # ---- the watcher ------------------------------------------------------------------
    def step(self) -> float:
        """One watcher pass; returns wall seconds until the next thing is due (<= POLL_S)."""
        wait = POLL_S
        with self._lock:
            now_wall = self.wall.time()
            now = self.clock.market_s(now_wall)
            for rec in self.state.all(live_only=True):
                wait = min(wait, self._step_one(rec, now, now_wall))
            self._reap()
            self._pace(now_wall)
        return max(wait, 0.0)

    # ---- pacing (docs/local-provider.md) -------------------------------------------------
    def report_phase(self, instance_id: str, phase: str) -> None:
        """An instance's agent says its job trains (its start-up is over)."""
        if phase not in PHASES:
            raise BadInputError(f"must be one of {', '.join(PHASES)}", field="phase", value=phase)
        with self._lock:
            self._starting.pop(instance_id, None)
            self._pace(self.wall.time())
        self._wake.set()

    def _rate_for(self, rec: InstanceRecord, now: float, now_wall: float) -> float:
        """The fastest the clock may run for this instance now."""
        started = self._starting.get(rec.instance_id)
        if started is not None and now_wall - started < self.options.startup_max_s:
            if now < rec.launched_at + self.options.boot_s_of(rec.instance_type):
                return self.options.time_scale   # the OS boots: market time, nothing real to wait for
            return 1.0   # the job starts: imports, data loading, restore take real time
        if rec.notice_at is not None and rec.reclaim_at is not None and now >= rec.notice_at:
            return self.options.notice_rate()   # its saves need the wall time they need
        return self.options.time_scale

    def _pace(self, now_wall: float) -> None:
        """Set the clock's rate for what the live instances do now (rehearsal pacing only)."""
        if self.options.pacing != "rehearsal":
            return
        now = self.clock.market_s(now_wall)
        live = [r for r in self.state.all(live_only=True) if r.state is InstanceState.RUNNING]
        rate = min([self._rate_for(r, now, now_wall) for r in live]
                   + [self.options.time_scale])
        if self.clock.set_rate(rate, now_wall):
            self._write_clock()

    def _write_clock(self) -> None:
        """clock.json: the provider, the audit and a restarted market compute time from it."""
        write_json_atomic(self.dir / CLOCK_FILE, self.clock.to_json())

    def _alive(self, rec: InstanceRecord) -> bool:
        if rec.instance_id in self._exited_wall:
            return False
        if rec.instance_id in self._children:
            return True
        return procs.is_alive(rec.pid, rec.pid_start_ticks)

    def _step_one(self, rec: InstanceRecord, now: float, now_wall: float) -> float:
        if rec.reclaim_at is not None and now >= rec.reclaim_at \
                and rec.state is InstanceState.RUNNING:
            late = now_wall - self.clock.wall_s(rec.reclaim_at) > LATE_RECLAIM_WALL_S
            if not late:
                self._end(rec, TerminationCause.SPOT_RECLAIM, rec.reclaim_at, kill=True)
                return 0.0
            if self._alive(rec):   # it ran on unwatched: reclaimed now, billed until now
                self._end(rec, TerminationCause.SPOT_RECLAIM, now, kill=True)
                return 0.0
            # Late and already gone: it ended on its own, unwatched (the exit branch below).
        if rec.pid is None:
            # Recorded but never started (the market died mid-launch).
            self._end(rec, TerminationCause.UNKNOWN, now, kill=False)
            return POLL_S
        if not self._alive(rec):
            exited = self._exited_wall.get(rec.instance_id, now_wall)
            cause = TerminationCause.USER if rec.term_wall_s is not None \
                else TerminationCause.INSTANCE_SHUTDOWN
            self._end(rec, cause, self.clock.market_s(exited), kill=True)
            return POLL_S
        if rec.term_wall_s is not None:
            left = rec.term_wall_s + self.options.grace_s - now_wall
            if left <= 0:
                self._end(rec, TerminationCause.USER, now, kill=True)
            return max(left, 0.0)
        if rec.reclaim_at is not None and rec.state is InstanceState.RUNNING:
            due = rec.reclaim_at if rec.notice_at is None or now >= rec.notice_at \
                else rec.notice_at   # a paced clock slows down from the notice on
            return self.clock.wall_s(due) - now_wall
        return POLL_S

    def _end(self, rec: InstanceRecord, cause: TerminationCause, ended_at: float,
             kill: bool) -> None:
        if kill:
            procs.kill_instance(rec.instance_id, rec.pid, rec.pid_start_ticks)
        self.state.save(rec.with_(state=InstanceState.TERMINATED, cause=cause,
                                  ended_at=max(ended_at, rec.launched_at)))
        self._starting.pop(rec.instance_id, None)

    def _reap(self) -> None:
        for iid in list(self._children):
            if self._children[iid].poll() is not None and iid in self._exited_wall:
                del self._children[iid]

    def start_watcher(self) -> None:
        """Run step() in a background thread until close()."""
        self.step()   # adopt or end instances left from a previous run at once
        self._thread = threading.Thread(target=self._watch, name="market-watcher", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            wait = self.step()
            self._wake.wait(wait)
            self._wake.clear()

    def terminate_all(self, deadline_wall_s: float) -> None:
        """Terminate every live instance and wait (until a wall deadline) until they are gone."""
        for rec in self.state.all(live_only=True):
            self.terminate(rec.instance_id)
        pause = threading.Event()   # never set: a plain bounded wait between passes
        while self.state.all(live_only=True) and self.wall.time() < deadline_wall_s:
            pause.wait(min(POLL_S, self.step() or POLL_S))
        with self._lock:
            for rec in self.state.all(live_only=True):
                self._end(rec, TerminationCause.USER, self.now_s(), kill=True)

    def close(self) -> None:
        """Stop the watcher and close the state (instances keep running)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.state.close()
