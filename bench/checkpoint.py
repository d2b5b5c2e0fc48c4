"""Checkpoint cost on CPU: no checkpoint vs torch.save vs DCP async_save vs spotrun's Checkpointer.

One run, one ~100M-parameter MLP with AdamW (1.2 GB of state), one disk:
  * per-step time with no checkpointing (the baseline),
  * per checkpoint: the blocking stall, and the total added wall time (stall +
    the slowdown of the steps that run while the write is in flight + any wait),
  * the emergency save: SIGUSR1 to a verified checkpoint in the store,
  * the same during a long evaluation (no step() call: the watchdog saves),
  * restore throughput against the disk's own write/read throughput,
  * spotrun's extra host memory (one buffer, allocated once).

    .venv/bin/python bench/checkpoint.py                  # ~100M params, a few minutes
    .venv/bin/python bench/checkpoint.py --params-m 5     # quick look
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from spotrun.checkpoints import checkpoint_name, verify
from spotrun.store.file import FileStore
from spotrun.torch import Checkpointer, RuntimeOptions
from spotrun.torch.storage import READERS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Sizes and counts; defaults fit a 2-core machine in a few minutes."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--params-m", type=float, default=100.0, help="model size, millions of params")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", help="cpu, or cuda (pinned snapshot buffer)")
    p.add_argument("--baseline-steps", type=int, default=6)
    p.add_argument("--checkpoints", type=int, default=2, help="checkpoints per method")
    p.add_argument("--max-in-flight-s", type=float, default=120.0,
                   help="keep training at most this long while a write is in flight")
    p.add_argument("--dir", default=None, help="scratch directory on the disk to measure")
    p.add_argument("--skip-dcp", action="store_true")
    p.add_argument("--json", dest="json_out", default=None, help="also write results here")
    return p.parse_args(argv)


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _drop_cache(root: Path) -> None:
    """Evict root's (clean) files from the page cache so reads come from the disk."""
    for p in root.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass   # some sandboxes lack fadvise: reads may then come from the cache
            finally:
                os.close(fd)


def _tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def disk_throughput(scratch: Path, nbytes: int) -> tuple[float, float]:
    """Write nbytes with fsync, evict, read back: (write, read) in bytes/s."""
    path = scratch / "disk-probe.bin"
    block = os.urandom(8 << 20)
    t = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            f.write(block[:min(left, len(block))])
            left -= len(block)
        f.flush()
        os.fsync(f.fileno())
    write_s = time.perf_counter() - t
    _drop_cache(scratch)
    t = time.perf_counter()
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass
    read_s = time.perf_counter() - t
    path.unlink()
    return nbytes / write_s, nbytes / read_s


class Workload:
    """A deep MLP and AdamW: one step = forward, backward, optimizer step."""

    def __init__(self, args: argparse.Namespace, seed: int = 0) -> None:
        width = int((args.params_m * 1e6 / args.layers) ** 0.5)
        torch.manual_seed(seed)
        self.device = torch.device(args.device)
        self.model = nn.Sequential(*[nn.Linear(width, width) for _ in range(args.layers)]).to(self.device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.x = torch.randn(args.batch, width, device=self.device)
        self.params = sum(p.numel() for p in self.model.parameters())

    def step(self) -> float:
        """One training step; returns its wall time."""
        t = time.perf_counter()
        loss = self.model(self.x).pow(2).mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t

    def state_bytes(self) -> int:
        """Model parameters plus optimizer state, in bytes."""
        n = sum(t.numel() * t.element_size() for t in self.model.state_dict().values())
        for st in self.opt.state.values():
            n += sum(v.numel() * v.element_size() for v in st.values() if torch.is_tensor(v))
        return n


def run_method(w: Workload, base_s: float, args: argparse.Namespace,
               start: Callable[[int], Any], busy: Callable[[Any], bool],
               finish: Callable[[Any], None],
               blocked: Callable[[Any, float], float] | None = None) -> dict[str, float]:
    """Checkpoint args.checkpoints times; per checkpoint: stall and total added wall time.

    The baseline step time is re-measured just before each method, so drift from
    other load on the machine does not land on one method.
    """
    base_s = statistics.median([w.step() for _ in range(3)] + [base_s])
    stalls, added = [], []
    for k in range(args.checkpoints):
        t = time.perf_counter()
        handle = start(k)
        stall = time.perf_counter() - t
        extra = 0.0
        until = time.perf_counter() + args.max_in_flight_s
        while busy(handle) and time.perf_counter() < until:
            extra += w.step() - base_s
        t = time.perf_counter()
        finish(handle)
        extra += time.perf_counter() - t
        if blocked is not None:       # the library's own account of how long training waited
            stall = blocked(handle, stall)
        stalls.append(stall)
        added.append(stall + extra)
        w.step()                     # one clean step between checkpoints
    return {"stall_s": statistics.mean(stalls), "added_s": statistics.mean(added),
            "stalls_s": stalls, "added_all_s": added, "base_step_s": base_s}


def bench_torch_save(w: Workload, base_s: float, args: argparse.Namespace, scratch: Path) -> dict:
    """Synchronous torch.save (+ fsync): all of it is stall."""
    def start(k: int) -> None:
        path = scratch / f"torch-save-{k}.pt"
        torch.save({"model": w.model.state_dict(), "optim": w.opt.state_dict()}, path)
        _fsync_file(path)
    return run_method(w, base_s, args, start, lambda h: False, lambda h: None)


def _init_gloo() -> None:
    import torch.distributed as tdist
    if tdist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def bench_dcp(w: Workload, base_s: float, args: argparse.Namespace, scratch: Path) -> dict:
    """torch.distributed.checkpoint.async_save (single-process gloo group)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    _init_gloo()

    def start(k: int) -> Any:
        msd, osd = get_state_dict(w.model, w.opt)
        return dcp.async_save({"model": msd, "optim": osd}, checkpoint_id=str(scratch / f"dcp-{k}"))

    def finish(fut: Any) -> None:
        fut.result()
        for d in scratch.glob("dcp-*"):
            for p in d.rglob("*"):
                if p.is_file():
                    _fsync_file(p)   # torch.save and spotrun are measured with fsync too
    return run_method(w, base_s, args, start, lambda f: not f.done(), finish)


def bench_spotrun(w: Workload, base_s: float, args: argparse.Namespace, store_dir: Path
                  ) -> tuple[dict, Checkpointer]:
    """spotrun's Checkpointer: snapshot into the reused buffer, persist in the background."""
    ck = Checkpointer(model=w.model, optimizer=w.opt, store=FileStore(store_dir),
                      runtime=RuntimeOptions(env={}), interval_s=1e9, keep=2)
    t = time.perf_counter()
    ck.step(0)                               # sizes the buffer in the background
    while ck.buffer._warming is not None and ck.buffer._warming.is_alive():
        w.step()
    warm_s = time.perf_counter() - t
    steps = iter(range(1, 10**9))

    def start(k: int) -> int:
        s = next(steps)
        assert ck.save(s)
        return s

    def busy(s: int) -> bool:
        ck.step(s)
        return ck.persister.busy

    # checkpoint_save_s = the snapshot call plus any wait of optimizer.step for the overlapped copy.
    res = run_method(w, base_s, args, start, busy, lambda s: ck.wait(),
                     blocked=lambda s, call_s: max(call_s, ck.checkpoint_save_s or 0.0))
    res["buffer_warmup_s"] = warm_s
    res["_next_step"] = next(steps)
    return res, ck


def bench_emergency(w: Workload, ck: Checkpointer, step: int, store_dir: Path) -> dict:
    """A notice arrives while a periodic persist is in flight: time to a verified checkpoint."""
    ck.save(step)                            # periodic save, persisting in the background
    w.step()
    t_sig = time.perf_counter()
    os.kill(os.getpid(), signal.SIGUSR1)
    w.step()                                 # the notice lands mid-step; handled at the boundary
    while not ck.guard.pending:              # taken by the watchdog thread: asynchronous
        time.sleep(0.001)
    ck.step(step + 2)
    t_manifest = time.perf_counter()
    verify(FileStore(store_dir), checkpoint_name(step + 2), deep=True)
    t_verified = time.perf_counter()
    return {"notice_to_manifest_s": t_manifest - t_sig, "notice_to_verified_s": t_verified - t_sig,
            "library_reported_s": ck.emergency_save_s, "step": step + 2}


def bench_emergency_in_eval(w: Workload, step: int, store_dir: Path, max_s: float) -> dict:
    """A notice during a long evaluation (no step() call): the watchdog saves the last finished step."""
    ck = Checkpointer(model=w.model, optimizer=w.opt, store=FileStore(store_dir),
                      runtime=RuntimeOptions(env={}), interval_s=1e9, keep=2)
    try:
        w.step()
        ck.step(step)                          # sizes the buffer in the background
        while ck.buffer._warming is not None and ck.buffer._warming.is_alive():
            w.step()
            ck.step(step := step + 1)
        w.step()
        ck.step(step := step + 1)
        w.model.eval()
        t_sig = time.perf_counter()
        os.kill(os.getpid(), signal.SIGUSR1)
        evals = 0
        with torch.no_grad():
            while ck.emergency_checkpoint_step is None and time.perf_counter() - t_sig < max_s:
                w.model(w.x)                   # evaluation batches, never reaching step()
                evals += 1
        t_manifest = time.perf_counter()
        w.model.train()
        return {"notice_to_manifest_s": t_manifest - t_sig, "step": ck.emergency_checkpoint_step,
                "saved_step_is_last_finished": ck.emergency_checkpoint_step == step,
                "from_watchdog": ck.guard.background_saves == 1, "eval_batches_meanwhile": evals}
    finally:
        ck.close()


def bench_restore(args: argparse.Namespace, store_dir: Path, state_bytes: int, w: Workload) -> dict:
    """A fresh process's view: new model and optimizer, page cache evicted, restore."""
    w2 = Workload(args, seed=1)
    w2.step()                                # optimizer state exists, as in a real resume
    _drop_cache(store_dir)
    ck = Checkpointer(model=w2.model, optimizer=w2.opt, store=FileStore(store_dir),
                      runtime=RuntimeOptions(env={}, install_signal=False))
    t = time.perf_counter()
    step = ck.restore()
    dt = time.perf_counter() - t
    exact = all(torch.equal(a, b) for a, b in zip(w.model.state_dict().values(),
                                                   w2.model.state_dict().values()))
    return {"restore_s": dt, "restore_bytes_per_s": state_bytes / dt, "step": step, "exact": exact}


def main(argv: list[str] | None = None) -> int:
    """Run every measurement and print the comparison."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="spotrun-bench-"))
    scratch.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"threads": args.threads, "cpus": os.cpu_count(), "torch": torch.__version__,
                           "device": args.device}
    try:
        w = Workload(args)
        w.step()
        w.step()
        state = w.state_bytes()
        out.update(params=w.params, state_bytes=state)
        print(f"model {w.params / 1e6:.1f}M params, state {state / 1e9:.2f} GB, scratch {scratch}",
              flush=True)
        wbps, rbps = disk_throughput(scratch, state)
        out["disk"] = {"write_bytes_per_s": wbps, "read_bytes_per_s": rbps}
        print(f"disk: write {wbps / 1e6:.0f} MB/s, read {rbps / 1e6:.0f} MB/s", flush=True)
        base = statistics.median([w.step() for _ in range(args.baseline_steps)])
        out["baseline_step_s"] = base
        print(f"baseline step {base:.3f} s", flush=True)

        out["torch_save"] = bench_torch_save(w, base, args, scratch)
        print(f"torch.save: {out['torch_save']['stall_s']:.3f} s stall", flush=True)
        for p in scratch.glob("torch-save-*"):
            p.unlink()
        if not args.skip_dcp:
            out["dcp_async_save"] = bench_dcp(w, base, args, scratch)
            print(f"dcp.async_save: {out['dcp_async_save']['stall_s']:.3f} s stall, "
                  f"{out['dcp_async_save']['added_s']:.3f} s added", flush=True)
            for d in scratch.glob("dcp-*"):
                shutil.rmtree(d)
        store_dir = scratch / "spotrun"
        res, ck = bench_spotrun(w, base, args, store_dir)
        nxt = res.pop("_next_step")
        res["buffer_bytes"] = ck.buffer.capacity
        res["buffer_allocations"] = ck.buffer.allocations
        out["spotrun"] = res
        print(f"spotrun: {res['stall_s']:.3f} s stall, {res['added_s']:.3f} s added", flush=True)
        out["emergency"] = bench_emergency(w, ck, nxt, store_dir)
        out["spotrun"]["buffer_allocations_after_emergency"] = ck.buffer.allocations
        ck.close()
        print(f"emergency: notice -> verified checkpoint {out['emergency']['notice_to_verified_s']:.2f} s",
              flush=True)
        out["restore"] = bench_restore(args, store_dir, state, w)
        out["restore"]["readers"] = READERS
        out["restore"]["vs_disk_read"] = out["restore"]["restore_bytes_per_s"] / rbps
        out["restore"]["vs_disk_write"] = out["restore"]["restore_bytes_per_s"] / wbps
        out["emergency_in_eval"] = bench_emergency_in_eval(w, nxt + 10, scratch / "eval",
                                                           args.max_in_flight_s)
        print(f"emergency during evaluation: notice -> manifest "
              f"{out['emergency_in_eval']['notice_to_manifest_s']:.2f} s", flush=True)
    finally:
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    report(out)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=2))
    return 0


def report(out: dict[str, Any]) -> None:
    """Human-readable table and the issue's acceptance checks."""
    base = out["baseline_step_s"]
    print("\nmethod            stall/ckpt   stall/step   added/ckpt   added/step")
    for key, label in (("torch_save", "torch.save (sync)"), ("dcp_async_save", "dcp.async_save"),
                       ("spotrun", "spotrun")):
        r = out.get(key)
        if r:
            print(f"{label:<17} {r['stall_s']:9.3f} s {r['stall_s'] / base:10.2f}x "
                  f"{r['added_s']:10.3f} s {r['added_s'] / base:10.2f}x")
    sp, ts, dc = out["spotrun"], out["torch_save"], out.get("dcp_async_save")
    checks = {"restored state is bitwise identical": out["restore"]["exact"],
              "stall <= 5% of torch.save": sp["stall_s"] <= 0.05 * ts["stall_s"],
              "one buffer, allocated once": sp["buffer_allocations_after_emergency"] == 1
              and sp["buffer_bytes"] <= 1.01 * out["state_bytes"]}
    if dc:
        checks["stall <= async_save's"] = sp["stall_s"] <= dc["stall_s"]
        checks["added <= async_save's"] = sp["added_s"] <= dc["added_s"]
    r = out["restore"]
    print(f"\nrestore {r['restore_bytes_per_s'] / 1e6:.0f} MB/s = {r['vs_disk_read']:.2f}x disk read, "
          f"{r['vs_disk_write']:.2f}x disk write ({r['readers']} reader threads)")
    e = out["emergency"]
    print(f"emergency save: notice -> manifest {e['notice_to_manifest_s']:.2f} s, "
          f"-> verified {e['notice_to_verified_s']:.2f} s")
    ev = out["emergency_in_eval"]
    print(f"emergency during evaluation: notice -> manifest {ev['notice_to_manifest_s']:.2f} s, "
          f"step {ev['step']} (the last finished), from the watchdog: {ev['from_watchdog']}")
    checks["notice during evaluation saved the last finished step"] = \
        bool(ev["saved_step_is_last_finished"] and ev["from_watchdog"])
    checks["restore >= 0.8x disk read"] = r["vs_disk_read"] >= 0.8
    for k, v in checks.items():
        print(f"  [{'ok' if v else 'FAIL'}] {k}")
    out["checks"] = checks


if __name__ == "__main__":
    sys.exit(main())
