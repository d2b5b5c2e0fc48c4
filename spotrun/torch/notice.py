"""Honour the interruption notice wherever the loop is, then save once more just before the end.

`NoticeGuard` is the part of the `Checkpointer` that an integration (a Hugging
Face `Trainer` callback, a Lightning callback) can drive with its own save
function. It knows three things:

* **When the state is consistent.** From `step_finished(n)` (an optimizer step
  has finished, the scheduler has stepped) until `step_started()` (the next
  step is about to change the weights) the state is "clean at step n". A save
  of step n may then run from any thread while the loop evaluates, loads data
  or logs. `step_started()` blocks while such a save copies the state.
  `step_touched(record)` is the middle ground: the loop is about to change
  something the owner can record first (a train-mode forward updates BatchNorm
  statistics; the Checkpointer keeps a copy of the buffers as of step n), so
  step n can still be saved; a step may be under way, so the watchdog then
  waits about two step times for the boundary before it saves.
* **That a notice came.** SIGUSR1 (the agent's interruption notice), or the
  notice file the agent writes first (`$SPOTRUN_NOTICE_FILE`, JSON with the
  termination time). The file is read when the guard starts, so a notice sent
  before the training program got this far is not lost; the watchdog thread
  also re-reads it, so a signal the process never saw is still honoured.
* **When to save.** `"emergency"`: at once - at the next step boundary, or, if
  the loop does not reach one within `grace_s` while the state is clean, from
  the watchdog thread (the loop carries on; it only waits in `step_started()`
  while the state is copied). `"last"`: once the emergency checkpoint is in,
  one more save as late as is safe - termination time minus the measured
  duration of the emergency save minus `margin_s` - so the work lost per
  reclaim is bounded by one save, not by the notice window.

The integration API, all cheap enough to call on every step:

    guard = NoticeGuard(save=my_save)          # my_save(step, kind, release) -> None
    guard.start()                              # reads a pending notice, starts the watchdog
    ... every step:  guard.step_started(); <optimizer step>; kind = guard.step_finished(n)
                     if kind: guard.run_save(n, kind)      # the main thread saves now
    ... in a long evaluation, per batch:  guard.poll()   # saves the last finished step if due
    guard.close()

With a `Checkpointer` the same calls are `ckpt.step_started()` (optional: the
optimizer's step pre-hook makes it), `ckpt.step(n)`, `ckpt.poll()`, `ckpt.safe()`
and `ckpt.notice(terminate_at_unix_s)`; the Checkpointer supplies the save.

A framework that saves by itself once asked (Trainer's `control.should_save`)
reports that save with `guard.mark_saved(kind, step, took_s)` instead.

`save(step, kind, release)` must write the state of step `step` and call
`release()` as soon as the live objects have been copied (the loop may then
change them again); it may block for the write. Pass `background=False` where
a save cannot run from another thread (under torchrun a save is a collective
every rank must join, so the Checkpointer does): notices are then honoured at
step boundaries and at `poll()`.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import threading
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

log = logging.getLogger(__name__)

NOTICE_FILE_ENV = "SPOTRUN_NOTICE_FILE"
EMERGENCY, LAST = "emergency", "last"
DEFAULT_GRACE_S = 1.0       # wait this long for a step boundary before saving from the watchdog
DEFAULT_TICK_S = 0.1        # watchdog: longest it sleeps between looks at the notice file
TOUCHED_STEPS = 2.0         # a touched state waits this many step times for the boundary
STEP_EMA = 0.2              # weight of the newest step interval in the step-time estimate

SaveFn = Callable[[int, str, Callable[[], None]], None]


class StateChanged(Exception):
    """Raised by a save function: the state is no longer that of the step it was asked to save."""


@dataclass
class Notice:
    """A received notice: when (guard clock) and, if known, the termination (guard clock)."""

    received_at: float
    deadline: float | None = None
    action: str | None = None
    source: str = "signal"


def _parse_time(text: Any) -> float | None:
    try:
        dt = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()


def read_notice_file(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The agent's notice file as a dict, or None if absent or not (yet) valid JSON."""
    try:
        raw = Path(path).read_text()
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return None
    try:
        obj = json.loads(raw)
    except ValueError:
        return None   # being written: the next look gets it whole
    return obj if isinstance(obj, dict) else None


def terminate_at_unix_s(body: Mapping[str, Any]) -> float | None:
    """Termination time (epoch s) of a notice: the agent's wall estimate, else IMDS `time`."""
    value = body.get("terminate_at_unix_s")
    if isinstance(value, (int, float)):
        return float(value)
    return _parse_time(body["time"]) if body.get("time") else None


class NoticeGuard:
    """Turns the interruption notice into saves at consistent points (see the module docstring)."""

    def __init__(self, save: SaveFn, *, notice_file: str | os.PathLike[str] | None = None,
                 env: Mapping[str, str] | None = None, background: bool = True,
                 grace_s: float | None = None, margin_s: float | None = None,
                 install_signal: bool = True, tick_s: float = DEFAULT_TICK_S,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        env = os.environ if env is None else env
        path = notice_file if notice_file is not None else env.get(NOTICE_FILE_ENV) or None
        self.notice_file = Path(path) if path else None
        self.save_fn = save
        self.background = background
        self.grace_s = grace_s
        self.margin_s = margin_s
        self.install_signal = install_signal
        self.tick_s = tick_s
        self.clock, self.wall = clock, wall
        self.notice_info: Notice | None = None
        self.safe_step: int | None = None         # clean at this step; None = a step is running
        self.emergency_step: int | None = None
        self.last_step: int | None = None
        self.save_s: float | None = None          # duration of the emergency save, measured
        self.step_s: float | None = None          # estimated time between step boundaries
        self.background_saves = 0
        # What became of the notice, true at every moment (the process may vanish at any):
        # "emergency checkpoint at step N in T s", or "no emergency checkpoint: <why>".
        self.outcome: str | None = None
        self.why_off: str = "background=False"   # the owner says why the watchdog may not save
        self._dirty_why: str | None = None         # what started the running step
        self._emergency_done = False
        self._last_done = False
        self._running: str | None = None          # kind of the save in progress
        self._last_boundary: float | None = None
        self._clean_since: float | None = None
        self._touched_since: float | None = None  # step_touched() since the last boundary
        self._state = threading.RLock()           # held while a save copies the state
        self._signalled = False
        self._file_seen = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._prev_handler: Any = None
        self._blocked_main = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        # Closes the pipe once: at close(), or when an unclosed guard is collected.
        self._finalizer = weakref.finalize(self, _close_pipe, self._stop, self._wake_r, self._wake_w)
        self.on_saved: Callable[[str, int, float], None] | None = None
        self.on_tick: Callable[[], None] | None = None   # the watchdog calls it every pass

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> "NoticeGuard":
        """Read a pending notice, install the SIGUSR1 handler and start the watchdog."""
        self.check_sources()
        if self.install_signal:
            if threading.current_thread() is threading.main_thread():
                self._prev_handler = signal.signal(signal.SIGUSR1, self._on_signal)
                # Blocked in the main thread, taken by the watchdog: processes the loop
                # starts later (spawn / forkserver DataLoader workers, subprocesses)
                # inherit it blocked, not the default action, so the group-wide notice
                # cannot kill them.
                old = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
                self._blocked_main = signal.SIGUSR1 not in old
            else:
                log.warning("not in the main thread: SIGUSR1 not handled (the notice file still is)")
        if self.background or self.notice_file is not None or self._prev_handler is not None:
            # A weak reference: an abandoned guard (never closed) can still be collected.
            self._thread = threading.Thread(target=_watch, args=(weakref.ref(self), self._wake_r,
                                                                 self._stop, self.tick_s),
                                            name="spotrun-notice", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop the watchdog and put the previous SIGUSR1 handler back."""
        self._stop.set()
        self._wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=60)
        self._thread = None
        if self._prev_handler is not None:
            signal.signal(signal.SIGUSR1, self._prev_handler)
            self._prev_handler = None
        if self._blocked_main and threading.current_thread() is threading.main_thread():
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGUSR1])
            self._blocked_main = False
        self._finalizer()

    # -- notice sources -----------------------------------------------------------

    def _on_signal(self, signum: int, frame: Any) -> None:
        # In the main thread, between bytecodes: only a flag and a byte to wake the watchdog.
        self._signalled = True
        self._wake()

    def _wake(self) -> None:
        if not self._finalizer.alive:
            return   # closed
        try:
            os.write(self._wake_w, b"!")
        except OSError:
            pass   # pipe full: already awake

    def notice(self, terminate_at_unix_s: float | None = None, *, source: str = "call",
               action: str | None = None) -> None:
        """Record a notice (what SIGUSR1 does); a termination time enables the last-moment save."""
        deadline = None
        if terminate_at_unix_s is not None:
            deadline = self.clock() + (terminate_at_unix_s - self.wall())
        with self._state:
            if self.notice_info is None:
                self.notice_info = Notice(received_at=self.clock(), deadline=deadline,
                                          action=action, source=source)
                self.outcome = "no emergency checkpoint: the notice came, the save has not started"
                log.warning("interruption notice (%s)%s", source,
                            "" if deadline is None else
                            f": terminates in {deadline - self.clock():.1f} s")
            elif deadline is not None and self.notice_info.deadline is None:
                self.notice_info.deadline = deadline
        if not self.background:
            self._waiting()   # no watchdog save will come: say so now
        self._wake()

    def check_sources(self) -> None:
        """Fold a received signal and the notice file into the notice (any thread)."""
        if self._signalled and self.notice_info is None:
            self.notice(source="signal")
        if self.notice_file is None or self._file_seen:
            return
        body = read_notice_file(self.notice_file)
        if body is None:
            return
        self._file_seen = True
        self.notice(terminate_at_unix_s(body), source="file", action=body.get("action"))

    @property
    def busy(self) -> bool:
        """True while an emergency or last-moment save is running (in any thread)."""
        return self._running is not None

    @property
    def pending(self) -> bool:
        """True once a notice came (signal, file or call)."""
        self.check_sources()
        return self.notice_info is not None

    @property
    def deadline(self) -> float | None:
        """Termination time on the guard's clock, if the notice carried one."""
        return None if self.notice_info is None else self.notice_info.deadline

    # -- safe points ---------------------------------------------------------------

    def step_started(self, why: str = "step_started()") -> None:
        """The loop is about to change the training state: blocks while a save is copying it.

        why: what started the step (an optimizer step, a backward pass), for the notice's outcome.
        """
        if self.safe_step is None:
            return
        with self._state:
            if self.safe_step is not None:
                self._dirty_why = f"{why} after step {self.safe_step}"
            self.safe_step = None
            self._clean_since = None
            self._touched_since = None

    def step_touched(self, record: Callable[[], None] | None = None) -> None:
        """The loop is about to change state that `record()` copies first: step n stays saveable.

        Called before, e.g., a train-mode forward (it updates BatchNorm statistics but
        not the weights): `record()` runs once per step boundary, while no save copies the
        state. A loop that never reaches the next boundary (an evaluation or a logging
        forward in train mode) then still gets its last finished step saved.
        """
        if self.safe_step is None or self._touched_since is not None:
            return
        with self._state:
            if self.safe_step is None or self._touched_since is not None:
                return
            if record is not None:
                record()
            self._touched_since = self.clock()

    def step_finished(self, step: int) -> str | None:
        """Step `step` is done and the state consistent; returns the kind of save due now, if any."""
        now = self.clock()
        if self._last_boundary is not None:
            dt = now - self._last_boundary
            self.step_s = dt if self.step_s is None else (1 - STEP_EMA) * self.step_s + STEP_EMA * dt
        self._last_boundary = now
        with self._state:
            self.safe_step = step
            self._clean_since = now
            self._touched_since = None
        return self.due(lookahead_s=self.step_s or 0.0)

    def due(self, *, lookahead_s: float = 0.0) -> str | None:
        """The save due now: the emergency one, then the last-moment one when its time comes.

        lookahead_s: time to the next chance to save (a step at a boundary);
        the last-moment save is due when waiting for that chance would be too late.
        """
        self.check_sources()
        info = self.notice_info
        if info is None or self._running is not None:
            return None
        if not self._emergency_done:
            return EMERGENCY
        if self._last_done or info.deadline is None:
            return None
        latest_start = info.deadline - (self.save_s or 0.0) - self.margin()
        if self.clock() + lookahead_s < latest_start:
            return None
        if self.safe_step is not None and self.emergency_step is not None \
                and self.safe_step <= self.emergency_step and lookahead_s == 0.0:
            return None   # nothing new since the emergency save: a later boundary may still add some
        return LAST

    def margin(self) -> float:
        """Seconds kept free before the termination: given, else a quarter of a save + 0.5 s."""
        if self.margin_s is not None:
            return self.margin_s
        return 0.5 + 0.25 * (self.save_s or 0.0)

    def poll(self) -> str | None:
        """At a point the loop marks safe (e.g. each validation batch): save now if one is due.

        Saves the last finished step (the state must not have changed since:
        call it where no optimizer step is half done). Returns the kind saved, or None.
        """
        kind = self.due()
        if kind is None or self.safe_step is None:
            return None
        if kind == LAST and self.emergency_step is not None and self.safe_step <= self.emergency_step:
            return None
        self.run_save(self.safe_step, kind)
        return kind

    @contextmanager
    def safe(self) -> Iterator["NoticeGuard"]:
        """A region that does not change the training state (evaluation, logging, a data pass).

        Inside it the watchdog saves without waiting for a step boundary;
        on the way out any save still due is done.
        """
        saved_grace = self.grace_s
        self.grace_s = 0.0
        self._wake()
        try:
            yield self
        finally:
            self.grace_s = saved_grace
            self.poll()

    # -- saving ----------------------------------------------------------------------

    def run_save(self, step: int, kind: str, *, background: bool = False,
                 force: bool = False) -> bool:
        """Run the save of `step` now (this thread) and record it; the state is held still meanwhile.

        False (nothing done) if another thread is already making, or has made, this kind
        of save, unless force (every rank of a torchrun job must take part in the save).
        """
        self._state.acquire()
        done = self._emergency_done if kind == EMERGENCY else self._last_done
        if not force and (self._running is not None or done):
            self._state.release()
            return False
        self._run_locked(step, kind, background)
        return True

    def _run_locked(self, step: int, kind: str, background: bool) -> None:
        # Called holding _state once; release() (or the end of the save) lets the loop go on.
        held = [True]

        def release() -> None:
            if held[0]:
                held[0] = False
                self._state.release()

        self._running = kind
        t0 = self.clock()
        try:
            self.save_fn(step, kind, release)
        except StateChanged as exc:
            # The state moved on outside a step boundary we saw: step n is gone; the save
            # waits for the next boundary.
            with self._state:
                if self.safe_step == step:
                    self.safe_step = None
                    self._clean_since = self._touched_since = None
                    self._dirty_why = str(exc)
            if kind == EMERGENCY:
                self._say(f"no emergency checkpoint: {exc}; it waits for the next step()")
            return
        except Exception as exc:
            if kind == EMERGENCY:
                self._say(f"no emergency checkpoint: the save failed: {exc}"[:300])
            raise
        finally:
            release()
            self._running = None
        self._record(kind, step, self.clock() - t0, background)

    def mark_saved(self, kind: str, step: int, took_s: float) -> None:
        """Report a save the framework made itself (e.g. Trainer's own checkpoint after should_save)."""
        self._record(kind, step, took_s, False)

    def _record(self, kind: str, step: int, took: float, background: bool) -> None:
        if kind == EMERGENCY:
            self._emergency_done = True
            self.emergency_step = step
            self.save_s = took
        else:
            self._last_done = True
            self.last_step = step
            self.save_s = max(self.save_s or 0.0, took)
        if background:
            self.background_saves += 1
        log.warning("%s checkpoint at step %d in %.2f s%s", kind, step, took,
                    " (from the watchdog)" if background else "")
        info = self.notice_info
        since = took if info is None else self.clock() - info.received_at
        if kind == EMERGENCY:
            self.outcome = f"emergency checkpoint at step {step} in {since:.2f} s"
        elif self.outcome is not None and "; last-moment" not in self.outcome:
            self.outcome += f"; last-moment checkpoint at step {step}"
        if self.on_saved is not None:
            self.on_saved(kind, step, took)

    def grace(self) -> float:
        """How long a clean state waits for a step boundary before the watchdog saves it."""
        if self.grace_s is not None:
            return self.grace_s
        return DEFAULT_GRACE_S if self.step_s is None else min(DEFAULT_GRACE_S, 0.5 * self.step_s)

    def wait_s(self) -> float:
        """How long the watchdog leaves the loop to reach a step boundary before it saves.

        The grace for a clean state; for a touched one (a step may be under way, whose
        boundary would save a newer step) about two step times, at least the default grace.
        """
        if self._touched_since is None:
            return self.grace()
        step_wait = DEFAULT_GRACE_S if self.step_s is None else \
            max(DEFAULT_GRACE_S, TOUCHED_STEPS * self.step_s)
        return max(self.grace(), step_wait)

    def _say(self, text: str) -> None:
        """Set the notice's outcome; a new one is logged once (the job's log carries it)."""
        if text != self.outcome:
            self.outcome = text
            log.warning("%s", text)

    def _waiting(self) -> None:
        """The emergency save is due and the watchdog may not make it: say why."""
        if not self.background:
            self._say(f"no emergency checkpoint: watchdog saves are off ({self.why_off}); "
                      "it waits for the next step()")
        elif self.safe_step is None:
            self._say("no emergency checkpoint: " + (
                f"a training step is under way ({self._dirty_why}); it saves at the step's end"
                if self._dirty_why else "the loop has not reached restore() yet"))

    def tick(self) -> str | None:
        """One watchdog pass: save from this thread if a save is due and the loop is elsewhere."""
        kind = self.due()
        if kind == EMERGENCY and (not self.background or self.safe_step is None):
            self._waiting()
        if kind is None or not self.background or self.safe_step is None:
            return None
        info = self.notice_info
        assert info is not None
        clean_for = self.clock() - max(self._clean_since or 0.0, info.received_at)
        if kind == EMERGENCY and clean_for < self.wait_s():
            return None
        if not self._state.acquire(blocking=False):
            return None   # the loop is saving, or a save is copying, right now
        step = self.safe_step
        if step is None or self.due() != kind:
            self._state.release()
            return None
        self._run_locked(step, kind, True)
        return kind


def _close_pipe(stop: threading.Event, *fds: int) -> None:
    stop.set()
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _watch(ref: "weakref.ref[NoticeGuard]", wake_r: int, stop: threading.Event, tick_s: float) -> None:
    """The watchdog: wake on a signal or every tick_s, and let the guard save if it must."""
    # This thread takes SIGUSR1 for the process (the main thread has it blocked).
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGUSR1])
    while not stop.is_set():
        try:
            ready, _, _ = select.select([wake_r], [], [], tick_s)
            if stop.is_set():
                return
            if ready:
                os.read(wake_r, 4096)
        except (OSError, ValueError):
            return   # closed
        guard = ref()
        if guard is None or stop.is_set():
            return
        try:
            guard.tick()
            if guard.on_tick is not None:
                guard.on_tick()
        except Exception:   # a failed save is reported by the owner; keep watching
            log.exception("background checkpoint failed")
        del guard
