"""Where budgets come from (spotrun.budgets.source, docs/budgets.md): spotrun.toml's
`[budgets]` with the rows `spotrun budgets set` writes over them, and the local verbs on a
real SQLite home."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlmodel import select

from spotrun.budgets.source import DATABASE, TOML, effective, merge
from spotrun.cli import cli
from spotrun.config import BudgetsSettings, ScopeBudget, load_settings
from spotrun.db import database_missing, open_db, session
from spotrun.db.budget_rows import BudgetRow
from spotrun.db.identity import TrailEntry

TOML_TEXT = ('[budgets]\nallow_owner_override = true\n'
             '[budgets.project.ml]\nusd = 2000\nperiod = "month"\n'
             '[budgets.owner.alice]\nusd = 300\nperiod = "week"\n')


def _row(scope: str, name: str, usd: float, period: str, by: str = "ada") -> BudgetRow:
    return BudgetRow(scope=scope, name=name, usd=usd, period=period, set_by=by)


def test_a_database_row_overrides_the_tomls_budget_of_the_same_scope_and_name():
    toml = BudgetsSettings(allow_owner_override=True,
                           project={"ml": ScopeBudget(usd=2000.0, period="month")},
                           owner={"alice": ScopeBudget(usd=300.0, period="week")})
    found = merge(toml, [_row("project", "ml", 50.0, "day"),
                         _row("project", "vision", 10.0, "total"),
                         _row("owner", "bob", 5.0, "week", by="root")])
    b = found.budgets
    assert b.allow_owner_override is True   # not a budget: the toml's alone
    assert [(sc, n, x.usd, x.period) for sc, n, x in b.configured()] == [
        ("project", "ml", 50.0, "day"), ("project", "vision", 10.0, "total"),
        ("owner", "alice", 300.0, "week"), ("owner", "bob", 5.0, "week")]
    assert b.of_job("ml", "alice") == [("project", "ml", ScopeBudget(50.0, "day")),
                                       ("owner", "alice", ScopeBudget(300.0, "week"))]
    o = found.origins
    assert o["owner:alice"].source == TOML and o["owner:alice"].set_by is None
    assert o["project:ml"].source == DATABASE and o["project:ml"].set_by == "ada"
    assert o["project:ml"].over_toml == ScopeBudget(2000.0, "month")
    assert o["project:vision"].over_toml is None and o["owner:bob"].set_by == "root"
    # The toml's settings object is left as it was (the daemon keeps it).
    assert toml.project["ml"].usd == 2000.0 and "vision" not in toml.project


def test_no_rows_is_the_toml_and_an_unknown_scope_is_ignored():
    toml = BudgetsSettings(project={"ml": ScopeBudget(usd=2.0, period="day")})
    assert merge(toml, []).budgets == toml
    assert merge(toml, [_row("team", "x", 1.0, "day")]).budgets == toml
    assert merge(BudgetsSettings(), []).budgets.configured() == []


def _cli(home: Path, *args: str):
    return CliRunner().invoke(cli, list(args), env={"SPOTRUN_HOME": str(home),
                                                    "COLUMNS": "200"})


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    (h / "spotrun.toml").write_text(TOML_TEXT)
    return h


def _rows(home: Path) -> list[tuple]:
    eng = open_db(load_settings(str(home)).database_url)
    with session(eng) as s:
        out = [(r.scope, r.name, r.usd, r.period) for r in s.exec(select(BudgetRow))]
    eng.dispose()
    return sorted(out)


@pytest.mark.parametrize("args,field", [
    (["project", "ml", "--usd", "-5", "--period", "day"], "--usd"),
    (["project", "ml", "--usd", "0", "--period", "day"], "--usd"),
    (["project", "ml", "--usd", "nan", "--period", "day"], "--usd"),
    (["project", "ml", "--usd", "lots", "--period", "day"], "--usd"),
    (["project", "ml", "--period", "day"], "--usd"),
    (["project", "ml", "--usd", "5", "--period", "year"], "--period"),
    (["project", "ml", "--usd", "5"], "--period"),
    (["team", "ml", "--usd", "5", "--period", "day"], "SCOPE"),
    (["project", "ML", "--usd", "5", "--period", "day"], "NAME"),
    (["owner", "a b", "--usd", "5", "--period", "day"], "NAME"),
])
def test_bad_input_is_one_line_naming_the_field_and_writes_nothing(home, args, field):
    res = _cli(home, "budgets", "set", *args)
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}: "), res.output
    assert "Traceback" not in res.output
    assert database_missing(load_settings(str(home)))   # not even a database created


def test_set_overrides_remove_restores_the_toml_and_each_change_is_trailed(home):
    res = _cli(home, "budgets", "set", "project", "ml", "--usd", "50", "--period", "day",
               "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["budget"] == {"usd": 50.0, "period": "day"} and out["source"] == DATABASE
    assert out["overrides_toml"] == {"usd": 2000.0, "period": "month"}
    assert _cli(home, "budgets", "set", "owner", "bob", "--usd", "5",
                "--period", "total").exit_code == 0
    assert _rows(home) == [("owner", "bob", 5.0, "total"), ("project", "ml", 50.0, "day")]

    listed = {f"{d['scope']}:{d['name']}": d
              for d in json.loads(_cli(home, "budgets", "--json").output)}
    assert {k: (d["budget_usd"], d["period"], d["source"]) for k, d in listed.items()} == {
        "project:ml": (50.0, "day", DATABASE), "owner:alice": (300.0, "week", TOML),
        "owner:bob": (5.0, "total", DATABASE)}
    table = _cli(home, "budgets").output
    assert "set by" in table and "over the toml's" in table and TOML in table

    res = _cli(home, "budgets", "remove", "project", "ml")
    assert res.exit_code == 0 and "$2,000.00 per month (spotrun.toml)" in res.output
    # The toml's own budget is not the database's to remove.
    res = _cli(home, "budgets", "remove", "project", "ml")
    assert res.exit_code == 2 and res.output.startswith("error: NAME: budget project ml is "
                                                        "set in spotrun.toml")
    assert _cli(home, "budgets", "remove", "owner", "nobody").exit_code == 2
    assert _rows(home) == [("owner", "bob", 5.0, "total")]

    eng = open_db(load_settings(str(home)).database_url)
    with session(eng) as s:
        trail = [(t.action, t.target, t.role, t.outcome) for t in s.exec(select(TrailEntry))]
        detail = [t.detail for t in s.exec(select(TrailEntry))]
    eng.dispose()
    assert trail == [("budgets set", "project:ml", "local", "ok"),
                     ("budgets set", "owner:bob", "local", "ok"),
                     ("budgets remove", "project:ml", "local", "ok")]
    assert detail[0] == "$50/day (row was none)"
    assert detail[2] == "$2000/month from spotrun.toml (row was $50/day)"


def test_effective_reads_the_rows_written_by_another_process(home):
    settings = load_settings(str(home))
    eng = open_db(settings.database_url)
    assert effective(settings, eng).budgets == settings.budgets
    assert _cli(home, "budgets", "set", "project", "ml", "--usd", "7",
                "--period", "week").exit_code == 0
    assert effective(settings, eng).budgets.project["ml"] == ScopeBudget(7.0, "week")
    eng.dispose()
