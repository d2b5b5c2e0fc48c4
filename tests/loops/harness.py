"""Run a loop script as the agent runs a job, interrupt it at chosen points, compare bitwise.

One case: attempts of `script` in one job directory and one FileStore checkpoint store.
Each attempt starts as the agent starts one (spotrun/agent/setup.py, child.py): the job
directory emptied, the resume checkpoint's persisted files put back, the agent's
environment (`child_env`), the command spawned in its own process group with SIGUSR1
ignored until the library handles it. An interrupted attempt fires at its point
(tests/loops/points.py): with a notice, the harness waits for the emergency checkpoint
in the progress file and then SIGKILLs the group (the reclaim); without, the script
SIGKILLs itself. The last attempt runs to the end. The result is compared with an
uninterrupted reference run of the same script (one per script and sizes, per process):
every `final-sha256` part the script prints, and every file left in the job directory,
byte for byte (a torch file pickled in another order passes if every tensor and value is
equal; `NOT_COMPARED` names a framework's own folders, which its script reports through
digests instead).
"""

from __future__ import annotations

import fnmatch
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import torch

from polling import wait_for
from spotrun import jobfiles
from spotrun.agent.child import child_env, signal_group, spawn
from spotrun.agent.config import AgentConfig
from spotrun.agent.setup import AgentPaths, empty_job_dir
from spotrun.checkpoints import resume_point
from spotrun.store.file import FileStore

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
POINTS = ("train", "validation", "data", "log", "best", "save")
ATTEMPT_TIMEOUT_S = 180.0      # one attempt of a tiny script on a loaded 2-core machine
EMERGENCY_TIMEOUT_S = 60.0     # notice -> emergency checkpoint in the progress file
# Files a script's framework documents as its own, compared through the script's digests
# instead of byte for byte (docs/integrations.md: the callback's local copies are not persisted).
NOT_COMPARED = {"lightning_loop.py": ("spotrun-checkpoints/*",),
                "hf_trainer.py": ("out/*",)}   # Trainer: rotation and runtimes differ (documented)
FINAL = "final-sha256 "
SAME_CONTENTS = "bytes differ, contents equal"
RESUMED = "resumed-at: "


@dataclass(frozen=True)
class Interruption:
    """Where one attempt ends: `phase` at `frac` of its remaining arrivals, by notice or kill."""

    phase: str
    frac: float
    mode: str = "notice"   # "notice": notice, emergency checkpoint, SIGKILL; "kill": SIGKILL

    def __str__(self) -> str:
        return f"{self.mode}@{self.phase}:{self.frac:.2f}"


@dataclass
class Attempt:
    """What one attempt did."""

    resumed_at: int | None = None          # the step the script says it resumed at
    resume_point: int | None = None        # the step of the checkpoint the agent chose
    point: str = ""                        # LOOPS_POINT it ran with
    fired: dict | None = None              # what points.py wrote when it fired
    emergency_step: int | None = None      # from the progress file
    progress_step: int | None = None       # the progress file's step when killed
    exit_code: int | None = None
    output: str = ""
    wall_s: float = 0.0                    # from the spawn to the end of the process


@dataclass
class Final:
    """A finished run: the script's digests and the job directory's files."""

    digests: dict[str, str]
    files: dict[str, bytes]
    trace: list[tuple[int, str, int | None]] = field(default_factory=list)   # reference only


@dataclass
class CaseResult:
    """A case's attempts, its end state, and every way it differs from the reference."""

    attempts: list[Attempt]
    final: Final | None
    problems: list[str]

    @property
    def fired(self) -> int:
        """Interruptions that really happened (a point beyond the run's end never fires)."""
        return sum(1 for a in self.attempts if a.fired)


def _digests(output: str) -> dict[str, str]:
    out = {}
    for line in output.splitlines():
        if line.startswith(FINAL):
            part, _, hexdigest = line[len(FINAL):].partition(": ")
            out[part] = hexdigest.strip()
    return out


def _resumed_at(output: str) -> int | None:
    lines = [ln for ln in output.splitlines() if ln.startswith(RESUMED)]
    return int(lines[0][len(RESUMED):]) if lines else None


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}


def _files(job_dir: Path) -> dict[str, bytes]:
    return {p.relative_to(job_dir).as_posix(): p.read_bytes()
            for p in sorted(job_dir.rglob("*")) if p.is_file()}


class Job:
    """One job: a job directory, a checkpoint store and the agent's state folder."""

    def __init__(self, root: Path, script: str, env: Mapping[str, str] | None = None,
                 job_dir: Path | None = None) -> None:
        self.root = root.resolve()
        self.script = HERE / script
        self.extra_env = dict(env or {})
        # Files may hold the job directory's path (a framework's checkpoint does): the
        # reference and the cases share one path, as the attempts of a job do.
        self.job_dir = (job_dir or self.root / "job").resolve()
        self.state = self.root / "agent"
        self.store_dir = self.root / "store"
        self.store = FileStore(self.store_dir)
        self.attempts: list[Attempt] = []
        self.job_dir.mkdir(parents=True, exist_ok=True)
        self.state.mkdir(parents=True, exist_ok=True)

    def _prepare(self) -> str | None:
        """What the agent does before the command: empty job dir, resume point, its files."""
        empty_job_dir(AgentPaths(self.root, job=self.job_dir))
        manifest = resume_point(self.store)
        if manifest is None:
            return None
        jobfiles.restore(self.store, manifest.name, self.job_dir)
        return manifest.name

    def _start(self, resume: str | None, extra: Mapping[str, str]) -> subprocess.Popen:
        number = len(self.attempts) + 1
        command = f"{sys.executable} {self.script}"
        config = AgentConfig(job_id="loops", attempt=number, store_uri=self.store_dir.as_uri(),
                             checkpoint_uri=self.store_dir.as_uri(), command=command)
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("SPOTRUN_", "LOOPS_"))}
        progress = self.state / "progress.json"
        progress.unlink(missing_ok=True)   # a new instance's disk has none
        env = child_env(config, base=base, secrets={}, resume_checkpoint=resume,
                        progress_file=progress, job_dir=self.job_dir)
        env.update(self.extra_env)
        env.update(extra)
        env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT), env.get("PYTHONPATH", "")])
        env.setdefault("PYTHONHASHSEED", "0")
        return spawn(command, cwd=self.job_dir, env=env,
                     log_path=self.state / f"output-{number}.log")

    def _finish(self, proc: subprocess.Popen, att: Attempt) -> None:
        try:
            proc.wait(timeout=ATTEMPT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            signal_group(proc, signal.SIGKILL)
            proc.wait()
        att.exit_code = proc.returncode
        log_path = self.state / f"output-{len(self.attempts) + 1}.log"
        att.output = log_path.read_text(errors="replace")
        att.resumed_at = _resumed_at(att.output)

    def run(self, point: str = "", mode: str = "notice", trace: Path | None = None) -> Attempt:
        """One attempt; with a point, interrupted there (a point never reached: runs to the end)."""
        resume = self._prepare()
        att = Attempt(resume_point=int(resume.split("-")[1]) if resume else 0, point=point)
        fired = self.state / "fired.json"
        fired.unlink(missing_ok=True)
        extra = {"LOOPS_POINT": point, "LOOPS_MODE": mode, "LOOPS_FIRED": str(fired)}
        if trace is not None:
            extra["LOOPS_TRACE"] = str(trace)
        t0 = time.monotonic()
        proc = self._start(resume, extra)
        progress = self.state / "progress.json"
        try:
            if point and mode == "notice":
                wait_for(lambda: fired.exists() or proc.poll() is not None,
                         timeout_s=ATTEMPT_TIMEOUT_S, what=f"point {point}")
                if fired.exists():
                    wait_for(lambda: _read_json(progress).get("emergency_checkpoint_step")
                             is not None or proc.poll() is not None,
                             timeout_s=EMERGENCY_TIMEOUT_S, what="emergency checkpoint")
                    signal_group(proc, signal.SIGKILL)   # the reclaim
                    fields = _read_json(progress)
                    att.emergency_step = fields.get("emergency_checkpoint_step")
                    att.progress_step = fields.get("step")
        except AssertionError:
            signal_group(proc, signal.SIGKILL)
            fields = _read_json(progress)
            att.progress_step = fields.get("step")
        finally:
            self._finish(proc, att)
            att.wall_s = time.monotonic() - t0
        att.fired = _read_json(fired) or None
        self.attempts.append(att)
        return att

    def final(self) -> Final:
        """The end state of the last attempt (it ran to the end)."""
        return Final(_digests(self.attempts[-1].output), _files(self.job_dir))


def _trace(path: Path) -> list[tuple[int, str, int | None]]:
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        pid, phase, step = line.split()
        rows.append((int(pid), phase, None if step == "-" else int(step)))
    return rows


_REFERENCES: dict[tuple[str, tuple[tuple[str, str], ...]], Final] = {}
_FAILED: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}   # a reference that failed, once


def reference(script: str, scratch: Path, env: Mapping[str, str] | None = None) -> Final:
    """The uninterrupted run of script with these sizes (run once per process), with its trace."""
    key = (script, tuple(sorted((env or {}).items())))
    if key in _FAILED:
        raise AssertionError(_FAILED[key])
    if key not in _REFERENCES:
        job = Job(scratch / f"ref-{Path(script).stem}-{len(_REFERENCES)}", script, env,
                  scratch / "job")
        trace = job.root / "trace.txt"
        att = job.run(trace=trace)
        if att.exit_code != 0 or not _digests(att.output):
            _FAILED[key] = f"reference run of {script} failed (exit {att.exit_code}):\n" \
                f"{att.output[-3000:]}"
            raise AssertionError(_FAILED[key])
        final = job.final()
        final.trace = _trace(trace)
        _REFERENCES[key] = final
    return _REFERENCES[key]


def arrival(ref: Final, intr: Interruption, start_step: int) -> int:
    """The k of LOOPS_POINT for an attempt resumed at start_step: frac of the arrivals left.

    Arrivals the reference made at step >= start_step, in its main process; in worker
    processes (no step known) frac of the fewest arrivals one worker process made.
    """
    rows = [r for r in ref.trace if r[1] == intr.phase]
    stepped = [r for r in rows if r[2] is not None and r[2] >= start_step]
    if stepped:
        return 1 + int(intr.frac * len(stepped))
    per_pid = Counter(r[0] for r in rows if r[2] is None)
    if per_pid:
        return 1 + int(intr.frac * min(per_pid.values()))
    return 0   # no such phase left: the attempt runs to the end


def run_case(script: str, interruptions: list[Interruption], root: Path, scratch: Path,
             env: Mapping[str, str] | None = None) -> CaseResult:
    """Interrupt the script once per interruption, run it to the end, compare with the reference."""
    try:
        ref = reference(script, scratch, env)
    except AssertionError as exc:
        return CaseResult([], None, [str(exc)])
    job = Job(root, script, env, scratch / "job")
    problems: list[str] = []
    for intr in interruptions:
        start = resume_point(job.store)
        k = arrival(ref, intr, start.step if start else 0)
        att = job.run(f"{intr.phase}:{k}" if k else "", intr.mode)
        problems += check_attempt(att, intr, len(job.attempts))
        if att.exit_code == 0 or problems:
            break   # ran to the end (point not reached), or already wrong
    if not job.attempts or job.attempts[-1].exit_code != 0:
        att = job.run()
        if att.exit_code != 0:
            problems.append(f"final attempt failed (exit {att.exit_code}):\n{att.output[-3000:]}")
    previous = job.attempts[:-1]
    for before, after in zip(previous, job.attempts[1:]):
        if before.emergency_step is not None and (after.resumed_at or 0) < before.emergency_step:
            problems.append(f"resumed at {after.resumed_at}, before the emergency checkpoint "
                            f"{before.emergency_step}: finished steps lost")
    for att in job.attempts[1:]:
        if att.resumed_at != att.resume_point:
            problems.append(f"the script resumed at {att.resumed_at}, the agent's resume point "
                            f"is {att.resume_point}")
    final = job.final() if job.attempts[-1].exit_code == 0 else None
    if final is not None and not problems:
        problems += compare(ref, final, NOT_COMPARED.get(script, ()))
    return CaseResult(job.attempts, final, problems)


def check_attempt(att: Attempt, intr: Interruption, number: int) -> list[str]:
    """An interrupted attempt's own promises: killed where asked, the notice honoured at once."""
    where = f"attempt {number} ({intr}, point {att.point or '-'})"
    if att.exit_code == 0:
        return []   # the point was past the end of this attempt's run
    if not att.fired:
        return [f"{where}: exit {att.exit_code} before its point:\n{att.output[-3000:]}"]
    if intr.mode == "kill":
        return [] if att.exit_code == -signal.SIGKILL else \
            [f"{where}: exit {att.exit_code}, not the kill:\n{att.output[-3000:]}"]
    if att.emergency_step is None:
        return [f"{where}: no emergency checkpoint (progress step {att.progress_step}, "
                f"fired at step {att.fired.get('step')}):\n{att.output[-2000:]}"]
    fired_step = att.fired.get("step")
    if fired_step is not None and att.emergency_step < fired_step:
        return [f"{where}: emergency checkpoint at step {att.emergency_step}, but step "
                f"{fired_step} had finished when the notice came"]
    return []


def compare(ref: Final, got: Final, not_compared: tuple[str, ...] = ()) -> list[str]:
    """Every difference between two end states, each naming the part, file or first row."""
    problems = []
    for part in sorted(ref.digests.keys() | got.digests.keys()):
        if ref.digests.get(part) != got.digests.get(part):
            problems.append(f"final {part} differs")
    for name in sorted(ref.files.keys() | got.files.keys()):
        a, b = ref.files.get(name), got.files.get(name)
        if a == b or any(fnmatch.fnmatch(name, pattern) for pattern in not_compared):
            continue
        if a is None or b is None:
            problems.append(f"file {name}: only in the {'resumed' if a is None else 'reference'} run")
        elif name.endswith((".csv", ".txt", ".jsonl")):
            problems.append(f"file {name}: {_first_row_diff(a, b)}")
        else:
            diff = _tensor_diff(a, b)
            if diff != SAME_CONTENTS:   # a torch file pickled in another order holds the same
                problems.append(f"file {name}: {diff}")
    return problems


def _first_row_diff(a: bytes, b: bytes) -> str:
    ra, rb = a.decode().splitlines(), b.decode().splitlines()
    for i, (x, y) in enumerate(zip(ra, rb)):
        if x != y:
            return f"row {i + 1} differs: reference {x!r}, resumed {y!r}"
    return f"{len(ra)} rows in the reference, {len(rb)} resumed (first extra: " \
           f"{(ra if len(ra) > len(rb) else rb)[min(len(ra), len(rb))]!r})"


def _tensor_diff(a: bytes, b: bytes) -> str:
    try:
        ta = torch.load(io.BytesIO(a), weights_only=True)
        tb = torch.load(io.BytesIO(b), weights_only=True)
    except Exception as exc:   # not a torch file, or a truncated one: its bytes differ
        return f"bytes differ ({len(a)} vs {len(b)}; {type(exc).__name__})"
    diffs = []

    def walk(x, y, path):
        if isinstance(x, dict) and isinstance(y, dict):
            for k in sorted(x.keys() | y.keys(), key=str):
                walk(x.get(k), y.get(k), f"{path}.{k}")
        elif isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)) and len(x) == len(y):
            for i, (u, v) in enumerate(zip(x, y)):
                walk(u, v, f"{path}[{i}]")
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
                    and torch.equal(x, y)):
                diffs.append(path)
        elif x != y:
            diffs.append(f"{path} ({x!r} vs {y!r})")

    walk(ta, tb, "")
    return "differs at " + ", ".join(d[-240:] for d in diffs[:3]) if diffs else SAME_CONTENTS


def clear(root: Path) -> None:
    """Remove a case's folder (cases leave stores and logs behind)."""
    shutil.rmtree(root, ignore_errors=True)
