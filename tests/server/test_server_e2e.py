"""End to end on 127.0.0.1: a real server, real CLI processes with their own HOME; roles,
owners, revocation, the trail, and no token anywhere it should not be."""

from __future__ import annotations

import json
import stat

from server.harness import Team, add_job, one_line_exit_2



def test_roles_owners_and_the_trail_through_the_cli(team: Team) -> None:
    add_job(team.engine, "job-alice", "alice")
    add_job(team.engine, "job-bob", "bob")
    add_job(team.engine, "job-bob2", "bob")
    for user in ("alice", "vera", "ada"):
        res = team.cli(user, "login", team.url, "--token", team.tokens[user])
        assert res.returncode == 0 and f"as {user}" in res.stdout, res.stderr
    cfg = team.tmp / "laptop-alice" / ".config" / "spotrun" / "remote.json"
    assert stat.S_IMODE(cfg.stat().st_mode) == 0o600
    # status remotely: exactly the JSON the server's home gives locally
    res = team.cli("alice", "status", "--json")
    assert res.returncode == 0, res.stderr
    assert sorted(j["id"] for j in json.loads(res.stdout)) == ["job-alice", "job-bob",
                                                                "job-bob2"]
    res = team.cli("alice", "status", "job-bob")
    assert res.returncode == 0 and "job-bob" in res.stdout and "owner bob" in res.stdout
    # alice cannot cancel bob's job; a viewer cannot cancel; an admin can
    res = team.cli("alice", "cancel", "job-bob")
    one_line_exit_2(res, "job-bob", "bob's")
    with team.client("alice") as c:
        assert c.post("/api/v1/jobs/job-bob/cancel").status_code == 403
    one_line_exit_2(team.cli("vera", "cancel", "job-alice"), "role member")
    res = team.cli("alice", "cancel", "job-alice")
    assert res.returncode == 0 and res.stdout.strip() == "job-alice cancelled", res.stderr
    res = team.cli("ada", "cancel", "job-bob")
    assert res.returncode == 0 and res.stdout.strip() == "job-bob cancelled", res.stderr
    one_line_exit_2(team.cli("ada", "cancel", "nope"), "JOB", "no such job")
    res = team.cli("ada", "resume", "job-bob", "--json")
    one_line_exit_2(res, "only budget_exhausted or failed")
    # the trail, as the admin sees it remotely; members may not read it
    res = team.cli("ada", "trail", "--json")
    assert res.returncode == 0, res.stderr
    rows = [(r["user"], r["action"], r["target"], r["outcome"]) for r in json.loads(res.stdout)]
    assert ("alice", "POST /api/v1/jobs/job-bob/cancel", "job-bob", "denied") in rows
    assert ("vera", "POST /api/v1/jobs/job-alice/cancel", "job-alice", "denied") in rows
    assert ("alice", "cancel", "job-alice", "ok") in rows
    assert ("ada", "cancel", "job-bob", "ok") in rows
    assert ("ada", "cancel", "nope", "error") in rows
    assert ("ada", "resume", "job-bob", "error") in rows
    one_line_exit_2(team.cli("alice", "trail"), "role admin")
    # the token is in no log, trail row, event or output
    outs = res.stdout + res.stderr
    for user, token in team.tokens.items():
        secret = token.split("_", 2)[2]
        assert secret not in outs
        for path in team.home.rglob("*"):
            if path.is_file():
                assert secret.encode() not in path.read_bytes(), path


def test_bad_revoked_and_repeated_tokens(team: Team) -> None:
    res = team.cli("bob", "login", team.url, "--token", team.tokens["bob"])
    assert res.returncode == 0, res.stderr
    with team.client(None) as c:
        r = c.get("/api/v1/jobs")
        assert r.status_code == 401 and r.json()["field"] == "Authorization"
        assert set(r.json()) == {"error", "field", "hint"}
    with team.client("bob") as c:
        assert c.get("/api/v1/whoami").json()["user"] == "bob"
    from spotrun.server import identity
    identity.revoke(team.engine, "bob")
    one_line_exit_2(team.cli("bob", "status"), "Authorization", "unknown or revoked")
    res = team.cli("alice", "login", team.url, "--token", "spotrun_0123456789ab_wrong")
    one_line_exit_2(res, "Authorization")
    assert not (team.tmp / "laptop-alice" / ".config" / "spotrun" / "remote.json").exists()
    # repeated bad tokens from one address: 429 with Retry-After, until the window passes
    bad = {"Authorization": "Bearer spotrun_0123456789ab_nope"}
    with team.client(None) as c:
        codes = [c.get("/api/v1/jobs", headers=bad).status_code for _ in range(6)]
        assert codes[-1] == 429 and 401 in codes
        r = c.get("/api/v1/whoami", headers={"Authorization": f"Bearer {team.tokens['ada']}"})
        assert r.status_code == 429 and int(r.headers["Retry-After"]) > 0
        team.clock[0] += 61
        r = c.get("/api/v1/whoami", headers={"Authorization": f"Bearer {team.tokens['ada']}"})
        assert r.status_code == 200


def test_with_no_remote_the_cli_stays_local(team: Team) -> None:
    res = team.cli("alice", "status", "--json")
    assert res.returncode == 0 and json.loads(res.stdout) == [], res.stderr
    res = team.cli("alice", "login", team.url, "--token", team.tokens["alice"])
    assert res.returncode == 0
    res = team.cli("alice", "--local", "status", "--json")
    assert res.returncode == 0 and json.loads(res.stdout) == []
    res = team.cli("alice", "logout")
    assert res.returncode == 0 and "logged out" in res.stdout
