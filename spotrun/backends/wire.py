"""The submit body both ends agree on (client: spotrun.backends.transfer, server:
spotrun.server.routes_submit).

One streamed request, no multipart: a first line of JSON (`{"spec_file", "spec"}`, the
spec's YAML as text) ended by a newline, then the workdir's tar.gz bytes to the end (none
when the spec has no workdir). A plain body needs no multipart parser on the server, and
the server can count the bundle's bytes as they arrive and stop at its limit instead of
spooling a whole multipart part first.
"""

from __future__ import annotations

SUBMIT_TYPE = "application/x-spotrun-submission"
HEAD_MAX_BYTES = 1 << 20          # the JSON line: a spec file is far smaller
PULL_SUMMARY = ".spotrun-pull.json"   # first member of a pull archive: what pull --json prints
MB = 1024 * 1024
