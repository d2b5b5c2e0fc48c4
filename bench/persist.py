"""What persisting a job's files costs per checkpoint, for a 100 MB logs directory.

A logs folder as a long run leaves it: `--files` finished TensorBoard-like event files
(random bytes, so nothing compresses) adding up to `--mb`, plus one metrics CSV and one
live events file that grow between saves by `--grow-kb`. Each save is timed in two parts:
the capture (in the training thread: the job waits for it) and the upload (in the persist
thread, beside training). Candidate and peer side by side in one run:

  * candidate: spotrun.jobfiles (unchanged files listed again, grown logs send their tail);
  * peer: a folder sync that sends every changed file whole (`aws s3 sync`'s rule, which
    an "upload the output dir with each checkpoint" script gets): the same capture code
    with tails turned off, so the difference is the rule, not the implementation.

Then the restore of the whole folder on a fresh instance.

    .venv/bin/python bench/persist.py                 # 100 MB, 10 saves
    .venv/bin/python bench/persist.py --store s3 ...  # not here: the file store on this disk
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from spotrun import jobfiles
from spotrun.checkpoints import put_checkpoint_files
from spotrun.store import open_store


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Sizes and counts."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=100.0, help="size of the logs folder")
    p.add_argument("--files", type=int, default=20, help="finished event files in it")
    p.add_argument("--saves", type=int, default=10, help="checkpoints after the first")
    p.add_argument("--grow-kb", type=float, default=64.0,
                   help="bytes appended to each live log between saves")
    p.add_argument("--dir", default=None, help="scratch folder (default: a temp dir)")
    return p.parse_args(argv)


def make_logs(root: Path, mb: float, files: int) -> tuple[Path, Path]:
    """The logs folder; returns its two live files (CSV, events)."""
    logs = root / "lightning_logs" / "version_0"
    logs.mkdir(parents=True)
    each = int(mb * (1 << 20) / (files + 1))
    for i in range(files):
        (logs / f"events.out.tfevents.{i:04d}").write_bytes(os.urandom(each))
    live = logs / "events.out.tfevents.live"
    live.write_bytes(os.urandom(each))
    csv = logs / "metrics.csv"
    csv.write_text("step,loss\n")
    return csv, live


def grow(csv: Path, live: Path, kb: float, step: int) -> None:
    """What training appends between two saves."""
    n = int(kb * 1024)
    with open(live, "ab") as f:
        f.write(os.urandom(n))
    with open(csv, "a") as f:
        rows = max(1, n // 24)
        f.write("".join(f"{step * 1000 + i},{0.5 / (1 + i):.6f}\n" for i in range(rows)))


def run(label: str, root: Path, store_dir: Path, args: argparse.Namespace,
        tails: bool) -> dict[str, list[float]]:
    """Saves with one rule; per save: MB sent, capture s (the job waits), upload s."""
    csv, live = make_logs(root / "job", args.mb, args.files)
    store = open_store(store_dir.as_uri())
    jf = jobfiles.JobFiles(root / "job", ["lightning_logs"], env={})
    out: dict[str, list[float]] = {"sent_mb": [], "capture_s": [], "upload_s": []}
    limit = jobfiles.MAX_PARTS
    if not tails:
        jobfiles.MAX_PARTS = 0   # every changed file whole: the sync rule
    try:
        for step in range(args.saves + 1):
            if step:
                grow(csv, live, args.grow_kb, step)
            name = f"ckpt-{step:012d}"
            t0 = time.perf_counter()
            cap = jf.capture(checkpoint=name)
            t1 = time.perf_counter()
            sent = sum(p.entry["size"] for p in cap.parts
                       if p.entry["blob"] not in jf.known_blobs)
            entry = jf.upload(store, name, cap)
            cap.discard()
            put_checkpoint_files(store, step, {"weights.bin": b"w"})
            jf.published(cap)
            t2 = time.perf_counter()
            assert entry["size"] > 0
            out["sent_mb"].append(sent / (1 << 20))
            out["capture_s"].append(t1 - t0)
            out["upload_s"].append(t2 - t1)
    finally:
        jobfiles.MAX_PARTS = limit
    fresh = root / "fresh"
    t0 = time.perf_counter()
    count = jobfiles.restore(store, f"ckpt-{args.saves:012d}", fresh)
    out["restore_s"] = [time.perf_counter() - t0]
    assert count == args.files + 2
    same = all((fresh / p.relative_to(root / "job")).read_bytes() == p.read_bytes()
               for p in (root / "job").rglob("*") if p.is_file())
    assert same, f"{label}: the restored folder differs"
    return out


def main(argv: list[str] | None = None) -> int:
    """Run both rules and print the table."""
    args = parse_args(argv)
    base = Path(args.dir or tempfile.mkdtemp(prefix="spotrun-bench-persist-"))
    try:
        cand = run("spotrun", base / "cand", base / "cand-store", args, tails=True)
        peer = run("sync", base / "peer", base / "peer-store", args, tails=False)
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    med = statistics.median
    print(f"logs folder: {args.mb:.0f} MB in {args.files + 2} files; {args.saves} saves, "
          f"{args.grow_kb:.0f} KB appended to each of 2 live logs between saves")
    print(f"{'':34}{'spotrun':>12}{'sync (peer)':>14}{'ratio':>8}")
    rows = [("first save: MB sent", cand["sent_mb"][0], peer["sent_mb"][0]),
            ("first save: capture s (job waits)", cand["capture_s"][0], peer["capture_s"][0]),
            ("first save: upload s", cand["upload_s"][0], peer["upload_s"][0]),
            ("later saves: MB sent (median)", med(cand["sent_mb"][1:]), med(peer["sent_mb"][1:])),
            ("later saves: capture s (median)", med(cand["capture_s"][1:]),
             med(peer["capture_s"][1:])),
            ("later saves: upload s (median)", med(cand["upload_s"][1:]),
             med(peer["upload_s"][1:])),
            ("restore of the folder: s", cand["restore_s"][0], peer["restore_s"][0])]
    for label, c, p in rows:
        ratio = f"{p / c:.1f}x" if c > 0 else "-"
        print(f"{label:34}{c:12.3f}{p:14.3f}{ratio:>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
