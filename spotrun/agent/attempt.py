"""The agent: run one attempt of a job and report on it through the store.

One main loop does heartbeats, log shipping, control/dead-man polling and the
stop sequence; the interruption notice is polled on its own thread (see
notice.py). Signal handlers only set a flag the loop reads.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

import structlog

from spotrun import layout
from spotrun.agent.child import (child_env, exit_code_of, notice_path, output_tail,
                                 record_notice, signal_group)
from spotrun.checkpoints import checkpoint_step
from spotrun.agent.clock import Clock, SystemClock, iso
from spotrun.agent.config import AgentConfig
from spotrun.agent.deadman import DeadmanSwitch
from spotrun.agent.fence import AttemptFence, GuardedReporter, fenced_key, instance_identity
from spotrun.agent.imds import PHASE, InstanceMetadata, open_metadata
from spotrun.agent.logship import LogShipper, OutputTee
from spotrun.agent.multinode import MultiNode
from spotrun.agent.nodes import is_multi_node, signal_marked
from spotrun.agent.outputs import OutputUploader
from spotrun.agent.notice import NoticeWatcher, notice_poll_interval_wall_s
from spotrun.agent.progress_file import ProgressReader
from spotrun.agent.setup import AgentPaths, job_dir_for, prepare
from spotrun.errors import SpotrunError
from spotrun.reports import ExitReport, Heartbeat, Notice, dump
from spotrun.secrets import ClientFactory, Redactor
from spotrun.store import open_store
from spotrun.store.base import ObjectStore

log = structlog.get_logger("spotrun.agent")

TICK_S = 0.1   # longest the loop sleeps; bounds reaction to child exit and signals
SOFT_OFF_MARGIN_S = 2.0   # left of a soft-off window after the stop's grace (exit, report)


class Agent(MultiNode):
    """One attempt, from setup to exit.json (of one node, in a multi-node attempt)."""

    def __init__(self, config: AgentConfig, *, workdir: str | Path,
                 store: ObjectStore | None = None, checkpoint_store: ObjectStore | None = None,
                 clock: Clock | None = None, environ: Mapping[str, str] | None = None,
                 secret_clients: ClientFactory | None = None,
                 imds: InstanceMetadata | None = None) -> None:
        self.config = config
        self.paths = AgentPaths(Path(workdir).resolve())
        self.store = store or open_store(config.store_uri)
        self.checkpoint_store = checkpoint_store
        self.clock = clock or SystemClock()
        self.environ = dict(os.environ if environ is None else environ)
        self.secret_clients = secret_clients
        # The instance side the config names (IMDSv2, or a provider's own: GCE metadata).
        self.imds = imds or open_metadata(config, environ=self.environ,
                                          monotonic=self.clock.monotonic)
        self.reporter = GuardedReporter(self.store)
        self.fence: AttemptFence | None = None
        self.progress = ProgressReader(self.paths.progress_path)
        self.deadman = DeadmanSwitch(config.deadman_timeout_s, self.clock)
        self.proc: subprocess.Popen | None = None
        self.stop_reason: str | None = None
        self._kill_at: float | None = None
        self._save_then_stop: tuple[str, float, Any] | None = None  # (reason, deadline, baseline)
        self._signal_flag = False
        self._notice_lock = threading.Lock()
        self._notice: dict[str, Any] | None = None
        self._notice_mono: float | None = None
        self._notice_baseline: Any = None
        self._rebalance: str | None = None
        self._beat_now = False
        self._phases_sent: set[str] = set()
        self.outputs: OutputUploader | None = None
        self._tee: OutputTee | None = None
        self.logship: LogShipper | None = None   # the job's output to the store (run() makes it)
        self.resumed_from: int | None = None   # the step of the checkpoint handed to the job
        # The way back to training (agent wall times, ISO): reported in every heartbeat.
        self.restore_started_at: str | None = None
        self.restore_done_at: str | None = None
        self.first_step_at: str | None = None
        self._beat_step: Any = None   # the step the last heartbeat reported
        self.multi = is_multi_node(config)
        self.instance_id: str | None = None   # known from the start in a multi-node attempt
        self.init_multi_node()

    # ------------------------------------------------------------ reports

    def _key(self, fn: Any) -> str:
        return fn(self.config.job_id, self.config.attempt)

    def _report_key(self, kind: str) -> str:
        """heartbeat / exit / notice: the attempt's, or this node's in a multi-node attempt."""
        if self.multi and self.instance_id:
            fn = {"heartbeat": layout.node_heartbeat_key, "exit": layout.node_exit_key,
                  "notice": layout.node_notice_key}[kind]
            return fn(self.config.job_id, self.config.attempt, self.instance_id)
        return self._key({"heartbeat": layout.heartbeat_key, "exit": layout.exit_key,
                          "notice": layout.notice_key}[kind])

    def _signal_child(self, sig: int) -> bool:
        """Signal the command's group and (multi-node) every process it started elsewhere."""
        sent = self.proc is not None and signal_group(self.proc, sig)
        return signal_marked(self.marker, sig) > 0 or sent

    def heartbeat(self, phase: str) -> None:
        """Write heartbeat.json with the latest progress."""
        p = self.progress.read()
        total = p.get("total_steps")
        if total is None:
            total = self.config.total_steps
        self._beat_step = p.get("step")
        self.reporter.put_json(self._report_key("heartbeat"), dump(Heartbeat(
            ts=iso(self.clock.time()), attempt=self.config.attempt, phase=phase,
            step=p.get("step"), total_steps=total, steps_per_s=p.get("steps_per_s"),
            last_checkpoint_step=p.get("last_checkpoint_step"),
            checkpoint_save_s=p.get("checkpoint_save_s"),
            checkpoint_failures=p.get("checkpoint_failures"),
            checkpoint_error_step=p.get("checkpoint_error_step"),
            checkpoint_error=p.get("checkpoint_error"),
            notice=self._notice is not None, rebalance=self._rebalance,
            # The checkpoint this attempt really restored (the daemon's plan may differ).
            resumed_from=self.resumed_from, restore_started_at=self.restore_started_at,
            restore_done_at=self.restore_done_at, first_step_at=self.first_step_at,
            **self.node_fields())))

    def _write_exit(self, reason: str, exit_code: int | None, message: str | None = None,
                    log_tail: str | None = None) -> None:
        self.reporter.put_json(self._report_key("exit"), dump(ExitReport(
            ts=iso(self.clock.time()), exit_code=exit_code, reason=reason,
            step=self.progress.read().get("step"), message=message[:500] if message else None,
            log_tail=log_tail, **self.node_fields())))

    def _failure_tail(self, code: int) -> str | None:
        """A failed command's last output lines, redacted as its shipped logs are."""
        if code == 0:
            return None
        tail = output_tail(self.paths.log_path)
        if tail is None:
            return None
        redactor = Redactor(self.redact)
        return (redactor.feed(tail.encode()) + redactor.finish()).decode("utf-8", "replace")

    # ------------------------------------------------------------ notice (notice thread)

    def _on_notice(self, info: dict[str, Any]) -> None:
        # The file first: a job that cannot take the signal yet reads it when its library starts.
        record_notice(notice_path(self.paths.progress_path), info, seen_wall_s=self.clock.time(),
                      time_scale=self.config.time_scale,
                      notice_rate=self.config.notice_time_scale,
                      imds=self.imds,
                      poll_wall_s=notice_poll_interval_wall_s(self.config))
        self.notice_raw = dict(info)   # written again if the command restarts
        signalled = self._signal_child(signal.SIGUSR1)
        now = self.clock.time()
        with self._notice_lock:
            self._notice_baseline = self.progress.read().get("emergency_checkpoint_step")
            self._notice_mono = self.clock.monotonic()
            self._notice = {"ts": iso(now), "action": info.get("action"), "time": info.get("time"),
                            "signalled_at": iso(now) if signalled else None,
                            "emergency_checkpoint_step": None, "emergency_save_s": None,
                            "outcome": None if signalled else
                            "no emergency checkpoint: the job could not be signalled"}
            self.reporter.put_json(self._report_key("notice"), dump(Notice(**self._notice)))
        self._beat_now = True
        if self.logship is not None:   # the job's output as it comes: the reclaim ends it
            self.logship.ship_now()
        if self.outputs is not None:
            self.outputs.start("notice")   # what exists now, before the instance goes
        log.warning("interruption_notice", action=info.get("action"), time=info.get("time"),
                    signalled=signalled)

    def _on_rebalance(self, info: dict[str, Any]) -> None:
        self._rebalance = str(info.get("noticeTime") or info.get("raw") or "seen")
        self._beat_now = True
        log.info("rebalance_recommendation", notice_time=self._rebalance)

    def _check_emergency_save(self, ended: str | None = None) -> None:
        """Report the notice's outcome: the emergency save once the progress file shows it, or
        the job's word on why there is none yet (ended: the command is gone, the word is final)."""
        with self._notice_lock:
            notice = self._notice
            if notice is None:
                return
            p = self.progress.read()
            said = p.get("notice_outcome") if isinstance(p.get("notice_outcome"), str) else None
            step = p.get("emergency_checkpoint_step")
            saved = notice["emergency_checkpoint_step"] is None and step is not None \
                and step != self._notice_baseline
            if saved:
                took = round(self.clock.monotonic() - (self._notice_mono or 0.0), 3)
                notice.update(emergency_checkpoint_step=step, emergency_save_s=took)
                log.info("emergency_checkpoint_seen", step=step, save_s=took)
            outcome = notice_outcome(notice, said, ended)
            if outcome == notice["outcome"] and not saved:
                return
            notice["outcome"] = outcome
            self.reporter.put_json(self._report_key("notice"), dump(Notice(**notice)))
        if notice["emergency_checkpoint_step"] is None:
            log.warning("notice_outcome", outcome=outcome)

    # ------------------------------------------------------------ a paced market's phases

    def _report_phases(self) -> None:
        """Tell a paced local market once the job trains past its resume step."""
        if not self.config.report_phases or "training" in self._phases_sent:
            return
        step = self.progress.read().get("step")
        if step is not None and (self.resumed_from is None or step > self.resumed_from):
            self._send_phase("training")

    def _watch_progress(self) -> None:
        """When the restore ended and the first new step came (as the progress file shows
        them), and after a notice a heartbeat at every new step: a reclaim ends the agent
        without an exit report, so its last heartbeat is all that tells the steps it lost."""
        step = self.progress.read().get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            return
        base = self.resumed_from or 0
        if self.first_step_at is None:
            now = iso(self.clock.time())
            if step > base:
                # Restore and first step inside one progress refresh: the restore's end unseen.
                self.first_step_at = now
                self._beat_now = True
            elif step == base and self.restore_done_at is None:
                # The library reports its restored step before the first new one (its
                # watchdog rewrites the file); a step below it is from before the restore.
                self.restore_done_at = now
        if self._notice is not None and step != self._beat_step:
            self._beat_now = True

    def _send_phase(self, phase: str) -> None:
        try:
            self.imds.put(PHASE, {"phase": phase})
        except SpotrunError as exc:   # the market keeps its clock at x1: tried again next tick
            log.warning("phase_report_failed", phase=phase, error=str(exc)[:200])
            return
        self._phases_sent.add(phase)

    # ------------------------------------------------------------ stopping

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signal_flag = True   # only a flag: the loop does the work

    def _on_stop_signal(self) -> None:
        """SIGTERM/SIGINT: stop the job. Where the guest's shutdown signal is the interruption
        notice (GCE's ACPI soft-off), it is one first: save, then stop, inside the window."""
        window_s = self.imds.soft_off_notice_s
        if window_s is None or self.stop_reason is not None or self.proc is None:
            self.begin_stop("signal")
            return
        if self._notice is None:
            self._on_notice({"action": "soft-off",
                             "time": iso(self.clock.time() + window_s)})
        if self._save_then_stop is None:
            # Wait for the notice's save, leaving the stop its grace inside the window.
            wait_s = max(1.0, window_s - self.config.stop_grace_s - SOFT_OFF_MARGIN_S)
            self._save_then_stop = ("signal", self.clock.monotonic() + wait_s,
                                    self._notice_baseline)
            log.warning("soft_off_notice", window_s=window_s, save_wait_s=wait_s)

    def begin_stop(self, reason: str) -> None:
        """SIGTERM the job's group; SIGKILL follows after the grace."""
        if self.stop_reason is not None:
            return
        self.stop_reason = reason
        if self.proc is None:   # waiting to be listed: the command never starts
            return
        self._kill_at = self.clock.monotonic() + self.config.stop_grace_s
        self._signal_child(signal.SIGTERM)
        log.warning("stopping_job", reason=reason, grace_s=self.config.stop_grace_s)

    def begin_save_then_stop(self, reason: str) -> None:
        """Ask the job to checkpoint now (SIGUSR1), then stop it once saved or after the grace."""
        if self._save_then_stop is not None or self.stop_reason is not None or self.proc is None:
            return
        baseline = self.progress.read().get("emergency_checkpoint_step")
        self.notice_for_workers()
        self._signal_child(signal.SIGUSR1)
        self._save_then_stop = (reason, self.clock.monotonic() + self.config.stop_grace_s,
                                baseline)
        log.warning("checkpoint_then_stop", reason=reason)

    def _ending_for(self) -> str | None:
        """Why the agent is ending the attempt: a stop under way, or a save-then-stop asked."""
        if self.stop_reason is not None or self._save_then_stop is None:
            return self.stop_reason
        return self._save_then_stop[0]

    def _check_save_then_stop(self) -> None:
        if self._save_then_stop is None or self.stop_reason is not None:
            return
        reason, deadline, baseline = self._save_then_stop
        step = self.progress.read().get("emergency_checkpoint_step")
        if (step is not None and step != baseline) or self.clock.monotonic() >= deadline:
            self.begin_stop(reason)

    def _claim_attempt(self) -> bool:
        """Claim the attempt before any write to it; False: another instance acts as it."""
        me = instance_identity(self.environ, self.imds)
        fence = AttemptFence(self.store, self.config.job_id, self.config.attempt, me)
        try:
            ours = fence.claim()
        except Exception as exc:   # the store cannot say who holds it: do not run
            log.error("attempt_claim_failed", instance=me, error=str(exc)[:300])
            return False
        if not ours:
            log.error("attempt_fenced", instance=me, holder=fence.holder)
            self.reporter.put_json(fenced_key(self.config.job_id, self.config.attempt, me), {
                "ts": iso(self.clock.time()), "instance_id": me, "holder": fence.holder})
            return False
        self.fence = fence
        return True

    def _poll_control(self) -> None:
        if self.fence is not None and not self.reporter.fenced and not self.fence.still_ours():
            log.error("attempt_claim_lost", holder=self.fence.holder)
            self.reporter.fenced = True   # from now on nothing is written as this attempt
            self.begin_stop("fenced")
        try:
            control = self.reporter.read_json(layout.control_key(self.config.job_id))
            if control and control.get("cancel") is True:
                self.begin_stop("cancelled")
                return
            if control and control.get("checkpoint_and_stop") and _addressed(
                    control.get("attempts"), self.config.attempt):
                self.begin_save_then_stop(str(control.get("reason") or "budget"))
            self.deadman.observe(self.reporter.read_json(layout.DAEMON_ALIVE))
        except Exception as exc:   # store trouble: the dead-man clock keeps running
            log.warning("control_read_failed", error=str(exc)[:300])
        if self.deadman.expired():
            log.error("daemon_silent", silent_s=round(self.deadman.silent_s(), 1))
            self.begin_stop("deadman")

    # ------------------------------------------------------------ run

    def run(self) -> int:
        """Run the attempt; returns the process exit code (the command's, 0 on success)."""
        if threading.current_thread() is threading.main_thread():   # only there can it
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._on_signal)
        log.info("agent_start", job_id=self.config.job_id, attempt=self.config.attempt,
                 nodes=self.config.nodes)
        self.restore_started_at = iso(self.clock.time())   # boot ends, setup and restore begin
        if self.multi:
            self.instance_id = instance_identity(self.environ, self.imds)
        elif not self._claim_attempt():
            self._shutdown()
            return 1
        self.heartbeat("setup")
        log_prefix = layout.log_prefix(self.config.job_id, self.config.attempt)
        if self.multi:
            assert self.instance_id is not None
            log_prefix = layout.node_log_prefix(self.config.job_id, self.config.attempt,
                                                self.instance_id)
            # Listed first: the node's rank names its job directory.
            if not self.await_listing():
                reason = self.stop_reason or "error"
                self.heartbeat("exited")
                self._write_exit(reason, None, "never listed in nodes.json"
                                 if reason == "error" else None)
                self._shutdown()
                return 1
        try:
            rank = (self.membership.rank_of(self.instance_id or "") or 0
                    if self.multi and self.membership else 0)
            self.paths = replace(self.paths, job=job_dir_for(self.config, rank))
            prepared = prepare(self.config, store=self.store, paths=self.paths,
                               environ=self.environ, secret_clients=self.secret_clients,
                               checkpoint_store=self.checkpoint_store)
        except Exception as exc:   # any setup failure ends the attempt with a reason
            message = f"setup failed: {exc}"
            log.error("setup_failed", error=message[:500])
            self.heartbeat("exited")
            self._write_exit("error", None, message)
            self._shutdown()
            return 1
        if self._signal_flag:   # told to stop while setting up: never start the command
            self.heartbeat("exited")
            self._write_exit("signal", None, "agent signalled during setup")
            self._shutdown()
            return 128 + signal.SIGTERM
        self.resumed_from = checkpoint_step(prepared.resume_checkpoint)
        env = child_env(self.config, base=self.environ, secrets=prepared.secrets,
                        resume_checkpoint=prepared.resume_checkpoint,
                        progress_file=self.paths.progress_path, job_dir=self.paths.job_dir)
        self.redact = list(prepared.secrets.values())
        shipper = self.logship = LogShipper(self.reporter, log_prefix, self.paths.log_path,
                                            Redactor(self.redact))
        self.start_command(env)
        del env, prepared
        if self.config.outputs and self.writes_outputs():
            self.outputs = OutputUploader(self.store, self.config.job_id, self.config.attempt,
                                          self.paths.job_dir, self.config.outputs,
                                          clock=self.clock.time)
        watcher = NoticeWatcher(self.imds, notice_poll_interval_wall_s(self.config),
                                self._on_notice, self._on_rebalance)
        watcher.start()
        try:
            returncode = self._loop(shipper)
            while self.multi and self._ending_for() is None and self.restart_wanted(returncode):
                self.restart_command()
                returncode = self._loop(shipper)
        finally:
            watcher.stop()
        return self._finish(returncode, shipper)

    def _loop(self, shipper: LogShipper) -> int:
        assert self.proc is not None
        cfg = self.config
        now = self.clock.monotonic()
        next_beat, next_flush, next_control = now, now + cfg.log_flush_interval_s, now
        while True:
            if self._signal_flag:
                self._on_stop_signal()
            returncode = self.proc.poll()
            if returncode is not None:
                return returncode
            now = self.clock.monotonic()
            if now >= next_control:
                self._poll_control()
                if self.multi:
                    self.poll_membership()
                next_control = now + cfg.control_poll_interval_s
            self._check_emergency_save()
            self._check_save_then_stop()
            self._report_phases()
            self._watch_progress()
            if now >= next_beat or self._beat_now:
                self._beat_now = False
                self.heartbeat("running")
                next_beat = now + cfg.heartbeat_interval_s
            if now >= next_flush:
                shipper.flush()
                next_flush = now + cfg.log_flush_interval_s
            if self._kill_at is not None and now >= self._kill_at:
                log.error("job_ignored_sigterm", action="SIGKILL")
                self._signal_child(signal.SIGKILL)
                self._kill_at = None
            wait_s = min(TICK_S, max(0.0, min(next_beat, next_flush, next_control)
                                     - self.clock.monotonic()))
            try:
                self.proc.wait(timeout=max(wait_s, 0.005))
            except subprocess.TimeoutExpired:
                pass

    def _finish(self, returncode: int, shipper: LogShipper) -> int:
        assert self.proc is not None
        # Leftovers of the group (background jobs, workers) must not outlive the attempt.
        self._signal_child(signal.SIGKILL)
        code = exit_code_of(returncode)
        # A job that fails while asked to save and stop (budget) ended for that reason.
        reason = self.stop_reason or ("completed" if code == 0 else self._ending_for() or "error")
        self._check_emergency_save(ended=f"the job ended: {reason}, exit code {code}")
        if self._tee is not None and not self._tee.join():
            log.warning("job_output_still_open")   # an escaped process holds the pipe
        # The output's end first: outputs may take long, and a reclaim may not wait.
        shipper.flush(final=True)
        if self.outputs is not None:
            self.outputs.join()
            self.outputs.upload_safely("exit")
        tail = self._failure_tail(code)
        self._remove_local_log(shipper)
        self.heartbeat("exited")
        self._write_exit(reason, code, log_tail=tail)
        log.info("agent_exit", reason=reason, exit_code=code, log_segments=shipper.seq,
                 failed_writes=self.reporter.failed_writes)
        self._shutdown()
        return code

    def _remove_local_log(self, shipper: LogShipper) -> None:
        """Clean the instance disk of the job's output once all of it is in the store."""
        if shipper.pending:
            log.warning("local_log_kept", path=str(self.paths.log_path),
                        reason="not every segment reached the store")
            return
        try:
            self.paths.log_path.unlink()
        except FileNotFoundError:
            pass

    def _shutdown(self) -> None:
        """Run the configured shutdown command (AWS); locally exiting is the shutdown."""
        cmd = self.config.shutdown_command
        if not cmd:
            return
        try:
            subprocess.run(["bash", "-c", cmd], timeout=120, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except (subprocess.SubprocessError, OSError) as exc:
            log.error("shutdown_command_failed", error=str(exc)[:300])


def notice_outcome(notice: Mapping[str, Any], said: str | None, ended: str | None) -> str | None:
    """The outcome notice.json carries: the job library's own words where it gave them."""
    step = notice.get("emergency_checkpoint_step")
    if step is not None:
        if said and said.startswith("emergency checkpoint"):
            return said
        return f"emergency checkpoint at step {step} in {notice.get('emergency_save_s') or 0:.2f} s"
    if said and said.startswith("no emergency checkpoint"):
        return said if ended is None else f"{said}; {ended}"
    if ended is not None:
        return f"no emergency checkpoint: {ended}, reporting none"
    return notice.get("outcome") or "no emergency checkpoint: the job has not reported one yet"


def _addressed(attempts: Any, attempt: int) -> bool:
    """Is a stop request for this attempt? One naming no attempts (older daemons) is for all."""
    if attempts is None:
        return True
    return isinstance(attempts, list) and attempt in attempts
