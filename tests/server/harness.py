"""A real team server for tests: uvicorn on 127.0.0.1 (a free port) in a thread, over a real
SQLite home, polled with a deadline until it answers; users alice, bob (members), vera
(viewer) and ada (admin) with their tokens; jobs owned by alice and bob."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import httpx
import uvicorn

from spotrun.config import load_settings
from spotrun.db import Job, open_db, session
from spotrun.server import identity
from spotrun.server.app import create_app
from spotrun.server.auth import Limiter
from spotrun.states import JobState

from polling import wait_for
from test_ledger_support import make_job

USERS = {"alice": "member", "bob": "member", "vera": "viewer", "ada": "admin"}


@dataclass
class Team:
    """The running server and what the tests need of it."""

    home: Path
    url: str
    tokens: dict[str, str]
    engine: Any
    tmp: Path
    app: Any = None
    clock: list[float] = field(default_factory=lambda: [0.0])

    def client(self, user: str | None) -> httpx.Client:
        """An HTTP client with user's token (None: no token)."""
        headers = {"Authorization": f"Bearer {self.tokens[user]}"} if user else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def cli(self, user: str, *args: str, login: bool = True) -> subprocess.CompletedProcess:
        """`spotrun ARGS` as a real process in user's own HOME and config dir (no SPOTRUN_HOME)."""
        home = self.tmp / f"laptop-{user}"
        # A laptop: no spotrun home and no cloud credentials (the server has the store).
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SPOTRUN_", "AWS_", "GOOGLE_"))}
        env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), COLUMNS="200")
        home.mkdir(exist_ok=True)
        return subprocess.run([sys.executable, "-m", "spotrun", *args], env=env, cwd=home,
                              capture_output=True, text=True, timeout=120)

    def laptop(self, user: str) -> Path:
        """user's HOME for cli()."""
        (self.tmp / f"laptop-{user}").mkdir(exist_ok=True)
        return self.tmp / f"laptop-{user}"

    def login(self, *users: str) -> None:
        """`spotrun login` for each user (asserting it worked)."""
        for user in users:
            res = self.cli(user, "login", self.url, "--token", self.tokens[user])
            assert res.returncode == 0, res.stderr


def add_job(engine: Any, job_id: str, owner: str, state: JobState = JobState.QUEUED) -> None:
    """A job row owned by owner."""
    make_job(engine, job_id, state=state)
    with session(engine) as s:
        job = s.get(Job, job_id)
        job.owner = owner
        s.add(job)
        s.commit()


def start_team(tmp: Path, *, max_failures: int = 5, settings: Any = None,
               provider: Any = None) -> Iterator[Team]:
    """Yield a Team whose server stops when the generator is closed (settings: serve that
    home, e.g. a daemon rig's, instead of a new one; provider: the rig's)."""
    if settings is None:
        home = tmp / "server-home"
        home.mkdir()
        settings = load_settings(str(home))
    home = settings.home_path
    engine = open_db(settings.database_url)
    tokens = {name: identity.add_user(engine, name, role) for name, role in USERS.items()}
    clock = [0.0]
    app = create_app(settings, engine=engine, provider=provider,
                     limiter=Limiter(max_failures=max_failures, window_s=60,
                                     clock=lambda: clock[0]))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            return httpx.get(url + "/api/v1/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False
    try:
        wait_for(answers, timeout_s=30, what="the team server to answer")
        yield Team(home=home, url=url, tokens=tokens, engine=engine, tmp=tmp, app=app,
                   clock=clock)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def one_line_exit_2(res: subprocess.CompletedProcess, *words: str) -> str:
    """Assert a CLI call failed as bad input does: exit 2, one line on stderr holding words."""
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]
