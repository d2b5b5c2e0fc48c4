"""The read verbs start fast: `spotrun status` and `spotrun cancel` load neither the decision's
numpy nor torch (docs/benchmarks.md, CLI start-up). A session found numpy pulled into
`status` by one top-level import in the backend (0.1-0.2 s per call, every test's CLI too)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import json, sys
from spotrun.cli import cli
try:
    cli.main(sys.argv[1:], standalone_mode=False)
except SystemExit:
    pass
print(json.dumps(sorted(m for m in ("numpy", "torch", "boto3", "fastapi") if m in sys.modules)),
      file=sys.stderr)
"""


@pytest.mark.parametrize("verb", [["status", "--json"], ["status", "nope-1", "--json"],
                                  ["budgets", "--json"]])
def test_read_verbs_load_no_heavy_library(tmp_path: Path, verb: list[str]) -> None:
    env = {**os.environ, "SPOTRUN_HOME": str(tmp_path)}
    res = subprocess.run([sys.executable, "-c", PROBE, *verb], env=env, capture_output=True,
                         text=True, timeout=120)
    loaded = json.loads(res.stderr.strip().splitlines()[-1])
    assert loaded == [], (verb, loaded)
