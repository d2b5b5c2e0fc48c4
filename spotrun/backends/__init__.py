"""Where the CLI's verbs act: the local state database, or a team server over HTTP.

One seam: the verbs that work remotely take a `Backend` and render what it returns with the
same code either way; which one is chosen once per invocation (`choose`, docs/server.md).
"""

from __future__ import annotations

import os

from spotrun.backends.base import Backend, Cancelled, Progress, Submitted  # noqa: F401
from spotrun.backends.remote_config import load_remote


def remote_wanted(local: bool) -> bool:
    """Whether verbs go to the server: a remote is stored (`spotrun login`), and neither
    `--local` nor an explicit SPOTRUN_HOME asks for a local home."""
    return not local and not os.environ.get("SPOTRUN_HOME") and load_remote() is not None


def choose(local: bool = False) -> Backend:
    """The backend for this invocation (see remote_wanted)."""
    if remote_wanted(local):
        # lazy: start-up cost (httpx), paid only by a CLI that talks to a server
        from spotrun.backends.remote import RemoteBackend
        remote = load_remote()
        assert remote is not None
        return RemoteBackend(remote.url, remote.token)
    from spotrun.backends.local import LocalBackend
    return LocalBackend()
