"""The Agent's multi-node part: wait to be listed, start the command as this node, and
restart the command (never the instance, nor the agent) when the rendezvous moves.

See nodes.py for the membership file. The daemon rewrites nodes.json when a node
is lost and again when its replacement is launched; torchrun's own restarts
(PET_MAX_RESTARTS) re-run the rendezvous for a replaced peer, so the agent only
restarts its command when what the command was started with changed: the
endpoint (the rendezvous host was lost), whether this node hosts the store, or
the node count. A command that fails is given `rdzv_change_wait_s` for such a
rewrite (a survivor's torchrun may notice a lost host before the daemon does)
before the failure counts - longer while nodes.json lists fewer than the minimum
of nodes (a replacement on its way), up to `deadman_timeout_s`.
"""

from __future__ import annotations

import signal
import subprocess
import threading
from typing import Any

import structlog

from spotrun import layout
from spotrun.agent.child import notice_path, record_notice, spawn, write_notice_file
from spotrun.agent.clock import Clock
from spotrun.agent.config import AgentConfig
from spotrun.agent.fence import GuardedReporter
from spotrun.agent.imds import InstanceMetadata
from spotrun.agent.logship import OutputTee
from spotrun.agent.nodes import (MARKER_ENV, Membership, any_marked, new_marker, node_env,
                                 rdzv_change_wait_s, signal_marked)
from spotrun.agent.notice import notice_poll_interval_wall_s
from spotrun.agent.setup import AgentPaths
from spotrun.secrets import Redactor

log = structlog.get_logger("spotrun.agent")


class MultiNode:
    """Mixed into Agent (agent/attempt.py); every method is a no-op or the single-node path when
    not multi. The host holds the attempt's state declared here and gives heartbeat(phase),
    begin_stop(reason), _poll_control() and _signal_child(sig)."""

    # The host's state this part reads and sets (Agent.__init__ makes it).
    config: AgentConfig
    clock: Clock
    paths: AgentPaths
    environ: dict[str, str]
    imds: InstanceMetadata
    reporter: GuardedReporter
    multi: bool
    instance_id: str | None
    proc: subprocess.Popen | None
    stop_reason: str | None
    _kill_at: float | None
    _signal_flag: bool
    _tee: OutputTee | None

    def init_multi_node(self) -> None:
        """State of the multi-node part (set in Agent.__init__)."""
        self.marker: str | None = None            # MARKER_ENV of the running command
        self.membership: Membership | None = None   # what the command was started with
        self.seen: Membership | None = None         # the newest nodes.json read
        self.restart_to: Membership | None = None   # the command is stopping for this one
        self.restarts = 0
        self.base_env: dict[str, str] = {}
        self.redact: list[str] = []
        self.notice_raw: dict[str, Any] | None = None
        self._pause = threading.Event()             # never set: a sleep the tests do not see

    # ------------------------------------------------------------ reports

    def node_fields(self) -> dict[str, Any]:
        """What a node adds to its heartbeat and exit report."""
        if not self.multi:
            return {}
        rank = self.membership.rank_of(self.instance_id or "") if self.membership else None
        return {"instance_id": self.instance_id, "node_rank": rank,
                "command_restarts": self.restarts}

    def writes_outputs(self) -> bool:
        """Only one node uploads the job's outputs (the same paths on every node): rank 0."""
        return not self.multi or (self.membership is not None
                                  and self.membership.rank_of(self.instance_id or "") == 0)

    def notice_for_workers(self) -> None:
        """Ask for a save through the notice file too: torchrun's workers never see SIGUSR1,
        and a job busy in one long C call runs no signal handler until it returns, while the
        library's watchdog reads the file."""
        try:
            write_notice_file(notice_path(self.paths.progress_path), {"action": "stop"},
                              seen_wall_s=self.clock.time(), terminate_at_unix_s=None)
        except OSError as exc:
            log.error("notice_file_failed", error=str(exc)[:200])

    # ------------------------------------------------------------ membership

    def read_membership(self) -> Membership | None:
        """nodes.json now; None when missing, malformed or unreadable (the last one stands)."""
        try:
            raw = self.reporter.read_json(layout.nodes_key(self.config.job_id,
                                                           self.config.attempt))
        except Exception as exc:   # store trouble: keep what we have
            log.warning("nodes_read_failed", error=str(exc)[:300])
            return None
        found = Membership.parse(raw)
        if found is None and raw is not None:
            log.warning("nodes_malformed")
        if found is not None:
            self.seen = found
        return found

    def _idle(self, next_beat: float) -> float:
        """Heartbeat when due, then pause one control interval; returns the next beat time."""
        now = self.clock.monotonic()
        if now >= next_beat:
            self.heartbeat("waiting")
            next_beat = now + self.config.heartbeat_interval_s
        self._pause.wait(self.config.control_poll_interval_s)
        return next_beat

    def _stopped(self) -> bool:
        """A signal or a control request ends a wait (stop_reason says which)."""
        if self._signal_flag:
            self.stop_reason = "signal"
            return True
        self._poll_control()
        return self.stop_reason is not None

    def await_listing(self) -> bool:
        """Wait until nodes.json lists this instance; False when stopped or never listed."""
        deadline = self.clock.monotonic() + self.config.deadman_timeout_s
        next_beat = 0.0
        logged = False
        while True:
            if self._stopped():
                return False
            found = self.read_membership()
            if found is not None and found.rank_of(self.instance_id or "") is not None:
                self.membership = found
                log.info("node_listed", rank=found.rank_of(self.instance_id or ""),
                         nnodes=found.nnodes_text(), endpoint=found.rdzv_endpoint)
                return True
            if self.clock.monotonic() >= deadline:
                log.error("node_never_listed", instance=self.instance_id)
                return False
            if not logged:
                log.info("waiting_for_listing", instance=self.instance_id)
                logged = True
            next_beat = self._idle(next_beat)

    def poll_membership(self) -> None:
        """In the loop: stop when removed; restart the command when its rendezvous moved."""
        found = self.read_membership()
        if found is None or self.membership is None or self.instance_id is None:
            return
        if found.rank_of(self.instance_id) is None:
            log.error("node_removed", version=found.version)
            self.begin_stop("removed")
            return
        if self.restart_to is not None or self.stop_reason is not None:
            return
        if found.launch_key(self.instance_id) != self.membership.launch_key(self.instance_id):
            self.restart_to = found
            self._kill_at = self.clock.monotonic() + self.config.stop_grace_s
            self._signal_child(signal.SIGTERM)
            log.warning("rendezvous_changed", endpoint=found.rdzv_endpoint,
                        host_rank=found.rdzv_host_rank, nnodes=found.nnodes_text())

    def restart_wanted(self, returncode: int) -> bool:
        """After the command ended: start it again (True), or finish the attempt (False)."""
        if returncode == 0:
            return False
        if self.restart_to is not None:
            return True
        assert self.instance_id is not None and self.membership is not None
        seen_version = self.seen.version if self.seen else self.membership.version
        wait_s = rdzv_change_wait_s(self.config, self.environ)
        deadline = self.clock.monotonic() + wait_s
        # While nodes are missing (a replacement is being launched, maybe for longer than
        # torchrun's join_timeout) the wait goes on, up to the dead-man bound.
        longest = self.clock.monotonic() + self.config.deadman_timeout_s
        log.warning("command_failed_waiting_for_rendezvous", returncode=returncode,
                    wait_s=wait_s)
        next_beat = 0.0
        while self.clock.monotonic() < deadline:
            if self._stopped():
                return False
            found = self.read_membership()
            if found is not None:
                if found.rank_of(self.instance_id) is None:
                    self.stop_reason = "removed"
                    return False
                if found.version > seen_version or found.launch_key(self.instance_id) != \
                        self.membership.launch_key(self.instance_id):
                    self.restart_to = found
                    return True
                if len(found.ranks) < found.nnodes_min:
                    deadline = min(longest, max(deadline, self.clock.monotonic() + wait_s))
            next_beat = self._idle(next_beat)
        return False

    # ------------------------------------------------------------ the command

    def start_command(self, env: dict[str, str]) -> None:
        """Start the command (as this node, in a multi-node attempt) and tee its output."""
        if self.multi:
            assert self.membership is not None and self.instance_id is not None
            self.base_env = dict(env)
            env = dict(env)
            env.update(node_env(self.membership, self.instance_id, self.base_env))
            self.marker = new_marker()
            env[MARKER_ENV] = self.marker
        self.proc = spawn(self.config.command, cwd=self.paths.job_dir, env=env,
                          log_path=self.paths.log_path, pipe=True)
        assert self.proc.stdout is not None
        self._tee = OutputTee(self.proc.stdout, self.paths.log_path,
                              Redactor(self.redact)).start()
        log.info("command_started", pid=self.proc.pid, **self.node_fields())

    def restart_command(self) -> None:
        """Stop what is left of the command (torchrun's workers outlive its shell), start anew."""
        assert self.restart_to is not None
        deadline = self.clock.monotonic() + self.config.stop_grace_s
        if any_marked(self.marker):
            signal_marked(self.marker, signal.SIGTERM)
        while any_marked(self.marker) and self.clock.monotonic() < deadline:
            self._pause.wait(0.05)
        signal_marked(self.marker, signal.SIGKILL)
        self._kill_at = None
        if self._tee is not None and not self._tee.join():
            log.warning("job_output_still_open")
        self.membership, self.restart_to = self.restart_to, None
        self.restarts += 1
        self.start_command(self.base_env)
        if self.notice_raw is not None:   # this node is still going away: tell the new command
            record_notice(notice_path(self.paths.progress_path), self.notice_raw,
                          seen_wall_s=self.clock.time(),
                          time_scale=self.config.time_scale,
                      notice_rate=self.config.notice_time_scale,
                          imds=self.imds, poll_wall_s=notice_poll_interval_wall_s(self.config))
