"""Submit, --dry-run and plan through the team server: the laptop packs and streams, the
server checks the bundle (size, every member), stores it and records the caller as owner."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import httpx
from sqlmodel import select

from spotrun import layout
from spotrun.backends.wire import SUBMIT_TYPE
from spotrun.config import load_settings
from spotrun.db import Job, session
from spotrun.store import open_store

from server.harness import Team, one_line_exit_2

SPEC = ("name: {name}\ncommand: python train.py\nworkdir: code\n"
        "work: {{reference_hours: 1.0, reference_instance: p3.2xlarge}}\n")


def _spec(team: Team, user: str, name: str) -> Path:
    """A spec with a workdir on user's laptop; returns the spec file."""
    folder = team.laptop(user) / name
    (folder / "code").mkdir(parents=True)
    (folder / "code" / "train.py").write_text(f"print('{name}')\n")
    path = folder / "job.yaml"
    path.write_text(SPEC.format(name=name))
    return path


def _jobs(team: Team) -> dict[str, str]:
    with session(team.engine) as s:
        return {j.id: j.owner for j in s.exec(select(Job))}



def test_submit_streams_the_bundle_and_owns_the_job_as_the_caller(team: Team) -> None:
    team.login("alice", "bob", "vera", "ada")
    res = team.cli("alice", "submit", str(_spec(team, "alice", "ja")), "--json")
    assert res.returncode == 0, res.stderr
    job = json.loads(res.stdout)
    assert (job["owner"], job["state"], job["name"]) == ("alice", "queued", "ja")
    # the bundle is in the server's store; the laptop has no home and no credentials
    store = open_store(load_settings(str(team.home)).store_url)
    with session(team.engine) as s:
        row = s.get(Job, job["id"])
    assert row.bundle_key == layout.bundle_key(job["id"])
    with tarfile.open(fileobj=io.BytesIO(store.get_bytes(row.bundle_key))) as tar:
        assert tar.getnames() == ["train.py"]
    assert not (team.laptop("alice") / ".spotrun").exists()
    res = team.cli("bob", "submit", str(_spec(team, "bob", "jb")))
    assert res.returncode == 0, res.stderr
    assert _jobs(team)[res.stdout.strip()] == "bob"
    # another owner: members 403, admins may; viewers cannot submit at all
    one_line_exit_2(team.cli("alice", "submit", str(_spec(team, "alice", "jc")), "--owner",
                              "bob"), "--owner", "only an admin")
    one_line_exit_2(team.cli("vera", "submit", str(_spec(team, "vera", "jv"))),
                     "role member")
    res = team.cli("ada", "submit", str(_spec(team, "ada", "jd")), "--owner", "bob")
    assert res.returncode == 0 and _jobs(team)[res.stdout.strip()] == "bob", res.stderr
    assert sorted(_jobs(team).values()) == ["alice", "bob", "bob"]
    # the trail has every submit; audit --by owner names the authenticated users
    rows = json.loads(team.cli("ada", "trail", "--json").stdout)
    got = {(r["user"], r["action"], r["outcome"]) for r in rows}
    assert {("alice", "submit", "ok"), ("bob", "submit", "ok"), ("ada", "submit", "ok"),
            ("vera", "POST /api/v1/jobs", "denied"),
            ("alice", "POST /api/v1/jobs", "denied")} <= got
    res = team.cli("ada", "audit", "--by", "owner", "--json")
    assert res.returncode == 0, res.stderr
    assert sorted(g["group"] for g in json.loads(res.stdout)) == ["alice", "bob"]


def test_dry_run_and_plan_go_through_the_server_and_write_nothing(team: Team) -> None:
    team.login("vera", "alice")
    spec = _spec(team, "alice", "jp")
    res = team.cli("alice", "submit", str(spec), "--dry-run", "--json")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert plan["name"] == "jp" and plan["candidates"], plan
    res = team.cli("alice", "submit", str(spec), "--dry-run")
    assert res.returncode == 0 and "nothing was written" in res.stdout, res.stderr
    res = team.cli("vera", "plan", str(spec), "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["candidates"][0]["instance_type"] == \
        plan["candidates"][0]["instance_type"]
    res = team.cli("vera", "plan", str(spec))
    assert res.returncode == 0 and "decided on the team server" in res.stdout, res.stderr
    bad = spec.parent / "bad.yaml"
    bad.write_text("name: x\ncommand: c\nresources: {instance_types: [no.such]}\n")
    one_line_exit_2(team.cli("vera", "plan", str(bad)), "no.such")
    assert _jobs(team) == {}
    assert not any(r["action"] == "submit" for r in
                   __import__("spotrun.db.trail", fromlist=["x"]).trail_view(team.engine))


def _raw_submit(team: Team, user: str, spec: str, bundle: bytes) -> httpx.Response:
    body = json.dumps({"spec_file": "job.yaml", "spec": spec}).encode() + b"\n" + bundle
    with team.client(user) as c:
        return c.post("/api/v1/jobs", content=body, headers={"Content-Type": SUBMIT_TYPE})


def _tar(*members: tuple[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_a_bad_bundle_is_refused_naming_the_member_and_nothing_is_written(team: Team) -> None:
    spec = "name: evil\ncommand: python x.py\nworkdir: code\n"
    for member in ("../escape.py", "/etc/cron.d/x"):
        r = _raw_submit(team, "alice", spec, _tar(("ok.py", b"1"), (member, b"2")))
        assert r.status_code == 422 and member.lstrip("/") in r.json()["error"], r.json()
        assert r.json()["field"] == "bundle"
    link = io.BytesIO()
    with tarfile.open(fileobj=link, mode="w:gz") as tar:
        info = tarfile.TarInfo("data")
        info.type, info.linkname = tarfile.SYMTYPE, "/home/server/.ssh"
        tar.addfile(info)
    r = _raw_submit(team, "alice", spec, link.getvalue())
    assert r.status_code == 422 and "data -> /home/server/.ssh" in r.json()["error"]
    assert _jobs(team) == {}
    store_dir = Path(load_settings(str(team.home)).store_url.removeprefix("file://"))
    assert not store_dir.exists() or not any(p.is_file() for p in store_dir.rglob("*"))
    assert not (team.home.parent / "escape.py").exists()


def test_a_bundle_over_the_limit_is_refused_naming_the_setting(team: Team) -> None:
    team.app.state.settings = load_settings(str(team.home),
                                            overrides={"server.max_bundle_mb": 0.01})
    team.login("alice")
    spec = _spec(team, "alice", "big")
    (spec.parent / "code" / "weights.bin").write_bytes(__import__("os").urandom(64 * 1024))
    line = one_line_exit_2(team.cli("alice", "submit", str(spec)), "server.max_bundle_mb",
                            "at most 0.01 MB")
    assert "Traceback" not in line
    # a chunked body (no declared length) is cut off as it streams
    def body():
        yield json.dumps({"spec_file": "j.yaml", "spec": SPEC.format(name="big")}).encode()
        yield b"\n"
        for _ in range(8):
            yield b"x" * 4096
    with team.client("alice") as c:
        r = c.post("/api/v1/jobs", content=body(), headers={"Content-Type": SUBMIT_TYPE})
    assert r.status_code == 413 and r.json()["field"] == "server.max_bundle_mb"
    assert _jobs(team) == {}
