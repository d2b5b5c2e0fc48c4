"""Every job spec in README.md and docs/*.md runs `spotrun submit --dry-run` as written.

A job spec is a ```yaml block whose mapping has a `command`. Each is copied into a fresh
folder as `job.yaml`, the scripts its command runs are written where its `workdir` ships
them from, and `submit --dry-run` runs on it through the real CLI in one home of the
embedded default (the local provider's trace; no market, no daemon, nothing written).
A spec a user copies must work as written: it has a `name`, and a command that runs a
script of the job's own has a `workdir` that ships it (without one the script is not on
the instance and the job fails). No placeholder section is left in the docs either.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from spotrun.cli import cli

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```ya?ml[^\n]*\n(.*?)^```", re.S | re.M)
# A script of the job's own: a relative path ending in .py or .sh (not $VAR/..., not -m mod).
SCRIPT = re.compile(r"^(?!/)(?!-)[\w./-]*\w\.(py|sh)$")
PLACEHOLDER = re.compile(r"this section is filled|^\*?filled by|\bTODO\b|\bTBD\b",
                         re.I | re.M)


def doc_specs() -> list[tuple[str, int, str]]:
    """(doc, line, yaml text) of every job spec block in the docs."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for m in BLOCK.finditer(text):
            try:
                data = yaml.safe_load(m.group(1))
            except yaml.YAMLError:
                continue
            if isinstance(data, dict) and "command" in data:
                line = text.count("\n", 0, m.start()) + 2
                found.append((str(doc.relative_to(REPO)), line, m.group(1)))
    return found


SPECS = doc_specs()


def scripts_of(command: str) -> list[str]:
    """The relative scripts a command runs (`python train.py`, `torchrun ... train.py`)."""
    return [t for t in shlex.split(command) if SCRIPT.match(t)]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("doc-specs") / "home"


def test_the_docs_carry_the_job_specs_they_describe() -> None:
    docs = {doc for doc, _, _ in SPECS}
    assert {"docs/job-spec.md", "docs/multi-node.md", "docs/integrations.md"} <= docs
    # Trainer and Lightning: one runnable spec each beside their scripts.
    assert sum(doc == "docs/integrations.md" for doc, _, _ in SPECS) >= 2


@pytest.mark.parametrize("doc,line,text", SPECS, ids=[f"{d}:{n}" for d, n, _ in SPECS])
def test_doc_spec_dry_runs_as_written(home: Path, tmp_path: Path, doc: str, line: int,
                                      text: str) -> None:
    spec = yaml.safe_load(text)
    where = f"{doc}:{line}"
    assert "name" in spec, f"{where}: a job spec needs a name"
    scripts = scripts_of(spec["command"])
    assert not scripts or "workdir" in spec, (
        f"{where}: the command runs {scripts} but the spec has no workdir: the script would "
        "not be on the instance")
    folder = tmp_path / "job"
    folder.mkdir()
    path = folder / "job.yaml"
    path.write_text(text)
    workdir = (folder / spec["workdir"]) if "workdir" in spec else folder
    workdir.mkdir(parents=True, exist_ok=True)
    for script in scripts:
        (workdir / script).parent.mkdir(parents=True, exist_ok=True)
        (workdir / script).write_text("print('stand-in for the documented script')\n")
    res = CliRunner().invoke(cli, ["submit", "--dry-run", "--json", str(path)],
                             env={"SPOTRUN_HOME": str(home)})
    assert res.exit_code == 0, f"{where}: {res.output}"
    assert "Traceback" not in res.output
    plan = json.loads(res.stdout)
    assert plan["name"] == spec["name"]
    assert plan["candidates"] or plan["wait_reason"], where
    assert not home.exists(), "a dry run writes nothing"


def test_no_placeholder_is_left_in_the_docs() -> None:
    for doc in DOCS:
        hits = [m.group(0) for m in PLACEHOLDER.finditer(doc.read_text())]
        assert hits == [], f"{doc.relative_to(REPO)}: {hits}"


def test_the_workdir_check_can_fail() -> None:
    # The rule above, on the shape docs/integrations.md had: a script and no workdir.
    assert scripts_of("python train.py") == ["train.py"]
    assert scripts_of("torchrun --nproc-per-node=$SPOTRUN_GPUS src/train.py --lr 1") == [
        "src/train.py"]
    assert scripts_of("python -m mypkg.train") == []
    assert scripts_of("python -c 'import time'") == []
