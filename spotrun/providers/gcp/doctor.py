"""`spotrun doctor` checks for GCP: each says ok, what to fix, or that it could not check.

What a project needs (docs/gcp.md): the settings (`[gcp] project`, `image`, zones of the
region), credentials (Application Default Credentials), the Compute Engine API enabled, and
GPU quota for Spot VMs in the region: Spot VMs use the region's preemptible GPU quota
(`PREEMPTIBLE_NVIDIA_<GPU>_GPUS`) where it has one, else the standard `NVIDIA_<GPU>_GPUS`
(docs: Spot VMs, "Quotas").
"""

from __future__ import annotations

from typing import Any, Callable

from spotrun.catalog import load_catalog
from spotrun.providers.checks import Check, Status, run_check
from spotrun.providers.gcp import ZONES, zones_of
from spotrun.providers.gcp.ops import Clients, error_code

# Accelerator type -> the GPU name in its quota metrics.
QUOTA_GPU = {"nvidia-tesla-a100": "A100", "nvidia-a100-80gb": "A100_80GB",
             "nvidia-h100-80gb": "H100", "nvidia-l4": "L4", "nvidia-tesla-t4": "T4",
             "nvidia-tesla-v100": "V100", "nvidia-tesla-p100": "P100"}


class GcpDoctor:
    """Runs the checks (clients may be injected: tests point them at the fake)."""

    def __init__(self, settings: Any, clients: Clients | None = None) -> None:
        self.settings = settings
        self.gcp = settings.gcp
        self.clients = clients or Clients(self.gcp.endpoint_url)

    def _run(self, name: str, fn: Callable[[], Check | list[Check]]) -> list[Check]:
        return run_check(name, fn, error_code)

    def run(self) -> list[Check]:
        """All checks, in order; later ones still run when earlier ones fail."""
        out = self._run("settings", self.check_settings)
        creds = self._run("credentials", self.check_credentials)
        out += creds
        if creds[0].status is not Status.OK or not self.gcp.project:
            return out + [Check("compute api", Status.UNKNOWN,
                                "needs the project and credentials first")]
        api = self._run("compute api", self.check_api)
        out += api
        if api[0].status is Status.OK:
            out += self._run("spot gpu quota", self.check_quota)
        return out

    def check_settings(self) -> list[Check]:
        """project and image set; the zones in the region."""
        missing = [k for k in ("project", "image") if not getattr(self.gcp, k)]
        if missing:
            return [Check("settings", Status.FIX, "set " + ", ".join(f"gcp.{k}" for k in missing)
                          + " in spotrun.toml (docs/gcp.md)")]
        zones = zones_of(self.settings)
        if not zones:
            return [Check("settings", Status.FIX,
                          f"no zones for region {self.gcp.region!r}: set gcp.zones (known "
                          f"regions: {', '.join(ZONES)})")]
        off = [z for z in zones if not z.startswith(self.gcp.region + "-")]
        if off:
            return [Check("settings", Status.FIX, f"zones outside region {self.gcp.region}: "
                                                  f"{', '.join(off)}")]
        return [Check("settings", Status.OK, f"project {self.gcp.project}, "
                                             f"{len(zones)} zones in {self.gcp.region}")]

    def check_credentials(self) -> Check:
        """Application Default Credentials are found (anonymous against a fake endpoint)."""
        if self.gcp.endpoint_url:
            return Check("credentials", Status.OK, f"anonymous ({self.gcp.endpoint_url})")
        import google.auth
        from google.auth.exceptions import DefaultCredentialsError
        try:
            _, project = google.auth.default()
        except DefaultCredentialsError:
            return Check("credentials", Status.FIX, "no Application Default Credentials: run "
                                                    "`gcloud auth application-default login` or "
                                                    "set GOOGLE_APPLICATION_CREDENTIALS")
        return Check("credentials", Status.OK, f"found (default project {project or '-'})")

    def check_api(self) -> Check:
        """The Compute Engine API answers for the project."""
        try:
            self.clients.get("ProjectsClient").get(project=self.gcp.project)
        except Exception as exc:  # noqa: BLE001 - sorted into a fix or could-not-check
            code = error_code(exc)
            if code in ("accessNotConfigured", "SERVICE_DISABLED", "forbidden", "notFound"):
                return Check("compute api", Status.FIX,
                             f"{code}: enable compute.googleapis.com for project "
                             f"{self.gcp.project} and grant the caller "
                             "roles/compute.instanceAdmin.v1")
            raise
        return Check("compute api", Status.OK, f"project {self.gcp.project} answers")

    def check_quota(self) -> list[Check]:
        """GPU quota for Spot VMs in the region, per GPU the catalog launches there."""
        region = self.clients.get("RegionsClient").get(project=self.gcp.project,
                                                        region=self.gcp.region)
        limits = {q.metric: q.limit - q.usage for q in region.quotas}
        gpus = sorted({QUOTA_GPU.get(str(t.extra.get("accelerator")), "")
                       for t in load_catalog("gcp").types.values()} - {""})
        free = {g: max(limits.get(f"PREEMPTIBLE_NVIDIA_{g}_GPUS", 0.0),
                       limits.get(f"NVIDIA_{g}_GPUS", 0.0)) for g in gpus}
        some = {g: n for g, n in free.items() if n > 0}
        if not some:
            return [Check("spot gpu quota", Status.FIX,
                          f"no GPU quota free in {self.gcp.region}: request "
                          "PREEMPTIBLE_NVIDIA_<GPU>_GPUS (IAM & Admin > Quotas)")]
        return [Check("spot gpu quota", Status.OK,
                      ", ".join(f"{g} {n:g}" for g, n in sorted(some.items())))]
