"""Fixtures for the GCP tests: the fake Compute Engine on 127.0.0.1 and settings pointing at it."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from spotrun.config import Settings, load_settings

from .compute_state import ComputeState
from .fake_compute import FakeCompute

IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cu124"
# GCE_METADATA_HOST etc. point nowhere real: a test never reaches Google.
FAKE_ENV = {"GOOGLE_CLOUD_PROJECT": "spotrun-test", "GCE_METADATA_IP": "127.0.0.1:9",
            "NO_GCE_CHECK": "True"}


@pytest.fixture
def gce() -> Iterator[FakeCompute]:
    """A fake Compute Engine (us-central1-a/b/c) whose preemptions last 1 s."""
    fake = FakeCompute(ComputeState(window_s=1.0)).start()
    try:
        yield fake
    finally:
        fake.stop()


def gcp_settings(fake: FakeCompute, home: str, extra: dict[str, Any] | None = None) -> Settings:
    """Settings for the gcp provider on the fake (its project, region and zones)."""
    return load_settings(home, {
        "provider": "gcp", "gcp.project": fake.state.project, "gcp.region": fake.state.region,
        "gcp.zones": list(fake.state.zones), "gcp.endpoint_url": fake.url, "gcp.image": IMAGE,
        "gcp.spotrun_install": "spotrun==0.1.0", "gcp.operation_timeout_s": 20.0,
        **(extra or {})})
