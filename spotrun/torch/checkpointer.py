"""`Checkpointer`: exact-resume checkpoints for a PyTorch training loop in three lines.

    ckpt = Checkpointer(model=model, optimizer=opt, scheduler=sched)
    start = ckpt.restore()
    for step in range(start, total): train_one(step); ckpt.step(step + 1)

`step(n)` takes the number of steps completed. A save snapshots the whole state
into one reused host buffer (the only time training waits) and persists it in a
background thread; SIGUSR1 (the agent's interruption notice) makes the next
`step()` save at once and wait until the checkpoint is in the store.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from typing import Any, Callable, MutableMapping

import torch

from spotrun.checkpoints import list_complete, list_names
from spotrun.errors import CheckpointError, ChecksumMismatch, ConfigError, ObjectNotFound, StoreError
from spotrun.store import open_store
from spotrun.store.base import ObjectStore
from spotrun.torch import envconf
from spotrun.torch.dist import DistContext
from spotrun.torch.flatten import Slot, decode
from spotrun.torch.persist import Outcome, Persister, failure
from spotrun.torch.progress import ProgressFile
from spotrun.torch.rng import get_rng_state, set_rng_state
from spotrun.torch.snapshot import Snapshot, SnapshotBuffer
from spotrun.torch.storage import read_checkpoint

log = logging.getLogger(__name__)

DEFAULT_MTBF_S = 6 * 3600.0      # spot reclaim interval assumed by interval="auto"
AUTO_FIRST_S = 60.0              # first save under "auto", to measure the save cost
AUTO_BOUNDS_S = (30.0, 3600.0)
FINISH_IF_REMAINING = 0.25       # emergency: finish an in-flight persist this close to done


def _stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def young_daly_s(save_cost_s: float, mtbf_s: float) -> float:
    """Young/Daly optimal checkpoint interval sqrt(2 * C * MTBF), clamped to sane bounds."""
    tau = math.sqrt(2.0 * max(save_cost_s, 1e-3) * mtbf_s)
    return min(max(tau, AUTO_BOUNDS_S[0]), AUTO_BOUNDS_S[1])


class Checkpointer:
    """Saves and restores model, optimizer, scheduler, GradScaler, RNG, data position and extras."""

    def __init__(self, model: Any = None, optimizer: Any = None, scheduler: Any = None,
                 scaler: Any = None, extras: MutableMapping[str, Any] | None = None,
                 uri: str | None = None, interval_s: float | str | None = None,
                 keep: int | None = None, *, store: ObjectStore | None = None,
                 every_steps: int | None = None, total_steps: int | None = None,
                 progress_file: str | None = None, resume: str | None = None,
                 async_save: bool = True, mtbf_s: float = DEFAULT_MTBF_S,
                 progress_interval_s: float = 1.0, retries: int = 3, retry_backoff_s: float = 0.5,
                 shard_bytes: int | None = None, sharded: bool = False,
                 overlap_snapshot: bool = True,
                 install_signal: bool = True, clock: Callable[[], float] = time.monotonic,
                 env: MutableMapping[str, str] | None = None) -> None:
        cfg = envconf.from_env(env)
        self.dist = DistContext.current(sharded=sharded)
        if store is None:
            uri = uri or cfg.uri
            if not uri:
                raise ConfigError("no checkpoint location", field="SPOTRUN_CHECKPOINT_URI",
                                  hint="set it, or pass uri= / store= to Checkpointer")
            store = open_store(uri)
        self.store = store
        self.model, self.optimizer, self.scheduler, self.scaler = model, optimizer, scheduler, scaler
        self.extras: MutableMapping[str, Any] = extras if extras is not None else {}
        raw_interval = interval_s if interval_s is not None else cfg.interval_s
        self.auto_interval = raw_interval == "auto"
        if isinstance(raw_interval, str) and not self.auto_interval:
            raise ConfigError("interval must be seconds or 'auto'", field="interval_s",
                              value=raw_interval)
        self.interval_s: float | None = (AUTO_FIRST_S if self.auto_interval else
                                         (envconf.DEFAULT_INTERVAL_S if raw_interval is None
                                          and every_steps is None else raw_interval))  # type: ignore[assignment]
        self.every_steps = every_steps
        self.keep = keep or cfg.keep or envconf.DEFAULT_KEEP
        self.total_steps = total_steps or cfg.total_steps
        self.resume_name = resume or cfg.resume
        self.mtbf_s = mtbf_s
        self.async_save = async_save
        self.clock = clock
        self.progress = ProgressFile((progress_file or cfg.progress_file) if self.dist.is_writer else None)
        self.progress_interval_s = progress_interval_s
        self.buffer = SnapshotBuffer()
        self.persister = Persister(store, keep=self.keep, retries=retries, backoff_s=retry_backoff_s,
                                   shard_bytes=shard_bytes, clock=clock)
        self.persister.on_failure = lambda _out: self.write_progress()   # failed saves show now
        # Reported through the progress file (the agent's heartbeat).
        self.current_step = 0
        self.last_checkpoint_step: int | None = None
        self.checkpoint_save_s: float | None = None     # blocking stall of the last save
        self.checkpoint_persist_s: float | None = None  # background write of the last save
        self.emergency_checkpoint_step: int | None = None
        self.emergency_save_s: float | None = None
        self.saves = 0
        self.deferred = 0
        self._saved_step: int | None = None             # last step snapshotted
        self._last_save_t = clock()
        self._rate_mark: tuple[int, float] | None = None
        self._steps_per_s: float | None = None
        self._last_progress_t = -math.inf
        self._notice_at: float | None = None
        self._prev_handler: Any = None
        self._copying: Snapshot | None = None            # snapshot whose deferred copy may run
        self.overlap_snapshot = overlap_snapshot and callable(
            getattr(optimizer, "register_step_pre_hook", None))
        self._hook = (optimizer.register_step_pre_hook(self._before_optimizer_step)
                      if self.overlap_snapshot else None)
        if install_signal:
            self._install_signal()

    # -- overlapped snapshot ------------------------------------------------------

    def _deferrable(self) -> set[int] | None:
        """CPU tensors only optimizer.step() changes: their copy may overlap the next forward/backward."""
        if not self.overlap_snapshot:
            return None
        ptrs = {p.data_ptr() for g in self.optimizer.param_groups for p in g["params"]}
        for st in self.optimizer.state.values():
            ptrs.update(v.data_ptr() for v in st.values() if isinstance(v, torch.Tensor))
        return ptrs

    def _before_optimizer_step(self, *_: Any) -> None:
        # The optimizer is about to change what the snapshot still copies: wait for it.
        snap = self._copying
        if snap is None:
            return
        t0 = self.clock()
        snap.ready.wait()
        self._copying = None
        waited = self.clock() - t0
        if self.checkpoint_save_s is not None:
            self.checkpoint_save_s += waited

    # -- signal -----------------------------------------------------------------

    def _install_signal(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            log.warning("Checkpointer not created in the main thread: SIGUSR1 not handled")
            return
        self._prev_handler = signal.signal(signal.SIGUSR1, self._on_notice)

    def _on_notice(self, signum: int, frame: Any) -> None:
        # Only record the moment: the save happens at the next step boundary.
        if self._notice_at is None:
            self._notice_at = time.monotonic()

    def notice(self) -> None:
        """Request an emergency save at the next step (what SIGUSR1 does)."""
        self._on_notice(signal.SIGUSR1, None)

    # -- state ------------------------------------------------------------------

    def state_tree_local(self, step: int) -> dict[str, Any]:
        """This rank's state: everything an exact resume needs, as tensors and plain values."""
        tree: dict[str, Any] = {"step": step, "rng": get_rng_state(), "extras": {}}
        for key in ("model", "optimizer", "scheduler", "scaler"):
            obj = getattr(self, key)
            if obj is not None:
                tree[key] = self.dist.state_dict_of(key, obj)
        for name, value in self.extras.items():
            tree["extras"][name] = ({"stateful": value.state_dict()} if _stateful(value)
                                    else {"value": value})
        return tree

    def state_tree(self, step: int) -> dict[str, Any]:
        """The tree to save: under torchrun, every rank's RNG and extras gathered to rank 0."""
        return self.dist.gather_ranked(self.state_tree_local(step))

    def load_tree(self, tree: dict[str, Any]) -> None:
        """Put a restored tree back into the live objects."""
        tree = self.dist.select_ranked(tree)
        for key in ("model", "optimizer", "scheduler", "scaler"):
            obj = getattr(self, key)
            if obj is None:
                continue
            if key not in tree:
                raise CheckpointError(f"checkpoint has no {key} state", field=key)
            try:
                self.dist.load_state_dict_of(key, obj, tree[key])
            except (RuntimeError, KeyError, ValueError) as exc:
                raise CheckpointError(f"cannot load {key} state: {exc}", field=key,
                                      hint="the checkpoint was written by a different model") from None
        set_rng_state(tree["rng"])
        for name, saved in tree.get("extras", {}).items():
            live = self.extras.get(name)
            if "stateful" in saved:
                if live is None or not _stateful(live):
                    log.warning("checkpoint extra %r has state but no stateful object to take it", name)
                    continue
                live.load_state_dict(saved["stateful"])
            else:
                self.extras[name] = saved["value"]

    # -- restore ----------------------------------------------------------------

    def _candidates(self) -> list[str]:
        complete = list_complete(self.store)
        names = list(reversed(complete))
        if self.resume_name:
            if self.resume_name in names:
                names.remove(self.resume_name)
            names.insert(0, self.resume_name)
        return names

    def restore(self) -> int:
        """Load the requested (or newest verified) checkpoint; returns the step to continue from."""
        if self.dist.sharded:
            from spotrun.torch.sharded import restore_sharded
            step = restore_sharded(self)
            self._saved_step = self.last_checkpoint_step = step or None
            self.current_step = step
            self._last_save_t = self.clock()
            return step
        partial = set(list_names(self.store)) - set(list_complete(self.store))
        for name in self._candidates():
            try:
                manifest, meta, data = read_checkpoint(self.store, name)
                tree = decode(meta["structure"], [Slot.from_json(s) for s in meta["slots"]], data)
            except (ChecksumMismatch, ObjectNotFound, StoreError, KeyError, ValueError) as exc:
                log.warning("skipping checkpoint %s: %s", name, exc)
                continue
            for p in sorted(partial):
                if p > name:
                    log.warning("skipping checkpoint %s: no manifest (partial write)", p)
            del data
            self.load_tree(tree)
            step = int(manifest.step)
            self.dist.after_restore(self, name)
            self._saved_step = self.last_checkpoint_step = self.current_step = step
            self._last_save_t = self.clock()
            log.info("restored checkpoint %s (step %d)", name, step)
            return step
        if partial:
            log.warning("no complete checkpoint; skipped partial %s", ", ".join(sorted(partial)))
        self.dist.after_restore(self, None)
        return 0

    # -- training loop ----------------------------------------------------------

    def _collect(self) -> None:
        for out in self.persister.take_outcomes():
            self._record(out)

    def _record(self, out: Outcome) -> None:
        if out.error is not None:
            raise failure(out) from out.error
        if out.manifest is not None:
            self.last_checkpoint_step = out.step
            self.checkpoint_persist_s = out.persist_s
            self._last_progress_t = -math.inf   # report the new checkpoint at once

    def _due(self, step: int) -> bool:
        if self._saved_step == step:
            return False
        if self.every_steps and step - (self._saved_step or 0) >= self.every_steps:
            return True
        return self.interval_s is not None and self.clock() - self._last_save_t >= self.interval_s

    def step(self, step: int) -> bool:
        """Call after each training step with the steps completed; saves when due. True if saved."""
        self.current_step = step
        self._collect()
        now = self.clock()
        if self._rate_mark is None:
            self._rate_mark = (step, now)
        elif now - self._rate_mark[1] >= 1.0:
            self._steps_per_s = (step - self._rate_mark[0]) / (now - self._rate_mark[1])
            self._rate_mark = (step, now)
        saved = False
        notice, due = self.dist.any_flags(self._notice_at is not None, self._due(step))
        if notice:
            self.emergency_save(step)
            saved = True
        elif due:
            saved = self.save(step)
        elif self.buffer.unprepared and self.dist.is_writer and not self.dist.sharded:
            # Optimizer state exists after the first step: size the buffer now, in the background.
            self.buffer.prepare(self.state_tree_local(step))
        if now - self._last_progress_t >= self.progress_interval_s or saved:
            self.write_progress()
        return saved

    def save(self, step: int, *, wait: bool = False) -> bool:
        """Snapshot now and persist (in the background unless async is off); False if deferred."""
        self._collect()
        if self.persister.busy:
            if not wait:
                # At most one persist in flight: try again at the next step.
                self.deferred += 1
                return False
            self.persister.wait()
            self._collect()
        t0 = self.clock()
        if self.dist.sharded:
            from spotrun.torch.sharded import save_sharded
            if save_sharded(self, step) is not None:
                self.last_checkpoint_step = step
            self._saved_step, self._last_save_t = step, self.clock()
            self.checkpoint_save_s = self._last_save_t - t0
            self.saves += 1
            return True
        snap = self.dist.capture(self, step, self._deferrable())
        self._saved_step = step
        self._last_save_t = self.clock()
        if snap is None:            # not the writer rank
            return True
        extra = self.dist.manifest_extra()
        if self.async_save and not wait:
            self._copying = snap
            self.persister.submit(snap, extra)
            self.checkpoint_save_s = self.clock() - t0
        else:
            self._record(self.persister.run(snap, extra))
            self.checkpoint_save_s = self.clock() - t0
        self.saves += 1
        if self.auto_interval:
            self.interval_s = young_daly_s(self.checkpoint_save_s, self.mtbf_s)
        return True

    def emergency_save(self, step: int) -> float:
        """Finish or abandon the in-flight persist, save at once and wait; returns seconds since notice."""
        notice_at = self._notice_at if self._notice_at is not None else time.monotonic()
        if self.persister.busy:
            if self.persister.remaining_fraction() <= FINISH_IF_REMAINING:
                self.persister.wait()
            else:
                log.warning("emergency save: abandoning the in-flight persist")
                self.persister.abandon()
            self._collect()
        self.save(step, wait=True)
        self.emergency_checkpoint_step = step
        self.emergency_save_s = time.monotonic() - notice_at
        self._notice_at = None
        log.warning("emergency checkpoint at step %d in %.2fs", step, self.emergency_save_s)
        self.write_progress()
        return self.emergency_save_s

    def wait(self) -> None:
        """Block until the in-flight persist (if any) is done; raises if it failed."""
        self.persister.wait()
        self._collect()

    def finish(self, step: int) -> None:
        """Final save (if the last one is older) and wait until it is in the store."""
        self.current_step = step
        self.wait()
        # Every rank must take the same branch: save() is a collective under torchrun.
        (need,) = self.dist.any_flags(self._saved_step != step)
        if need:
            self.save(step, wait=True)
        self.dist.barrier()
        self.write_progress()

    def close(self) -> None:
        """Wait for the in-flight persist and put the previous SIGUSR1 handler back."""
        try:
            self.wait()
        finally:
            if self._hook is not None:
                self._hook.remove()
                self._hook = None
                self.overlap_snapshot = False
            if self._prev_handler is not None:
                signal.signal(signal.SIGUSR1, self._prev_handler)
                self._prev_handler = None

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def progress_fields(self) -> dict[str, Any]:
        """What the progress file reports."""
        return {"step": self.current_step, "total_steps": self.total_steps,
                "steps_per_s": self._steps_per_s, "last_checkpoint_step": self.last_checkpoint_step,
                "checkpoint_save_s": self.checkpoint_save_s,
                "emergency_checkpoint_step": self.emergency_checkpoint_step,
                "checkpoint_persist_s": self.checkpoint_persist_s,
                "emergency_save_s": self.emergency_save_s,
                "checkpoint_interval_s": self.interval_s, **self.persister.failure_fields()}

    def write_progress(self) -> None:
        """Rewrite the progress file now."""
        self._last_progress_t = self.clock()
        self.progress.write(self.progress_fields())
