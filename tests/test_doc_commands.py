"""Every `spotrun ...` command the docs show names a real subcommand and real options.

Read the way a user reads the docs: each command in README.md and docs/*.md, in shell code
blocks and in inline code, is walked down `spotrun.cli.cli`'s command tree (the click group
behind the `spotrun` script), and each `--option` (or `-x`) it names must be one of that
command's parameters. Usage notation is understood: `[...]` optional parts, `A | B`
alternatives inside brackets, `...` repetition, upper-case placeholders.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import click

from spotrun.cli import cli

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# Code blocks in these languages hold no shell commands (Python, configs, output).
NOT_SHELL = {"python", "py", "yaml", "yml", "toml", "json", "ini", "csv", "text", "txt",
             "mermaid", "dockerfile", "sql"}
FENCE = re.compile(r"^\s*```+\s*([A-Za-z0-9_+-]*)")
INLINE = re.compile(r"`([^`]+)`")
# `spotrun` as a command word: at the start, or after whitespace / `$` / a path
# (`.venv/bin/spotrun`, `python -m spotrun`), and followed by an argument.
COMMAND = re.compile(r"(?:^|(?<=[\s$(]))(?:[\w./-]*/)?spotrun[ \t]+(\S.*)$")


@dataclass(frozen=True)
class DocCommand:
    """One `spotrun ...` command as a doc shows it."""

    where: str          # file:line
    text: str           # the arguments after `spotrun`


def _shell_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of each shell line in code blocks, continuations joined."""
    out: list[tuple[int, str]] = []
    lang: str | None = None
    for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fence = FENCE.match(line)
        if fence:
            lang = None if lang is not None else fence.group(1).lower()
            continue
        if lang is None or lang in NOT_SHELL:
            continue
        stripped = line.strip()
        continued = out and (out[-1][1].endswith("\\")
                             or (line[:1].isspace() and stripped[:1] in "-[" and
                                 "spotrun" in out[-1][1]))
        if continued:
            prev_no, prev = out[-1]
            out[-1] = (prev_no, prev.rstrip("\\").rstrip() + " " + stripped)
        else:
            out.append((no, line))
    return out


def _inline_spans(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of each inline code span outside code blocks (one may wrap)."""
    prose: list[str] = []
    in_block = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_block = not in_block
            prose.append("")
            continue
        prose.append("" if in_block else line)
    text = "\n".join(prose)
    return [(text.count("\n", 0, m.start()) + 1, " ".join(m.group(1).split()))
            for m in INLINE.finditer(text)]


def _strip_comment(text: str) -> str:
    """The shell line without its trailing `# comment`."""
    return re.split(r"(?:^|\s)#", text, maxsplit=1)[0]


def doc_commands(paths: list[Path] = DOCS) -> list[DocCommand]:
    """Every `spotrun ...` command in the docs' shell blocks and inline code."""
    found: list[DocCommand] = []
    for path in paths:
        rel = path.relative_to(REPO).as_posix()
        candidates = [(no, _strip_comment(t)) for no, t in _shell_lines(path)]
        candidates += [(no, t) for no, t in _inline_spans(path) if t.lstrip().startswith(
            ("spotrun ", "$ spotrun ")) or re.match(r"^(\w+=\S+\s+)+\S*spotrun ", t)]
        for no, text in candidates:
            m = COMMAND.search(text.strip())
            if m:
                found.append(DocCommand(f"{rel}:{no}", m.group(1).strip()))
    return found


def _tokens(text: str) -> list[str]:
    """The command's words up to a shell operator, usage notation taken apart."""
    text = text.replace("[", " [ ").replace("]", " ] ")
    try:
        words = shlex.split(text, posix=True)
    except ValueError:          # an unbalanced quote in prose-like code: split plainly
        words = text.split()
    out: list[str] = []
    depth = 0
    for w in words:
        if w == "[":
            depth += 1
        elif w == "]":
            depth = max(depth - 1, 0)
        elif depth == 0 and (w in ("|", "||", "&&", "&", ";", ">", ">>", "2>&1", "<")
                             or w.startswith((">", "2>", "|"))):
            break               # what follows is another command (jq, a redirect)
        elif w not in ("|", "...") and not w.startswith("<"):
            out.append(w.rstrip(".,;:)") if w.endswith((".", ",", ";", ":", ")"))
                       and not w.startswith("-") else w.rstrip(",;:)"))
    return out


def _option_names(cmd: click.Command, ctx: click.Context) -> set[str]:
    names: set[str] = set()
    for p in cmd.get_params(ctx):
        names.update(p.opts)
        names.update(p.secondary_opts)
    return names


def check(command: DocCommand) -> list[str]:
    """What in one doc command does not exist in the CLI (empty: all of it exists)."""
    problems: list[str] = []
    cmd: click.Command = cli
    path = ["spotrun"]
    ctx = click.Context(cli, info_name="spotrun")
    for word in _tokens(command.text):
        if word.startswith("-") and len(word) > 1 and not re.fullmatch(r"-\d[\d.]*", word):
            name = word.split("=", 1)[0]
            if name not in _option_names(cmd, ctx):
                problems.append(f"{command.where}: `{' '.join(path)}` has no option {name}")
            continue
        if isinstance(cmd, click.Group):
            sub = cmd.get_command(ctx, word)
            if sub is None:
                if not (word.isupper() or word.startswith(("$", "{"))):
                    problems.append(f"{command.where}: `{' '.join(path)}` has no subcommand "
                                    f"{word!r}")
                break
            ctx = click.Context(sub, info_name=word, parent=ctx)
            cmd = sub
            path.append(word)
    return problems


def test_the_docs_name_commands_in_every_way_checked() -> None:
    """The reader finds what it should: blocks, inline code, usage notation, pipes."""
    seen = {c.text for c in doc_commands()}
    assert "status [JOB] [--json]" in seen                      # README's block, comment cut
    assert any(t.startswith("interrupt JOB") for t in seen)      # inline code in a doc
    assert _tokens("simulate --trace CSV [--prices CSV | --spot-price USD] | head") == [
        "simulate", "--trace", "CSV", "--prices", "CSV", "--spot-price", "USD"]
    assert check(DocCommand("x:1", "status --jsn")) == [
        "x:1: `spotrun status` has no option --jsn"]
    assert check(DocCommand("x:1", "markets status")) == [
        "x:1: `spotrun` has no subcommand 'markets'"]
    assert check(DocCommand("x:1", "market status --json")) == []


def test_every_command_and_option_the_docs_show_exists() -> None:
    commands = doc_commands()
    assert len(commands) > 50, "the docs' commands were not found"
    problems = [p for c in commands for p in check(c)]
    assert not problems, "\n".join(problems)

