"""The uninterrupted run of configs/demo/train.py that e2e tests compare weights with, made once.

The same arguments always give the same final weights, so one run per argument string serves
every test of a session, and every xdist worker of it: the first worker to ask runs it (under
an flock on a file in the directory all workers share) and leaves the hash there; a worker
asking meanwhile waits on the lock, then reads it. A run that failed leaves nothing behind,
so the next asker runs it again and sees the failure itself.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "configs" / "demo" / "train.py"


def final_sha(text: str) -> str:
    """The last `final-params-sha256:` value in a run's output."""
    lines = [ln for ln in text.splitlines() if ln.startswith("final-params-sha256: ")]
    assert lines, text[-2000:]
    return lines[-1].split(": ", 1)[1].strip()


class ReferenceRuns:
    """Uninterrupted demo runs keyed by their argument string, shared through `shared_dir`."""

    def __init__(self, shared_dir: Path, scratch: Path) -> None:
        self.shared_dir = shared_dir
        self.scratch = scratch
        self._mine: dict[str, tuple[IO[str], subprocess.Popen]] = {}
        self._started = 0   # runs this worker started: each gets a folder of its own

    def _paths(self, args: str) -> tuple[Path, Path]:
        key = hashlib.sha256(args.encode()).hexdigest()[:16]
        return (self.shared_dir / f"demo-ref-{key}.lock", self.shared_dir / f"demo-ref-{key}.sha")

    def start(self, args: str) -> None:
        """Start the run now (to overlap the test) unless it is done or another worker runs it."""
        lock_path, result = self._paths(args)
        if args in self._mine or result.exists():
            return
        lock = open(lock_path, "a")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:   # another worker runs it: sha() waits for that one
            lock.close()
            return
        if result.exists():
            lock.close()
            return
        # Not len(self._mine): a finished run leaves it, and the next run would reuse its folder.
        cwd = self.scratch / f"run-{self._started}"
        self._started += 1
        cwd.mkdir(parents=True)
        proc = subprocess.Popen(
            [sys.executable, str(DEMO), *args.split(), "--checkpoint-uri",
             (cwd / "ref-ckpt").as_uri()],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
            env={k: v for k, v in os.environ.items() if not k.startswith("SPOTRUN_")})
        self._mine[args] = (lock, proc)

    def sha(self, args: str, timeout_s: float = 300.0) -> str:
        """The final parameters' SHA256 of the uninterrupted run with these arguments."""
        lock_path, result = self._paths(args)
        if args not in self._mine:
            with open(lock_path, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)   # a run in another worker ends first
                if result.exists():
                    return result.read_text().strip()
            self.start(args)
            if args not in self._mine:
                return self.sha(args, timeout_s)
        lock, proc = self._mine.pop(args)
        try:
            out, err = proc.communicate(timeout=timeout_s)
            assert proc.returncode == 0, err[-2000:]
            sha = final_sha(out)
            tmp = result.with_suffix(".tmp")
            tmp.write_text(sha + "\n")
            os.replace(tmp, result)
            return sha
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
            lock.close()

    def close(self) -> None:
        """Stop runs nobody asked for."""
        for args in list(self._mine):
            lock, proc = self._mine.pop(args)
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
            lock.close()
