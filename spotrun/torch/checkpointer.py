"""`Checkpointer`: exact-resume checkpoints for a PyTorch training loop in three lines.

    ckpt = Checkpointer(model=model, optimizer=opt, scheduler=sched)
    start = ckpt.restore()
    for step in range(start, total): train_one(step); ckpt.step(step + 1)

The less common settings come in option objects (`spotrun.torch.options`):
`Checkpointer(..., save=SaveOptions(async_save=False))`.

`step(n)` takes the number of steps completed. A save snapshots the whole state
into one reused host buffer (the only time training waits) and persists it in a
background thread.

The interruption notice (SIGUSR1, or the agent's notice file) is honoured
wherever the loop is (`spotrun.torch.notice`): at the next `step()` if the loop
gets there soon, else - while the state is still that of the last finished
step, e.g. during a long evaluation or data loading - from a background
thread. After that emergency checkpoint one more save runs as late as is safe
before the termination time. Loops can mark safe points themselves with
`ckpt.poll()` or `with ckpt.safe(): evaluate()`; integrations call
`ckpt.step_started()` / `ckpt.step(n)` around each optimizer step.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, MutableMapping

import torch

from spotrun import jobfiles
from spotrun.checkpoints import list_complete, list_names
from spotrun.errors import ChecksumMismatch, ObjectNotFound, StoreError
from spotrun.store import open_store
from spotrun.store.base import ObjectStore
from spotrun.store.progress import network_progress
from spotrun.torch import envconf
from spotrun.torch.dist import DistContext, _unwrap
from spotrun.torch.flatten import Slot, decode
from spotrun.torch.interval import first_interval_s, young_daly_s
from spotrun.torch.loader import warn_inexact
from spotrun.torch.notice import EMERGENCY, LAST, NoticeGuard, StateChanged
from spotrun.torch.options import (NoticeOptions, RuntimeOptions, SaveOptions, check_groups,
                                   reject_moved)
from spotrun.torch.persist import Outcome, Persister, failure
from spotrun.torch.progress import ProgressFile
from spotrun.torch.rng import get_rng_state
from spotrun.torch.snapshot import Snapshot, SnapshotBuffer
from spotrun.torch.state import StateMixin, extras_tree
from spotrun.torch.storage import SHARD_BYTES, matches_saved, read_checkpoint
from spotrun.torch.watch import StateWatch, step_pre_hook

log = logging.getLogger(__name__)

FINISH_IF_REMAINING = 0.25       # emergency: finish an in-flight persist this close to done
LOCAL_DIR = "spotrun-checkpoints"   # outside spotrun, under the working directory


def _open(uri: str | None, cfg: envconf.EnvSettings, env: Mapping[str, str]) -> ObjectStore:
    if not uri:
        if cfg.under_spotrun:
            raise envconf.missing_location(env)
        local = Path.cwd() / LOCAL_DIR
        log.info("not under spotrun: checkpoints go to %s", local)
        uri = local.as_uri()
    return open_store(uri)


class Checkpointer(StateMixin):
    """Saves and restores model, optimizer, scheduler, GradScaler, RNG, data position and extras."""

    def __init__(self, model: Any = None, optimizer: Any = None, scheduler: Any = None,
                 scaler: Any = None, extras: MutableMapping[str, Any] | None = None,
                 uri: str | None = None, interval_s: float | str | None = None,
                 keep: int | None = None, *, store: ObjectStore | None = None,
                 every_steps: int | None = None, total_steps: int | None = None,
                 resume: str | None = None, save: SaveOptions = SaveOptions(),
                 notice: NoticeOptions = NoticeOptions(),
                 runtime: RuntimeOptions = RuntimeOptions(), **moved: Any) -> None:
        if moved:   # a keyword that moved into an option object: an error naming its place
            reject_moved(moved, tuple(inspect.signature(Checkpointer).parameters)[:-1])
        check_groups(save=save, notice=notice, runtime=runtime)
        self._env = os.environ if runtime.env is None else runtime.env
        cfg = envconf.from_env(self._env)
        clock = runtime.clock
        self.dist = DistContext.current(sharded=save.sharded)
        self.store = store if store is not None else _open(uri or cfg.uri, cfg, self._env)
        self.model, self.optimizer, self.scheduler, self.scaler = model, optimizer, scheduler, scaler
        self.extras: MutableMapping[str, Any] = extras if extras is not None else {}
        self.interval_s, self.auto_interval = first_interval_s(interval_s, cfg.interval_s,
                                                               every_steps)
        self.every_steps = every_steps
        self.keep = keep or cfg.keep or envconf.DEFAULT_KEEP
        self.total_steps = total_steps or cfg.total_steps
        self.resume_name = resume or cfg.resume
        self.mtbf_s = save.mtbf_s
        self.async_save = save.async_save
        self.clock = clock
        # One progress file per node (the agent's heartbeat): written by its first local rank.
        self.progress = ProgressFile((runtime.progress_file or cfg.progress_file)
                                     if self.dist.is_writer or self.dist.node_writer else None)
        self.progress_interval_s = runtime.progress_interval_s
        self.buffer = SnapshotBuffer()
        self.shard_bytes = save.shard_bytes
        self.persister = Persister(self.store, keep=self.keep, retries=save.retries,
                                   backoff_s=save.retry_backoff_s, shard_bytes=save.shard_bytes,
                                   clock=clock)
        self.persister.on_failure = lambda _out: self.write_progress()   # failed saves show now
        if self.dist.is_writer and not self.dist.sharded:
            # The job's persisted files (spec `persist:`) go with the writer's checkpoints.
            self.persister.files = jobfiles.default() if runtime.env is None else \
                jobfiles.JobFiles(env=runtime.env)
        # Reported through the progress file (the agent's heartbeat).
        self.current_step = 0
        self.last_checkpoint_step: int | None = None
        self.checkpoint_save_s: float | None = None     # blocking stall of the last save
        self.checkpoint_persist_s: float | None = None  # background write of the last save
        self.emergency_checkpoint_step: int | None = None
        self.emergency_save_s: float | None = None
        self.last_moment_checkpoint_step: int | None = None
        self.saves = 0
        self.deferred = 0
        self._saved_step: int | None = None             # last step snapshotted
        self._last_save_t = clock()
        self._rate_mark: tuple[int, float] | None = None
        self._steps_per_s: float | None = None
        self._last_progress_t = -math.inf
        self._copying: Snapshot | None = None            # snapshot whose deferred copy may run
        self._io = threading.RLock()                     # one user of buffer + persister at a time
        self._boundary: tuple[int, int] | None = None    # (thread, step) of a save at step()
        self._recorded: tuple[int, Any, dict[str, Any]] | None = None   # (step, rng, extras)
        self._buffers_at: tuple[int, dict[str, Any]] | None = None       # (step, buffer copies)
        self._file_marks: tuple[int, Any] | None = None                  # (step, jobfiles.Marks)
        self._written_step: int | None = None            # step in the progress file
        self._progress_lock = threading.Lock()
        self._record_safe = not self.dist.distributed and not self.dist.sharded
        is_optimizer = isinstance(optimizer, torch.optim.Optimizer)
        hook = step_pre_hook(optimizer, self._before_optimizer_step) if is_optimizer else None
        # The overlapped copy waits in that hook before the optimizer changes what it copies.
        self.overlap_snapshot = save.overlap_snapshot and hook is not None
        self.guard = NoticeGuard(self._urgent_save, notice_file=notice.file or cfg.notice_file,
                                 env={}, background=notice.background and self._record_safe,
                                 grace_s=notice.grace_s, margin_s=notice.margin_s,
                                 install_signal=runtime.install_signal, clock=clock,
                                 wall=runtime.wall)
        self.guard.why_off = "NoticeOptions(background=False)" if self._record_safe else \
            "under torchrun a save is a collective every rank joins"
        self._hooks = [hook] if hook is not None else []
        if isinstance(model, torch.nn.Module) and any(True for _ in model.buffers()):
            # Train-mode forward changes buffers (BatchNorm statistics): a step has started.
            self._hooks.append(model.register_forward_pre_hook(self._before_forward))
        # Any loop, with or without torch.optim: a backward pass, another optimizer or an
        # in-place change also ends "clean at step n" (spotrun.torch.watch).
        self.watch: StateWatch | None = None
        if self._record_safe:
            self.watch = StateWatch(_unwrap(model) if isinstance(model, torch.nn.Module)
                                    else None, optimizer if is_optimizer else None, self.extras,
                                    scheduler)
            self._hooks += self.watch.install(self.guard.step_started)
        self._written_outcome: str | None = None
        self.guard.on_saved = self._on_urgent_saved
        self.guard.on_tick = self._refresh_progress
        self.guard.start()

    # -- hooks: where a step starts --------------------------------------------

    def _deferrable(self) -> set[int] | None:
        """CPU tensors only optimizer.step() changes: their copy may overlap the next forward/backward."""
        if not self.overlap_snapshot:
            return None
        ptrs = {p.data_ptr() for g in self.optimizer.param_groups for p in g["params"]}
        for st in self.optimizer.state.values():
            ptrs.update(v.data_ptr() for v in st.values() if isinstance(v, torch.Tensor))
        return ptrs

    def _before_optimizer_step(self, *_: Any) -> None:
        self.guard.step_started("optimizer.step()")
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

    def _before_forward(self, module: Any, _args: Any) -> None:
        if not module.training:
            return
        if self._record_safe:
            # Only the buffers change (BatchNorm statistics): keep them as of the last
            # finished step, which stays saveable; the weights change at optimizer.step().
            self.guard.step_touched(self._record_buffers)
        else:
            self.guard.step_started("a train-mode forward")

    def _record_buffers(self) -> None:
        """Copy the model's buffers as they are at the last finished step (once per step)."""
        step = self.guard.safe_step
        with torch.no_grad():   # named as in the state dict: without a DDP wrapper's prefix
            copies = {name: b.detach().clone() for name, b in _unwrap(self.model).named_buffers()}
        self._buffers_at = (step, copies) if step is not None else None

    def step_started(self) -> None:
        """Tell the library a step is about to change the state (integrations; hooks do it otherwise)."""
        self.guard.step_started()

    # -- notice -------------------------------------------------------------------

    def notice(self, terminate_at_unix_s: float | None = None) -> None:
        """Request an emergency save (= SIGUSR1); a termination time adds the last-moment save."""
        self.guard.notice(terminate_at_unix_s)
        self._refresh_progress()   # the outcome so far, even with no watchdog running

    def poll(self) -> str | None:
        """Call at safe points inside long stretches between steps; saves if a notice wants it.

        Saves the state of the last finished step ("emergency" / "last" returned),
        else None. Only where no optimizer step is half done (e.g. between
        evaluation batches). Single process only; under torchrun it does nothing.
        """
        if not self._record_safe:
            return None
        self._collect()
        return self.guard.poll()

    @contextmanager
    def safe(self) -> Iterator["Checkpointer"]:
        """`with ckpt.safe(): evaluate()`: saves during the block need not wait for a step boundary.

        Under torchrun a save is a collective, and only some ranks may run the block
        (`if rank == 0: evaluate()`), so nothing is saved in or at the end of it: a notice
        seen meanwhile is saved, by every rank, at the next `step()`.
        """
        if not self._record_safe:
            yield self
            return
        with self.guard.safe():
            yield self

    def _urgent_save(self, step: int, kind: str, release: Callable[[], None]) -> None:
        """The guard's save: the live state at a step boundary, else the state recorded there."""
        live = self._boundary == (threading.get_ident(), step)
        with self._io:
            t0 = self.clock()
            if self.persister.busy:
                # In flight: this very step (wait for it), or an older one (finish or abandon).
                if self._saved_step == step or \
                        self.persister.remaining_fraction() <= FINISH_IF_REMAINING:
                    self.persister.wait()
                else:
                    log.warning("%s save: abandoning the in-flight persist", kind)
                    self.persister.abandon()
                self._collect()
            already = step == self.last_checkpoint_step and (not live or self._saved_step == step)
            if self.dist.distributed:   # only the writer knows last_checkpoint_step
                already = self._saved_step == step
            if already:
                release()   # that exact state is in the store already (or on its way)
                return
            if live:
                self.save(step, wait=True)
                return
            rec = self._recorded
            if rec is None or rec[0] != step:
                raise StateChanged(f"no state was recorded at step {step}")
            bufs = self._buffers_at
            copied = bufs is not None and bufs[0] == step
            self._check_unchanged(step, copied)
            tree = self.state_tree_local(step, rng=rec[1], extras=rec[2])
            if copied and "model" in tree:
                # A train-mode forward since the step: its buffers as they were at the step.
                sd = tree["model"]   # a fresh state dict: changed in place, its metadata kept
                for key in sd.keys() & bufs[1].keys():
                    sd[key] = bufs[1][key]
            snap = self.buffer.capture(step, tree)   # whole copy: the loop may go on after release
            # A change the hooks cannot hold back (in place, no backward) may have raced the copy.
            self._check_unchanged(step, copied)
            self._copying = None
            release()
            self._saved_step, self._last_save_t = step, self.clock()
            self.checkpoint_save_s = self.clock() - t0
            marks = self._file_marks
            self._record(self.persister.run(snap, self.dist.manifest_extra(),
                                            as_of=marks[1] if marks and marks[0] == step else None))
            self.saves += 1

    def _check_unchanged(self, step: int, buffers_copied: bool) -> None:
        """Raise StateChanged if a tensor of the state changed in place since step `step`."""
        what = self.watch.changed(step, buffers_copied=buffers_copied) if self.watch else None
        if what is not None:
            raise StateChanged(f"{what} changed in place after step {step}")

    def _on_urgent_saved(self, kind: str, step: int, took_s: float) -> None:
        info = self.guard.notice_info
        if kind == EMERGENCY:
            self.emergency_checkpoint_step = step
            self.emergency_save_s = self.clock() - info.received_at if info else took_s
        else:
            self.last_moment_checkpoint_step = step
        self.write_progress()

    # -- restore ----------------------------------------------------------------

    def _candidates(self) -> list[str]:
        complete = list_complete(self.store)
        names = list(reversed(complete))
        if self.resume_name:
            if self.resume_name in names:
                names.remove(self.resume_name)
            names.insert(0, self.resume_name)
        return names

    def _restored(self, step: int) -> int:
        self._saved_step = self.last_checkpoint_step = step or None
        self.current_step = step
        self._last_save_t = self.clock()
        self._remember(step)
        self.guard.safe_step = step
        self.write_progress()   # the restore's end, as it happens (the agent times the resume)
        return step

    def restore(self) -> int:
        """Load the requested (or newest verified) checkpoint; returns the step to continue from."""
        warn_inexact(self.extras)   # what cannot resume exactly is said at run time, once
        if self.dist.sharded:
            # Start-up cost: torch.distributed.checkpoint takes seconds to import; only
            # sharded jobs load it.
            from spotrun.torch.sharded import restore_sharded
            return self._restored(restore_sharded(self))
        partial = set(list_names(self.store)) - set(list_complete(self.store))
        # Every rank restores what rank 0 finds: nodes list the store at different moments.
        for name in self.dist.from_rank0(self._candidates()):
            try:
                with network_progress(self.store, f"restoring {name}") as progress:
                    manifest, meta, data = read_checkpoint(self.store, name, progress=progress)
                tree = decode(meta["structure"], [Slot.from_json(s) for s in meta["slots"]], data,
                              copy=False)
            except (ChecksumMismatch, ObjectNotFound, StoreError, KeyError, ValueError) as exc:
                log.warning("skipping checkpoint %s: %s", name, exc)
                continue
            for p in sorted(partial):
                if p > name:
                    log.warning("skipping checkpoint %s: no manifest (partial write)", p)
            del data
            self.load_tree(tree)
            self._restore_files(name)
            step = int(manifest.step)
            log.info("restored checkpoint %s (step %d)", name, step)
            return self._restored(step)
        if partial:
            log.warning("no complete checkpoint; skipped partial %s", ", ".join(sorted(partial)))
        self._remember(0)
        self.guard.safe_step = 0
        return 0

    def _restore_files(self, name: str) -> None:
        """The checkpoint's persisted files into the job directory, unless the agent put them there."""
        if self.persister.files is not None:
            self.persister.files.resume_from(self.store, name, self._env)

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

    def _remember(self, step: int) -> None:
        # What a later save of this step needs that the loop changes outside a step.
        if self._record_safe:
            self._recorded = (step, get_rng_state(), extras_tree(self.extras))
            self._buffers_at = None   # copied again at the first train-mode forward after it
            if self.watch is not None:
                self.watch.mark(step, self._recorded[2])
            files = self.persister.files
            # The job's files as of this step: a later save of it leaves out rows written since.
            self._file_marks = (step, files.mark()) if files is not None and files.active \
                else None

    def write_progress(self) -> None:
        """Rewrite the progress file now (the loop and the watchdog both do: one at a time)."""
        with self._progress_lock:
            fields = self.progress_fields()
            self._written_step, self._written_outcome = fields["step"], fields["notice_outcome"]
            self._last_progress_t = self.clock()
            self.progress.write(fields)

    def _refresh_progress(self) -> None:
        """From the watchdog: report the last step once the loop stops stepping (an evaluation).

        step() writes the progress file at most every progress_interval_s, so a loop
        that finishes its steps and starts a long evaluation would leave an older
        step there (and in the agent's heartbeat) until the evaluation ends.
        """
        if self._written_outcome != self.guard.outcome or (
                self._written_step != self.current_step and
                self.clock() - self._last_progress_t >= self.progress_interval_s):
            self.write_progress()

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
        self._remember(step)
        kind = self.guard.step_finished(step)
        # Under torchrun a save is a collective: a persist still in flight on the writer
        # defers the periodic save on every rank, not on the writer alone.
        urgent, last, due, busy = self.dist.any_flags(
            kind == EMERGENCY, kind == LAST, self._due(step) and not self.guard.busy,
            self.dist.distributed and self.persister.busy)
        if due and busy:
            self.deferred += 1
            due = False
        saved = False
        if urgent or last:
            self._boundary = (threading.get_ident(), step)
            try:
                saved = self.guard.run_save(step, EMERGENCY if urgent else LAST,
                                            force=self.dist.distributed)
            finally:
                self._boundary = None
        elif due:
            saved = self.save(step)
        elif self.buffer.unprepared and self.dist.is_writer and not self.dist.sharded:
            # Optimizer state exists after the first step: size the buffer now, in the background.
            self.buffer.prepare(self.state_tree_local(step))
        # After a notice every step is reported: the next attempt's count of lost steps (the
        # finished steps it computes again) reads the last one from here.
        if now - self._last_progress_t >= self.progress_interval_s or saved or \
                self.guard.notice_info is not None:
            self.write_progress()
        return saved

    def _capture(self, step: int, deferrable: set[int] | None = None) -> Snapshot | None:
        """Snapshot the state: a collective under torchrun; the writer rank alone gets it."""
        tree = self.state_tree(step)   # every rank: gathers the ranks' RNG and extras
        if not self.dist.is_writer:
            return None
        return self.buffer.capture(step, tree, deferrable)

    def save(self, step: int, *, wait: bool = False) -> bool:
        """Snapshot now and persist (in the background unless async is off); False if deferred."""
        with self._io:
            return self._save(step, wait)

    def _save(self, step: int, wait: bool) -> bool:
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
            from spotrun.torch.sharded import save_sharded   # start-up cost, as in restore()
            if save_sharded(self, step) is not None:
                self.last_checkpoint_step = step
            self._saved_step, self._last_save_t = step, self.clock()
            self.checkpoint_save_s = self._last_save_t - t0
            self.saves += 1
            return True
        snap = self._capture(step, self._deferrable())
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
        """Save step `step` now (the loop is at its boundary) and wait; returns seconds since notice."""
        if self.guard.notice_info is None:
            self.guard.notice()
        self._remember(step)
        self.guard.step_finished(step)
        self._boundary = (threading.get_ident(), step)
        try:
            self.guard.run_save(step, EMERGENCY, force=True)
        finally:
            self._boundary = None
        return self.emergency_save_s or 0.0

    def wait(self) -> None:
        """Block until the in-flight persist (if any) is done; raises if it failed."""
        with self._io:
            self.persister.wait()
            self._collect()

    def finish(self, step: int) -> None:
        """Leave a checkpoint of the final state (extras included) and wait until it is in the store."""
        self.current_step = step
        with self._io:
            self.wait()
            if self.dist.sharded:
                # Every rank must take the same branch: save() is a collective under torchrun.
                (need,) = self.dist.any_flags(self._saved_step != step)
                if need:
                    self.save(step, wait=True)
            else:
                snap = self._capture(step)   # a collective under torchrun
                same = snap is None or (self._saved_step == step and self.last_checkpoint_step == step
                                        and matches_saved(self.store, snap, self.shard_bytes or SHARD_BYTES))
                (need,) = self.dist.any_flags(not same)
                if need and snap is not None:
                    self._record(self.persister.run(snap, self.dist.manifest_extra()))
                    self.saves += 1
                self._saved_step = step
        self.dist.barrier()
        self.write_progress()

    def close(self) -> None:
        """Wait for the in-flight persist, stop the notice watchdog, put SIGUSR1's handler back."""
        try:
            self.wait()
        finally:
            self.guard.close()
            for h in self._hooks:
                h.remove()
            self._hooks = []
            self.overlap_snapshot = False

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
