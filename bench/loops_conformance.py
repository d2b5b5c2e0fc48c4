"""The loop conformance sweep: every script x every interruption point x notice / kill.

Runs each loop script of tests/loops/ (with its variants) interrupted once at each point
of tests/loops/harness.py, by notice and by SIGKILL, resumed to the end and compared
bitwise with an uninterrupted run; then the negative controls (a stock DataLoader in
place of ResumableDataLoader), which must fail. Prints one row per script and variant:
cases passed per point and mode ("-": the script has no such point), and each failure's
first problem.

    .venv/bin/python bench/loops_conformance.py [--scripts cifar_resnet.py ...]
        [--fracs 0.3 0.7] [--json out.json] [--keep]
    .venv/bin/python bench/loops_conformance.py --search 20 --seed 1   # hypothesis draws

The suite (tests/test_loops_conformance.py) draws one case per script with a fixed seed;
`--search` is the larger budget of the same strategy (tests/loops/search.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests")]

from loops.harness import POINTS, Interruption, run_case  # noqa: E402

# (script, variant label, environment): the shapes the sweep covers.
SHAPES = [
    ("cifar_resnet.py", "", {}),
    ("cifar_resnet.py", "val in train mode", {"CIFAR_VAL_TRAIN_MODE": "1"}),
    ("lm_manual.py", "LSTM", {}),
    ("lm_manual.py", "GRU", {"LM_RNN": "GRU"}),
    ("gan.py", "", {}),
    ("hf_no_trainer.py", "", {}),
    ("lightning_loop.py", "", {}),
    ("hf_trainer.py", "", {}),
]
# Must fail: a stock DataLoader cannot resume mid-epoch (the epoch restarts). Both points
# resume inside an epoch (a resume at an epoch's end is exact even with a stock loader).
CONTROLS = [
    ("cifar_resnet.py", "stock DataLoader", {"CIFAR_STOCK_LOADER": "1"},
     [Interruption("train", 0.5, "notice")]),
    ("cifar_resnet.py", "stock DataLoader", {"CIFAR_STOCK_LOADER": "1"},
     [Interruption("log", 0.6, "kill")]),
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Which scripts, where in the run, and where to write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scripts", nargs="*", default=None, help="only these scripts")
    p.add_argument("--fracs", nargs="*", type=float, default=[0.5],
                   help="where in a phase's arrivals to interrupt (0-1), one case each")
    p.add_argument("--json", default=None, help="write every case's outcome here")
    p.add_argument("--keep", action="store_true", help="keep the cases' folders (stores, logs)")
    p.add_argument("--search", type=int, default=0, metavar="N",
                   help="instead of the grid: N cases per script drawn by hypothesis "
                        "(one or two interruptions each, as the suite draws them)")
    p.add_argument("--seed", type=int, default=0, help="hypothesis seed for --search")
    return p.parse_args(argv)


def _row(label: str, cases: list[dict]) -> str:
    cells = []
    for mode in ("notice", "kill"):
        for point in POINTS:
            # A point the run never reached proves nothing: left out unless the case failed.
            mine = [c for c in cases if c["point"] == point and c["mode"] == mode
                    and (c["fired"] or not c["passed"])]
            ok = sum(1 for c in mine if c["passed"])
            cells.append(f"{ok}/{len(mine)}" if mine else "-")
    return f"| {label:<46} | " + " | ".join(f"{c:>7}" for c in cells) + " |"


def search(args: argparse.Namespace) -> int:
    """Run N hypothesis-drawn cases per script; print each and the count. Exit 1 on a failure."""
    from hypothesis import HealthCheck, Phase, given, seed, settings

    from loops.search import interruptions

    scratch = Path(tempfile.mkdtemp(prefix="loops-search-"))
    shapes = [s for s in SHAPES if not args.scripts or s[0] in args.scripts]
    failures: list[str] = []
    n, t_all = 0, time.monotonic()
    for script, variant, env in shapes:
        @seed(args.seed)
        @settings(max_examples=args.search, deadline=None, database=None,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))
        @given(intrs=interruptions())
        def one(intrs: list[Interruption]) -> None:
            nonlocal n
            t0 = time.monotonic()
            res = run_case(script, intrs, scratch / f"case-{n}", scratch, env)
            n += 1
            label = f"{script} {variant or '-'} {[str(i) for i in intrs]}"
            print(f"{label} {'pass' if not res.problems else 'FAIL'} "
                  f"({time.monotonic() - t0:.1f} s)", flush=True)
            if res.problems:   # recorded, not raised: the search goes on over every draw
                failures.append(f"{label}: {res.problems[0][:400]}")
        one()
    print(f"\n{n - len(failures)} of {n} drawn cases passed (seed {args.seed}), "
          f"{time.monotonic() - t_all:.0f} s")
    for f in failures:
        print("FAIL", f)
    if not args.keep:
        shutil.rmtree(scratch, ignore_errors=True)
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    """Run the sweep and the controls; print the table. Exit 1 if a case or a control is wrong."""
    args = parse_args(argv)
    if args.search:
        return search(args)
    scratch = Path(tempfile.mkdtemp(prefix="loops-bench-"))
    shapes = [s for s in SHAPES if not args.scripts or s[0] in args.scripts]
    results: list[dict] = []
    t_all = time.monotonic()
    n = 0
    for script, variant, env in shapes:
        for mode in ("notice", "kill"):
            for point in POINTS:
                for frac in args.fracs:
                    t0 = time.monotonic()
                    res = run_case(script, [Interruption(point, frac, mode)],
                                   scratch / f"case-{n}", scratch, env)
                    n += 1
                    case = {"script": script, "variant": variant, "point": point, "mode": mode,
                            "frac": frac, "passed": not res.problems, "fired": res.fired,
                            "wall_s": round(time.monotonic() - t0, 1),
                            "attempts": [{"point": a.point, "fired_step": (a.fired or {}).get("step"),
                                          "emergency_step": a.emergency_step,
                                          "resumed_at": a.resumed_at, "exit": a.exit_code}
                                         for a in res.attempts],
                            "problems": res.problems}
                    results.append(case)
                    print(f"{script} {variant or '-'} {mode}@{point}:{frac} "
                          f"{'pass' if case['passed'] else 'FAIL'} ({case['wall_s']} s)"
                          + (f"\n    {res.problems[0][:600]}" if res.problems else ""), flush=True)
    controls = []
    for script, variant, env, intrs in CONTROLS:
        if args.scripts and script not in args.scripts:
            continue
        res = run_case(script, intrs, scratch / f"case-{n}", scratch, env)
        n += 1
        controls.append({"script": script, "variant": variant,
                         "interruptions": [str(i) for i in intrs], "fired": res.fired,
                         "failed_as_it_must": bool(res.problems), "problems": res.problems})
    total_s = time.monotonic() - t_all

    heads = [f"{m[0]}:{p[:5]}" for m in ("notice", "kill") for p in POINTS]
    print(f"\n| {'script (variant)':<46} | " + " | ".join(f"{h:>7}" for h in heads) + " |")
    print("|" + "-" * 48 + "|" + "|".join("-" * 9 for _ in heads) + "|")
    for script, variant, _env in shapes:
        mine = [c for c in results if c["script"] == script and c["variant"] == variant]
        print(_row(f"{script}" + (f" ({variant})" if variant else ""), mine))
    passed = sum(1 for c in results if c["passed"])
    print(f"\n{passed} of {len(results)} cases passed "
          f"({sum(1 for c in results if c['fired'])} interrupted where asked), {total_s:.0f} s")
    for c in results:
        if not c["passed"]:
            print(f"FAIL {c['script']} {c['variant']} {c['mode']}@{c['point']}:{c['frac']}: "
                  f"{c['problems'][0][:400]}")
    for c in controls:
        print(f"control {c['script']} ({c['variant']}) {c['interruptions']}: "
              f"{'failed, as it must' if c['failed_as_it_must'] else 'PASSED: the harness missed it'}"
              + (f": {c['problems'][0][:300]}" if c["problems"] else ""))
    if args.json:
        Path(args.json).write_text(json.dumps({"cases": results, "controls": controls,
                                               "total_s": total_s}, indent=1))
    if args.keep:
        print(f"cases kept in {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    ok = passed == len(results) and all(c["failed_as_it_must"] for c in controls)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
