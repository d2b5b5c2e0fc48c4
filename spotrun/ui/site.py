"""The dashboard's routes, data and assets, shared by both servers that serve it.

`spotrun ui` (stdlib http.server, spotrun.ui.server) and the team server (FastAPI,
spotrun.server.web) both call `match(path)` then `Match.reply(dashboard)`: one routing
table, one set of views, one set of vendored assets. Each route says who may see it
(`access`), so each server applies its own login rule before any view runs.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from importlib import resources
from typing import Any, Callable

from spotrun.contracts import json_default
from spotrun.daemon.health import live_loop_health
from spotrun.db import iter_jobs, jobs_by_ref, open_db, session
from spotrun.errors import NotFoundError
from spotrun.secrets import redact_tokens
from spotrun.ui import views
from spotrun.ui.metrics import render_metrics

STATIC_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                ".html": "text/html; charset=utf-8", ".md": "text/plain; charset=utf-8",
                ".png": "image/png", ".LICENSE": "text/plain; charset=utf-8"}
JSON_TYPE = "application/json; charset=utf-8"
# Who may see a route: ASSET and HEALTH need no login (vendored files, liveness); PAGE is
# the HTML shell (sent to the login page without one); DATA is what the pages read.
ASSET, HEALTH, PAGE, DATA = "asset", "health", "page", "data"


class Dashboard:
    """The data side of the server: settings, engine, and a cache for finished jobs' audits."""

    def __init__(self, settings: Any, engine: Any = None) -> None:
        self.settings = settings
        self.engine = engine if engine is not None else open_db(settings.database_url)
        self.reports = views.Reports()
        self._lock = threading.Lock()
        self._cache: dict[tuple, Any] = {}

    def _audits(self, job_ids: list[str] | None, hindsight: bool) -> list[Any]:
        """The jobs' audits (None: every job), those not kept audited together in one read;
        a finished job's is kept (its figures no longer change)."""
        with session(self.engine) as s:
            jobs = list(iter_jobs(s)) if job_ids is None else jobs_by_ref(s, job_ids)
        for job_id, job in zip(job_ids or [], jobs):
            if job is None:
                raise NotFoundError("no such job", field="JOB", value=job_id)
        keys = [(j.id, hindsight, j.updated_at, j.state.value) for j in jobs]
        with self._lock:
            todo = [j for j, k in zip(jobs, keys) if k not in self._cache]
            fresh = {a.id: a for a in views.audit_view(
                self.settings, hindsight=hindsight, reports=self.reports, engine=self.engine,
                jobs=todo)} if todo else {}
            out = []
            for j, key in zip(jobs, keys):
                result = self._cache[key] if key in self._cache else fresh[j.id]
                if j.state.is_terminal():
                    self._cache[key] = result
                out.append(result)
            return out

    def _audit(self, job_id: str, hindsight: bool) -> Any:
        """One job's audit (kept once the job is finished)."""
        return self._audits([job_id], hindsight)[0]

    def status(self, ref: str | None = None) -> Any:
        """= `spotrun status [JOB] --json`."""
        return views.status_view(self.settings, ref, reports=self.reports, engine=self.engine)

    def audit(self, ref: str | None = None, hindsight: bool = True) -> list[dict]:
        """= `spotrun audit [JOB] --json`."""
        ids = [self.status(ref)["id"]] if ref else None
        return [a.to_dict() for a in self._audits(ids, hindsight)]

    def budgets(self) -> list[dict]:
        """= `spotrun budgets --json`: spend against each project and owner budget."""
        return views.budgets_view(self.settings, engine=self.engine)

    def page(self, ref: str) -> dict:
        """The job page's data."""
        st = self.status(ref)
        return views.job_page(self.settings, st["id"], reports=self.reports, engine=self.engine,
                              audit=self._audit(st["id"], True))

    def metrics(self) -> str:
        """Prometheus text (of the status and audit figures it shows, nothing more is built)."""
        audits = [{"id": a.id, "actual_usd": a.actual_usd, "saved_usd": a.saved_usd,
                   "baseline_on_demand_usd": a.baseline_on_demand_usd,
                   "time_to_resume": [t.time_to_resume for t in a.attempts if t.time_to_resume]}
                  for a in self._audits(None, False)]
        return render_metrics(views.job_summaries(self.settings, engine=self.engine), audits,
                              self.reports.store, loops=live_loop_health(self.engine))


@dataclass(frozen=True)
class Reply:
    """What a route answers: status, body and its content type."""

    status: int
    body: bytes
    content_type: str


def json_reply(data: Any, status: int = 200) -> Reply:
    """data as the CLI's --json writes it."""
    return Reply(status, json.dumps(data, default=json_default).encode(), JSON_TYPE)


def error_reply(status: int, message: str) -> Reply:
    """`{"error": message}` with status."""
    return json_reply({"error": message}, status)


def static_file(name: str) -> Reply:
    """A vendored file from spotrun/ui/static (404 when there is none)."""
    try:
        body = resources.files("spotrun.ui").joinpath("static", name).read_bytes()
    except (FileNotFoundError, IsADirectoryError, OSError):
        return error_reply(404, "no such file")
    ext = "." + name.rsplit(".", 1)[-1]
    return Reply(200, body, STATIC_TYPES.get(ext, "application/octet-stream"))


View = Callable[[Dashboard, re.Match], Reply]
ROUTES: list[tuple[re.Pattern, str, View]] = [
    (re.compile(r"^/api/status/?$"), DATA, lambda d, m: json_reply(d.status())),
    (re.compile(r"^/api/status/([^/]+)$"), DATA, lambda d, m: json_reply(d.status(m[1]))),
    (re.compile(r"^/api/audit/?$"), DATA, lambda d, m: json_reply(d.audit())),
    (re.compile(r"^/api/audit/([^/]+)$"), DATA, lambda d, m: json_reply(d.audit(m[1]))),
    (re.compile(r"^/api/page/([^/]+)$"), DATA, lambda d, m: json_reply(d.page(m[1]))),
    (re.compile(r"^/api/budgets/?$"), DATA, lambda d, m: json_reply(d.budgets())),
    (re.compile(r"^/metrics$"), DATA,
     lambda d, m: Reply(200, d.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")),
    (re.compile(r"^/healthz$"), HEALTH,
     lambda d, m: Reply(200, b"ok\n", "text/plain; charset=utf-8")),
    (re.compile(r"^/(?:job/[^/]+)?$"), PAGE, lambda d, m: static_file("index.html")),
    (re.compile(r"^/static/([A-Za-z0-9_.-]+)$"), ASSET, lambda d, m: static_file(m[1])),
]


@dataclass(frozen=True)
class Match:
    """A path matched to a route: who may see it, and the view that answers it."""

    access: str
    view: View
    groups: re.Match

    def reply(self, dash: Dashboard) -> Reply:
        """Run the view; a missing job is 404 and a failing view 500 (never a dead server)."""
        try:
            return self.view(dash, self.groups)
        except NotFoundError as exc:
            return error_reply(404, str(exc))
        except Exception as exc:   # one failing view must not take the server down
            return error_reply(500, redact_tokens(str(exc))[:300])


def match(path: str) -> Match | None:
    """The route for path (no query string), or None."""
    for pattern, access, view in ROUTES:
        m = pattern.match(path)
        if m is not None:
            return Match(access, view, m)
    return None
