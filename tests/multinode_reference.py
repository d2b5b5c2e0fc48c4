"""The final weights of an uninterrupted run of torch_jobs/multinode_gloo.py, made once a session.

The script's weights depend only on its arguments and the world size (each rank's data comes
from (seed, step, rank), no dropout, deterministic algorithms), not on which node a rank runs
on: a world of 2 on one node ends with the same bytes as 2 nodes x 1 process (the same ranks,
the same two-way gloo sum). So one plain torchrun run serves every test that compares a
resumed multi-node run with an uninterrupted one, in every xdist worker: the first to ask
runs it under an flock in the directory all workers share and leaves the hash there; a worker
asking meanwhile waits on the lock, then reads it. A failed run leaves nothing behind, so the
next asker runs it again and sees the failure itself.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

import pytest

from multinode_helpers import JOB_SCRIPT


class UninterruptedRun:
    """`multinode_gloo.py ARGS` on `world` ranks, uninterrupted: started on creation (to overlap
    the test that needs it) unless done or running in another worker; sha() waits for it."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory, args: str,
                 world: int = 2) -> None:
        self.factory, self.args, self.world = tmp_path_factory, args, world
        base = tmp_path_factory.getbasetemp()
        shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
        key = hashlib.sha256(f"{world} {args}".encode()).hexdigest()[:16]
        self.result = shared / f"gloo-ref-{key}.sha"
        self.lock_path = shared / f"gloo-ref-{key}.lock"
        self.lock: IO[str] | None = None
        self.proc: subprocess.Popen[str] | None = None
        self.start(blocking=False)

    def start(self, blocking: bool) -> None:
        """Take the lock (or wait for it) and start the run unless its hash is there."""
        if self.result.exists():
            return
        lock = open(self.lock_path, "a")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:   # another worker runs it: sha() waits for that one
            lock.close()
            return
        if self.result.exists():
            lock.close()
            return
        self.lock, self.out = lock, self.factory.mktemp("gloo-ref")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPOTRUN_", "PET_"))}
        env["OMP_NUM_THREADS"] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             f"--nproc-per-node={self.world}", str(JOB_SCRIPT), *self.args.split(),
             "--out", str(self.out)],
            cwd=self.out, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def sha(self, timeout_s: float = 300.0) -> str:
        """The final parameters' SHA256 of the run."""
        if self.proc is None and not self.result.exists():
            self.start(blocking=True)   # after another worker's run, which may have failed
        if self.proc is None:
            return self.result.read_text().strip()
        try:
            out, _ = self.proc.communicate(timeout=timeout_s)
            assert self.proc.returncode == 0, out[-3000:]
            sha = Path(self.out, "final-params.sha256").read_text().strip()
            tmp = self.result.with_suffix(".tmp")
            tmp.write_text(sha + "\n")
            os.replace(tmp, self.result)
            return sha
        finally:
            self.close()

    def close(self) -> None:
        """Stop a run nobody waited for (torchrun and its workers: a session of their own)."""
        if self.proc is not None:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.communicate()
            self.proc = None
        if self.lock is not None:
            self.lock.close()
            self.lock = None
