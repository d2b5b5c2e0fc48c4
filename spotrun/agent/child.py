"""Start the job's command in its own process group, and signal that group.

The command runs under `bash -c` with SIGUSR1 ignored from its first instruction
(set before exec; `trap ''` too where there is no preexec hook): a shell left
waiting on a multi-command line would otherwise die of the interruption notice.
Ignored signals pass to the shell's children as ignored, so a job that does not
handle SIGUSR1 keeps running (the notice never kills it), and one that installs a
handler (the training library does) gets it.

A signal that lands before the job installed its handler is ignored, so the
notice itself is also a file: the agent writes `SPOTRUN_NOTICE_FILE` (action,
IMDS termination time, and that time on this machine's wall clock) *before*
signalling, and the library reads it when it starts and keeps looking at it.

If the agent itself is killed outright (the local market's reclaim), Linux
delivers SIGKILL to the command too (PR_SET_PDEATHSIG), as when a real
instance vanishes; the group id is also left in a file for whoever cleans up.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

from spotrun import jobfiles
from spotrun.agent.clock import parse_iso
from spotrun.agent.config import AgentConfig
from spotrun.errors import SpotrunError

SHELL_PREFIX = "trap '' USR1\n"
PGID_FILE = "job.pgid"   # beside the log: the command's process group id
NOTICE_FILE = "notice.json"   # beside the progress file: SPOTRUN_NOTICE_FILE
NOTICE_ENV = "SPOTRUN_NOTICE_FILE"
_PR_SET_PDEATHSIG = 1


def _die_with_parent_fn() -> Callable[[], None] | None:
    """A preexec function binding the child's life to the agent's and starting it with
    SIGUSR1 ignored (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)   # looked up before fork, not after
        prctl, set_handler = libc.prctl, libc.signal
    except (OSError, AttributeError):
        return None
    set_handler.argtypes, set_handler.restype = [ctypes.c_int, ctypes.c_void_p], ctypes.c_void_p
    parent = os.getpid()

    def preexec() -> None:
        # Ignored before exec, not by the shell's `trap` line: a signal sent in the moment
        # between the start and that line would kill the shell (and the job) outright.
        set_handler(int(signal.SIGUSR1), 1)   # SIG_IGN
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:   # the agent died before prctl took effect
            os._exit(137)

    return preexec


def child_env(config: AgentConfig, *, base: Mapping[str, str], secrets: Mapping[str, str],
              resume_checkpoint: str | None, progress_file: Path,
              job_dir: Path | None = None) -> dict[str, str]:
    """os.environ + job env + secrets + the SPOTRUN_* contract variables (last wins)."""
    env = dict(base)
    # `python` in the command means the interpreter spotrun runs under (the instance's venv),
    # whatever PATH the instance booted with.
    bindir = str(Path(sys.executable).parent)
    path = env.get("PATH", "")
    if bindir not in path.split(os.pathsep):
        env["PATH"] = bindir + (os.pathsep + path if path else "")
    # Python's output reaches the agent line by line, not when an 8 KB buffer fills: a reclaim
    # kills the job with what its buffer holds (the AWS unit sets it too; the spec's env wins).
    if not env.get("PYTHONUNBUFFERED"):
        env["PYTHONUNBUFFERED"] = "1"
    env.update(config.env)
    env.update(secrets)
    env.update({
        "SPOTRUN_JOB_ID": config.job_id,
        "SPOTRUN_ATTEMPT": str(config.attempt),
        "SPOTRUN_GPUS": str(config.gpus),
        "SPOTRUN_CHECKPOINT_URI": config.checkpoint_uri,
        "SPOTRUN_CHECKPOINT_KEEP": str(config.checkpoint_keep),
        "SPOTRUN_RESUME_CHECKPOINT": resume_checkpoint or "",
        "SPOTRUN_PROGRESS_FILE": str(progress_file.resolve()),
        NOTICE_ENV: str(notice_path(progress_file).resolve()),
        # The job's files (docs/job-spec.md, "persist"): the agent restored the resume
        # checkpoint's already, so the job's library does not fetch them again.
        jobfiles.PERSIST_ENV: json.dumps(list(config.persist)),
        jobfiles.RESTORED_ENV: resume_checkpoint or "",
    })
    if job_dir is not None:
        env[jobfiles.JOB_DIR_ENV] = str(job_dir)
    if config.checkpoint_interval_s is not None:
        env["SPOTRUN_CHECKPOINT_INTERVAL_S"] = str(config.checkpoint_interval_s)
    else:
        env.pop("SPOTRUN_CHECKPOINT_INTERVAL_S", None)
    if config.total_steps is not None:
        env["SPOTRUN_TOTAL_STEPS"] = str(config.total_steps)
    else:
        env.pop("SPOTRUN_TOTAL_STEPS", None)
    return env


def notice_path(progress_file: Path) -> Path:
    """Where the agent writes the notice for the job (beside the progress file)."""
    return progress_file.parent / NOTICE_FILE


def notice_deadline_unix_s(info: Mapping[str, Any], *, seen_wall_s: float, time_scale: float,
                           notice_time: str | None = None, poll_wall_s: float = 0.0,
                           notice_rate: float | None = None) -> float | None:
    """The termination time on this machine's wall clock (epoch s), or None if unknown.

    On AWS (time_scale 1) it is the IMDS `time`. The local market's `time` is on its
    own faster clock: then the window (termination - notice time, both market) is
    scaled to wall seconds from when the agent saw the notice, less one poll interval
    (it may have been posted that much earlier). A paced market runs its notices at
    notice_rate market seconds per wall second instead of time_scale.
    """
    end = parse_iso(str(info.get("time"))) if info.get("time") else None
    if end is None:
        return None
    if time_scale == 1.0:
        return end
    start = parse_iso(notice_time) if notice_time else None
    if start is None or end < start:
        return None
    return seen_wall_s + (end - start) / (notice_rate or time_scale) - poll_wall_s


def write_notice_file(path: Path, info: Mapping[str, Any], *, seen_wall_s: float,
                      terminate_at_unix_s: float | None) -> None:
    """Write the job's notice file atomically (the library may read it at any moment)."""
    body = {"action": info.get("action"), "time": info.get("time"),
            "seen_at_unix_s": seen_wall_s, "terminate_at_unix_s": terminate_at_unix_s}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(body))
    os.replace(tmp, path)


def record_notice(path: Path, info: Mapping[str, Any], *, seen_wall_s: float, time_scale: float,
                  imds: Any = None, poll_wall_s: float = 0.0,
                  notice_rate: float | None = None) -> float | None:
    """Write the notice file for the job; returns the termination time it carries (or None).

    Never raises: the signal that follows must go out whatever happens here.
    """
    notice_time = None
    if time_scale != 1.0 and imds is not None:
        try:   # the local market posts the rebalance hint at the notice time
            hint = imds.rebalance()
            notice_time = hint.get("noticeTime") if hint else None
        except SpotrunError:
            notice_time = None
    end = notice_deadline_unix_s(info, seen_wall_s=seen_wall_s, time_scale=time_scale,
                                 notice_time=notice_time, poll_wall_s=poll_wall_s,
                                 notice_rate=notice_rate)
    try:
        write_notice_file(path, info, seen_wall_s=seen_wall_s, terminate_at_unix_s=end)
    except OSError:
        pass   # a full or read-only disk: the job still gets the signal
    return end


def spawn(command: str, *, cwd: Path, env: Mapping[str, str], log_path: Path,
          pipe: bool = False) -> subprocess.Popen:
    """Run the command with stdout+stderr appended to log_path, as a new session.

    With pipe=True its output goes to proc.stdout instead (the agent redacts it before
    anything reaches the disk). Call it before starting other threads: the preexec
    hook is not thread-safe. A notice file left by an earlier run in the same folder is
    removed first.
    """
    if env.get(NOTICE_ENV):
        Path(env[NOTICE_ENV]).unlink(missing_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as logf:
        out = subprocess.PIPE if pipe else logf
        proc = subprocess.Popen(["bash", "-c", SHELL_PREFIX + command], cwd=cwd, env=dict(env),
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_die_with_parent_fn())
    (log_path.parent / PGID_FILE).write_text(f"{proc.pid}\n")
    return proc


def signal_group(proc: subprocess.Popen, sig: int) -> bool:
    """Send sig to the child's process group; False if the group is gone."""
    try:
        os.killpg(proc.pid, sig)   # start_new_session: the group id is the child's pid
        return True
    except (ProcessLookupError, PermissionError):
        return False


TAIL_LINES = 5
TAIL_MAX_BYTES = 2000


def output_tail(log_path: Path, lines: int = TAIL_LINES,
                max_bytes: int = TAIL_MAX_BYTES) -> str | None:
    """The last non-blank lines of the command's output, for the exit report of a failure
    (why a command that cannot start failed, without reading its logs); None if none."""
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8 * max_bytes))
            raw = f.read()
    except OSError:
        return None
    kept = [line.rstrip() for line in raw.decode("utf-8", errors="replace").splitlines()
            if line.strip()][-lines:]
    return "\n".join(kept)[-max_bytes:] or None


def exit_code_of(returncode: int) -> int:
    """A shell-style exit code: 128+N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode
