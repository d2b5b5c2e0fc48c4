"""Every `--option` a hint names exists on the command it names (issue 22).

A hint that names an option the command lacks ("--wide shows all" printed by `submit
--dry-run` when submit had no --wide) sends the user to an error. These tests run the
verbs through the real CLI in the situations that print hints (a narrow terminal, rows cut
by --top, a multi-node job, a market that cannot be read) and read every verb's --help,
then check each `--xxx` against the click command: the verb named just before it
(`submit --dry-run`), else the verb that printed it.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from spotrun.cli import VERBS, cli

REPO = Path(__file__).resolve().parents[1]
SAMPLES = sorted((REPO / "configs" / "jobs").glob("*.yaml"))
DEMO_SPEC = REPO / "configs" / "demo" / "job.yaml"
# `--name`, optionally preceded by `spotrun VERB ` or `VERB ` (the verb it belongs to).
MENTION = re.compile(r"(?:\b(?P<verb>[a-z]+) )?(?<![\w-])(?P<opt>--[a-z][a-z0-9-]*)")
# Options of other programs that help texts quote (torchrun's).
FOREIGN = {"--nproc-per-node", "--nnodes"}
# Mentions that name another verb's option in words: ui's help says its JSON routes are
# "the same as the CLI's --json" (status --json, audit --json).
ELSEWHERE = {("ui", "--json")}


def _options(verb: str) -> set[str]:
    cmd = cli.get_command(click.Context(cli), verb)
    assert cmd is not None, verb
    opts = {"--help"}
    for p in cmd.params:
        opts.update(o for o in (*p.opts, *p.secondary_opts) if o.startswith("--"))
    return opts


def _unknown(verb: str, text: str) -> list[str]:
    """The options text names that do not exist on the command they refer to."""
    flat = " ".join(text.replace("`", " ").split())   # hints may wrap mid-phrase
    bad = []
    for m in MENTION.finditer(flat):
        opt = m.group("opt")
        owner = m.group("verb") if m.group("verb") in VERBS else verb
        if opt not in FOREIGN and (owner, opt) not in ELSEWHERE and opt not in _options(owner):
            bad.append(f"{owner} {opt}")
    return bad


def _run(home: Path, *args: str, columns: str = "60", **env: str | None):
    return CliRunner().invoke(cli, list(args),
                              env={"SPOTRUN_HOME": str(home), "COLUMNS": columns, **env})


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"   # the embedded default: the local provider, no market running


def _multinode(tmp_path: Path) -> Path:
    spec = tmp_path / "mn.yaml"
    spec.write_text("name: mn\ncommand: x\nresources: {nodes: 2}\npolicy: {market: spot}\n")
    return spec


def test_dry_run_hints_name_submit_options(home: Path, tmp_path: Path) -> None:
    seen: set[str] = set()
    for spec in [DEMO_SPEC, _multinode(tmp_path), *SAMPLES]:
        res = _run(home, "submit", "--dry-run", str(spec))
        assert res.exit_code == 0, res.output
        assert _unknown("submit", res.output) == [], spec.name
        seen.update(m.group("opt") for m in MENTION.finditer(" ".join(res.output.split())))
    # A narrow terminal drops columns, and the note says how to see them all.
    assert "--wide" in seen
    wide = _run(home, "submit", "--dry-run", "--wide", str(DEMO_SPEC))
    assert wide.exit_code == 0, wide.output
    assert "--wide shows all" not in " ".join(wide.output.split())
    assert "exp. h" in wide.output


def test_plan_hints_name_plan_options(home: Path, tmp_path: Path) -> None:
    found: set[str] = set()
    for args in (["--top", "2"], ["--top", "2", "--offline"], ["--top", "0"]):
        res = _run(home, "plan", str(DEMO_SPEC), str(_multinode(tmp_path)), *map(str, SAMPLES),
                   *args)
        assert res.exit_code == 0, res.output
        assert _unknown("plan", res.output) == []
        found.update(m.group("opt") for m in MENTION.finditer(" ".join(res.output.split())))
    assert {"--wide", "--top", "--json", "--offline"} <= found


def test_hints_when_the_market_cannot_be_read(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "spotrun.toml").write_text('provider = "aws"\n[aws]\n'
                                       'endpoint_url = "http://127.0.0.1:9"\n')
    none = str(tmp_path / "absent")
    env = {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "AWS_SESSION_TOKEN": None,
           "AWS_PROFILE": None, "AWS_SHARED_CREDENTIALS_FILE": none, "AWS_CONFIG_FILE": none,
           "AWS_EC2_METADATA_DISABLED": "true"}
    for verb, args in (("plan", ["plan"]), ("submit", ["submit", "--dry-run"])):
        res = _run(home, *args, str(SAMPLES[-1]), **env)
        assert res.exit_code == 0, res.output
        assert _unknown(verb, res.output) == [], verb


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_every_verbs_help_names_options_that_exist(verb: str, tmp_path: Path) -> None:
    res = _run(tmp_path, verb, "--help", columns="200")
    assert res.exit_code == 0, res.output
    assert _unknown(verb, res.output) == []


def test_the_scanner_catches_a_missing_option() -> None:
    # The check itself can fail: an option no verb has, and one of another verb.
    assert _unknown("submit", "(not shown: exp. h; --wide shows all) --nonesuch") == [
        "submit --nonesuch"]
    assert _unknown("plan", "the same as `submit --dry-run`; status --top") == ["status --top"]
