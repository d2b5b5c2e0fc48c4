"""`python -m spotrun` processes forked from one interpreter that imported spotrun once.

A test that starts dozens of CLI or daemon processes pays ~1-1.5 CPU s per process for the
interpreter start and the imports alone, more than most of those processes then do. The
zygote pays it once: it imports spotrun, then forks one child per command. Each child is a
real process of its own that runs `python -m spotrun ARGS` as -m does (runpy): its own pid,
environment, stdout/stderr, signals, exit status and interpreter shutdown, and nothing left
over from any other command (the zygote itself runs no spotrun code). What a child shares
with the others is only the already-imported modules.

Commands sent together start together: the children wait on a barrier (a pipe all of them
read; the zygote closing it wakes them at once), so that they race.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ZYGOTE = r'''
import json, os, runpy, signal, sys
import spotrun.cli, spotrun.cli.jobs, spotrun.cli.daemon, spotrun.cli.audit, spotrun.cli.doctor
import spotrun.db, spotrun.db.migrations, spotrun.daemon.app, spotrun.daemon.service
out_dir = sys.argv[1]


def child(argv, env, out, err, append, barrier, new_session):
    """In the forked child: become `python -m spotrun ARGV` (never returns)."""
    if new_session:
        os.setsid()
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    fds = [os.open(os.devnull, os.O_RDONLY), os.open(out, flags, 0o600)]
    fds.append(fds[1] if err == out else os.open(err, flags, 0o600))   # stderr=STDOUT
    for fd, new in enumerate(fds):
        os.dup2(new, fd)
    for new in set(fds):
        os.close(new)
    sys.stdin = open(os.devnull)
    os.environ.clear()
    os.environ.update(env)
    if barrier is not None:
        os.read(barrier, 1)        # returns once the zygote closes the other end
    os.closerange(3, 65536)        # as subprocess's close_fds
    sys.argv = ["spotrun", *argv]
    runpy.run_module("spotrun", run_name="__main__", alter_sys=True)
    sys.exit(0)                    # as `python -m spotrun`: exits through the interpreter


class Late(Exception):
    pass


def on_alarm(*_):
    raise Late()


def wait(pid, timeout_s):
    """The exit status of pid, or None if it is still running after timeout_s."""
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status)
    except Late:
        return None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)


print("ready", flush=True)
n = 0
while True:
    line = sys.stdin.readline()
    if not line:
        break
    req = json.loads(line)
    if req["op"] == "wait":
        print(json.dumps({"rc": wait(req["pid"], req["timeout_s"])}), flush=True)
        continue
    if req["op"] == "poll":
        pid, status = os.waitpid(req["pid"], os.WNOHANG)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status) if pid else None}),
              flush=True)
        continue
    r, w = os.pipe()
    if req["op"] == "spawn":      # start together in their own sessions; report the pids
        pids = []
        for cmd in req["cmds"]:
            pid = os.fork()
            if pid == 0:
                os.close(w)
                child(cmd["argv"], cmd["env"], cmd["log"], cmd["log"], True, r, True)
            pids.append(pid)
        os.close(r)
        os.close(w)
        print(json.dumps({"pids": pids}), flush=True)
        continue
    kids = []                     # op "run": start together, wait for all, report
    for cmd in req["cmds"]:
        n += 1
        out, err = (os.path.join(out_dir, f"{n}.{ext}") for ext in ("out", "err"))
        pid = os.fork()
        if pid == 0:
            os.close(w)
            child(cmd["argv"], cmd["env"], out, err, False, r, False)
        kids.append((pid, out, err))
    os.close(r)
    os.close(w)
    results = []
    for pid, out, err in kids:
        rc = wait(pid, req["timeout_s"])
        if rc is None:             # late: kill it, and report that it was
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        texts = []
        for path in (out, err):
            with open(path, encoding="utf-8", errors="replace") as f:
                texts.append(f.read())
            os.unlink(path)
        results.append({"rc": rc, "out": texts[0], "err": texts[1]})
    print(json.dumps(results), flush=True)
'''

# Drops the capabilities that let root ignore file modes, so a read-only file is read-only.
UNPRIVILEGED = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner", "--"]


class Zygote:
    """The zygote process: `run_all` for commands that end, `spawn_all` for daemons."""

    def __init__(self, *, unprivileged: bool = False) -> None:
        self.out_dir = tempfile.mkdtemp(prefix="spotrun-zygote-")
        self.spawned: list[Forked] = []
        prefix = UNPRIVILEGED if unprivileged and os.geteuid() == 0 else []
        env = {k: v for k, v in os.environ.items()
               if k not in ("SPOTRUN_HOME", "SPOTRUN_DB_URL")}
        self.proc = subprocess.Popen(prefix + [sys.executable, "-c", ZYGOTE, self.out_dir],
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        assert self._read() == "ready"

    def _read(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the zygote died (exit {self.proc.wait(timeout=30)})"
        return json.loads(line) if line[0] in "[{" else line.strip()

    def _ask(self, req: dict[str, Any]) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def run_all(self, argvs: list[list[str]], envs: list[dict[str, str]],
                timeout_s: float = 120.0) -> list[subprocess.CompletedProcess]:
        """Run the commands together, each in its own child (environment envs[i]) released
        from one barrier; their finished processes in order. One still running after
        timeout_s is killed, and fails the test."""
        cmds = [{"argv": list(a), "env": e} for a, e in zip(argvs, envs, strict=True)]
        results = self._ask({"op": "run", "cmds": cmds, "timeout_s": timeout_s})
        out = []
        for argv, r in zip(argvs, results):
            assert r["rc"] is not None, (argv, f"still running after {timeout_s} s",
                                         r["err"][-2000:])
            out.append(subprocess.CompletedProcess(["spotrun", *argv], r["rc"], r["out"],
                                                   r["err"]))
        return out

    def spawn_all(self, argvs: list[list[str]], envs: list[dict[str, str]],
                  logs: list[Path]) -> list["Forked"]:
        """Start the commands together (one barrier), each `python -m spotrun ARGV` in its own
        session with stdout and stderr appended to logs[i]; they run until signalled."""
        cmds = [{"argv": list(a), "env": e, "log": str(log)}
                for a, e, log in zip(argvs, envs, logs, strict=True)]
        pids = self._ask({"op": "spawn", "cmds": cmds})["pids"]
        forked = [Forked(self, pid, log) for pid, log in zip(pids, logs)]
        self.spawned += forked
        return forked

    def spawn(self, argv: list[str], env: dict[str, str], log_path: Path) -> "Forked":
        """One command as spawn_all starts them."""
        return self.spawn_all([argv], [env], [log_path])[0]

    def wait(self, pid: int, timeout_s: float) -> int | None:
        """A spawned child's exit status once it ends, None if it runs past timeout_s."""
        return self._ask({"op": "wait", "pid": pid, "timeout_s": timeout_s})["rc"]

    def poll(self, pid: int) -> int | None:
        """A spawned child's exit status if it has ended (then reaped), else None."""
        return self._ask({"op": "poll", "pid": pid})["rc"]

    def close(self) -> None:
        """SIGKILL what it spawned that still runs (a test that failed half-way), then end."""
        import shutil
        if self.proc.poll() is None:
            for child in self.spawned:
                child.kill()
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        shutil.rmtree(self.out_dir, ignore_errors=True)

    def __enter__(self) -> "Zygote":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Forked:
    """A spawned child, signalled and reaped as a Popen would be."""

    def __init__(self, zygote: Zygote, pid: int, log_path: Path) -> None:
        self.zygote = zygote
        self.pid = pid
        self.log_path = log_path
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit status once it has ended, else None."""
        if self.returncode is None:
            self.returncode = self.zygote.poll(self.pid)
        return self.returncode

    def kill(self) -> None:
        """SIGKILL (a crash), then reap."""
        if self.returncode is None:
            os.kill(self.pid, signal.SIGKILL)
            self.returncode = self.zygote.wait(self.pid, 10)
            assert self.returncode is not None, f"pid {self.pid} outlived SIGKILL"

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait for the exit status."""
        if self.returncode is None:
            os.kill(self.pid, signal.SIGTERM)
            rc = self.zygote.wait(self.pid, timeout_s)
            if rc is None:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout_s)
            self.returncode = rc
        return self.returncode


def daemon_env(home: Path) -> dict[str, str]:
    """The environment DaemonProc gives `spotrun daemon` on home."""
    env = dict(os.environ, SPOTRUN_HOME=str(home))
    env.pop("SPOTRUN_DB_URL", None)
    return env
