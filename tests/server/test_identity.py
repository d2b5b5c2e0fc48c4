"""Users and API tokens: shown once, stored hashed, revoked at once; the CLI's bad input is one line."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from spotrun.cli import cli
from spotrun.config import load_settings
from spotrun.db import open_db, session
from spotrun.db.identity import ApiToken
from spotrun.errors import AuthError, BadInputError
from spotrun.server import identity


def _engine(home: Path):
    return open_db(load_settings(str(home)).database_url)


def test_a_token_is_stored_only_as_its_hash_and_authenticates(tmp_home: Path) -> None:
    engine = _engine(tmp_home)
    token = identity.add_user(engine, "alice", "member")
    token_id, secret = identity.split_token(token)
    assert token.startswith("spotrun_") and len(secret) >= 40
    with session(engine) as s:
        row = s.get(ApiToken, token_id)
    assert row.secret_sha256 == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in (tmp_home / "spotrun.db").read_bytes().decode("latin-1")
    who = identity.authenticate(engine, token)
    assert (who.user, who.role, who.token_id) == ("alice", "member", token_id)
    assert who.can("viewer") and who.can("member") and not who.can("admin")


@pytest.mark.parametrize("bad", [None, "", "nonsense", "spotrun_0123456789ab_x",
                                 "Bearer spotrun_zz_y"])
def test_no_malformed_or_unknown_token_is_refused(tmp_home: Path, bad: str | None) -> None:
    engine = _engine(tmp_home)
    identity.add_user(engine, "alice", "member")
    with pytest.raises(AuthError) as err:
        identity.authenticate(engine, bad)
    assert err.value.http_status == 401 and (bad or "§") not in str(err.value)


def test_a_wrong_secret_and_a_revoked_token_fail(tmp_home: Path) -> None:
    engine = _engine(tmp_home)
    token = identity.add_user(engine, "alice", "member")
    with pytest.raises(AuthError):
        identity.authenticate(engine, token[:-2] + "xx")
    second = identity.new_token(engine, "alice")
    assert identity.revoke(engine, identity.split_token(token)[0]) == [
        identity.split_token(token)[0]]
    with pytest.raises(AuthError):
        identity.authenticate(engine, token)
    assert identity.authenticate(engine, second).user == "alice"
    identity.revoke(engine, "alice")
    with pytest.raises(AuthError):
        identity.authenticate(engine, second)


def test_bad_names_and_roles_are_bad_input(tmp_home: Path) -> None:
    engine = _engine(tmp_home)
    with pytest.raises(BadInputError, match="--role"):
        identity.add_user(engine, "alice", "root")
    with pytest.raises(BadInputError, match="NAME"):
        identity.add_user(engine, "Alice Smith", "member")
    identity.add_user(engine, "alice", "member")
    with pytest.raises(BadInputError, match="exists"):
        identity.add_user(engine, "alice", "admin")


def test_users_verbs(tmp_home: Path) -> None:
    run = CliRunner()
    env = {"SPOTRUN_HOME": str(tmp_home)}
    res = run.invoke(cli, ["users", "add", "alice", "--role", "member"], env=env)
    assert res.exit_code == 0, res.output
    token = res.stdout.strip()
    assert identity.split_token(token) is not None
    res = run.invoke(cli, ["users", "list", "--json"], env=env)
    users = json.loads(res.stdout)
    assert [(u["name"], u["role"], len(u["tokens"])) for u in users] == [("alice", "member", 1)]
    assert token.split("_", 2)[2] not in res.stdout
    res = run.invoke(cli, ["users", "add", "bob", "--role", "owner"], env=env)
    assert res.exit_code == 2 and "--role" in res.output and "admin, member, viewer" in res.output
    assert len(res.output.strip().splitlines()) == 1
    res = run.invoke(cli, ["users", "revoke", "nobody"], env=env)
    assert res.exit_code == 2 and "NAME|TOKEN_ID" in res.output
    res = run.invoke(cli, ["users", "revoke", "alice"], env=env)
    assert res.exit_code == 0 and "revoked 1 token(s)" in res.output
    res = run.invoke(cli, ["users", "list"], env=env)
    assert res.exit_code == 0 and "alice" in res.output


def test_a_token_written_into_an_event_or_a_log_keeps_only_its_id(tmp_home: Path) -> None:
    import io
    import logging

    import structlog

    from spotrun.db import Event, add_event
    from spotrun.logsetup import configure_logging
    from spotrun.secrets import redact_tokens
    engine = _engine(tmp_home)
    token = identity.add_user(engine, "alice", "member")
    token_id, secret = identity.split_token(token)
    assert redact_tokens(f"x {token} y") == f"x spotrun_{token_id}_*** y"
    with session(engine) as s:
        add_event(s, "job-1", "note", f"pasted {token}")
        s.commit()
        assert secret not in s.get(Event, 1).detail
    out = io.StringIO()
    configure_logging(stream=out)
    try:
        structlog.get_logger("t").info("called", path=f"/x/{token}")
        logging.getLogger("uvicorn.error").warning("bad header %s", token)
    finally:
        logging.getLogger().handlers[:] = []
    assert token_id in out.getvalue() and secret not in out.getvalue()
