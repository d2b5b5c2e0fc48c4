"""`spotrun doctor` checks for AWS: each says ok, what to fix, or that it could not check."""

from __future__ import annotations

from typing import Any, Callable
from urllib.parse import urlparse

from spotrun.aws_clients import RetryPolicy, error_code, make_client
from spotrun.catalog import load_catalog
from spotrun.providers.checks import Check, Status, run_check
from spotrun.providers.aws.launch import LaunchConfig

# Service Quotas codes of the spot vCPU limits, per instance family (first letters).
SPOT_QUOTAS = {
    "g": ("L-3819A6DF", "All G and VT Spot Instance Requests"),
    "p3": ("L-7212CCBC", "All P4, P3 and P2 Spot Instance Requests"),
    "p4": ("L-7212CCBC", "All P4, P3 and P2 Spot Instance Requests"),
    "p5": ("L-C4BD4855", "All P5 Spot Instance Requests"),
}
GPU_AMI_WORDS = ("deep learning", "gpu", "nvidia", "cuda", "neuron")


def _family(instance_type: str) -> str:
    head = instance_type.split(".", 1)[0]
    return head[:2] if head.startswith("p") else head[:1]


class AwsDoctor:
    """Runs the checks with injected clients (ec2, sts, iam, s3, service-quotas)."""

    def __init__(self, settings: Any, clients: dict[str, Any] | None = None) -> None:
        self.settings = settings
        self.retry = RetryPolicy(attempts=2, base_s=0.2, max_s=1.0)
        self._clients = dict(clients or {})

    def client(self, service: str) -> Any:
        """A client per service, built once."""
        if service not in self._clients:
            self._clients[service] = make_client(service, region=self.settings.region,
                                                 endpoint_url=self.settings.aws.endpoint_url,
                                                 retry=self.retry)
        return self._clients[service]

    def _run(self, name: str, fn: Callable[[], Check | list[Check]]) -> list[Check]:
        return run_check(name, fn, error_code)

    def run(self) -> list[Check]:
        """All checks, in order; later ones still run when earlier ones fail."""
        checks = self._run("credentials", self.credentials)
        if checks[0].status is not Status.OK:
            return checks + [Check("remaining", Status.UNKNOWN, "needs working credentials")]
        for name, fn in (("region", self.region), ("spot quota", self.quotas),
                         ("ami", self.ami), ("subnets", self.subnets),
                         ("security groups", self.security_groups),
                         ("instance profile", self.instance_profile), ("store", self.store)):
            checks += self._run(name, fn)
        return checks

    def credentials(self) -> Check:
        """Who are we."""
        ident = self.client("sts").get_caller_identity()
        return Check("credentials", Status.OK, f"account {ident['Account']} as {ident['Arn']}")

    def region(self) -> Check:
        """The region answers and has zones."""
        zones = self.client("ec2").describe_availability_zones()
        names = sorted(z["ZoneName"] for z in zones.get("AvailabilityZones", []))
        if not names:
            return Check("region", Status.FIX, f"{self.settings.region} lists no zones")
        return Check("region", Status.OK, f"{self.settings.region}: {', '.join(names)}")

    def quotas(self) -> list[Check]:
        """Spot vCPU quota per GPU family, against the largest catalog type of the family."""
        need: dict[str, tuple[str, int]] = {}
        for t in load_catalog("aws").types.values():
            fam = _family(t.name)
            if fam in SPOT_QUOTAS and t.vcpus > need.get(fam, ("", 0))[1]:
                need[fam] = (t.name, t.vcpus)
        out: list[Check] = []
        for fam, (biggest, vcpus) in sorted(need.items()):
            code, label = SPOT_QUOTAS[fam]
            name = f"spot quota {fam}*"
            try:
                q = self.client("service-quotas").get_service_quota(
                    ServiceCode="ec2", QuotaCode=code)
            except Exception as exc:  # noqa: BLE001
                out.append(Check(name, Status.UNKNOWN,
                                 f"{label} ({code}): {error_code(exc) or type(exc).__name__}"))
                continue
            value = float(q["Quota"]["Value"])
            if value < vcpus:
                out.append(Check(name, Status.FIX, f"{label} is {value:g} vCPUs; {biggest} "
                                 f"needs {vcpus}: request an increase of {code}"))
            else:
                out.append(Check(name, Status.OK, f"{label}: {value:g} vCPUs"))
        return out

    def ami(self) -> Check:
        """The AMI exists and looks like it has NVIDIA drivers."""
        ami = self.settings.aws.ami_id
        if not ami:
            return Check("ami", Status.FIX, "set aws.ami_id (e.g. an AWS Deep Learning AMI)")
        try:
            images = self.client("ec2").describe_images(ImageIds=[ami])["Images"]
        except Exception as exc:
            if "InvalidAMIID" in error_code(exc):
                images = []
            else:
                raise
        if not images:
            return Check("ami", Status.FIX, f"{ami} does not exist in {self.settings.region}")
        text = f"{images[0].get('Name', '')} {images[0].get('Description', '')}".lower()
        if not any(w in text for w in GPU_AMI_WORDS):
            return Check("ami", Status.FIX, f"{ami} ({images[0].get('Name')}) shows no GPU "
                         "drivers; use a Deep Learning AMI or install NVIDIA drivers")
        return Check("ami", Status.OK, f"{ami}: {images[0].get('Name')}")

    def subnets(self) -> Check:
        """Configured subnets exist, in the zones they are listed under."""
        cfg = LaunchConfig.from_settings(self.settings.aws)
        if not cfg.subnets:
            return Check("subnets", Status.OK, "none set: the default VPC's subnet per zone")
        found = self.client("ec2").describe_subnets(
            Filters=[{"Name": "subnet-id", "Values": list(cfg.subnets.values())}])
        zone_of = {s["SubnetId"]: s["AvailabilityZone"] for s in found.get("Subnets", [])}
        bad = [f"{z}={s}" + (" (missing)" if s not in zone_of else f" (is in {zone_of[s]})")
               for z, s in cfg.subnets.items() if zone_of.get(s) != z]
        if bad:
            return Check("subnets", Status.FIX, "fix aws.subnets: " + ", ".join(bad))
        return Check("subnets", Status.OK, ", ".join(sorted(cfg.subnets)))

    def security_groups(self) -> Check:
        """Configured security groups exist."""
        ids = list(self.settings.aws.security_group_ids)
        if not ids:
            return Check("security groups", Status.OK, "none set: the VPC's default group")
        found = self.client("ec2").describe_security_groups(
            Filters=[{"Name": "group-id", "Values": ids}])
        have = {g["GroupId"] for g in found.get("SecurityGroups", [])}
        missing = [g for g in ids if g not in have]
        if missing:
            return Check("security groups", Status.FIX,
                         f"missing: {', '.join(missing)}; fix aws.security_group_ids")
        return Check("security groups", Status.OK, ", ".join(ids))

    def instance_profile(self) -> Check:
        """The instance profile exists and carries a role."""
        arn = self.settings.aws.instance_profile_arn
        if not arn:
            return Check("instance profile", Status.FIX, "set aws.instance_profile_arn: the "
                         "agent needs a role to reach the store (see docs/aws.md)")
        name = arn.rsplit("/", 1)[-1]
        try:
            prof = self.client("iam").get_instance_profile(
                InstanceProfileName=name)["InstanceProfile"]
        except Exception as exc:
            if error_code(exc) == "NoSuchEntity":
                return Check("instance profile", Status.FIX, f"{name} does not exist")
            raise
        if not prof.get("Roles"):
            return Check("instance profile", Status.FIX, f"{name} has no role attached")
        return Check("instance profile", Status.OK,
                     f"{name} with role {prof['Roles'][0]['RoleName']}")

    def store(self) -> Check:
        """The daemon's s3 bucket answers."""
        uri = self.settings.store_url
        parsed = urlparse(uri)
        if parsed.scheme != "s3":
            return Check("store", Status.FIX, f"{uri} is not on S3: instances cannot reach "
                         "it; set store_uri = \"s3://bucket/prefix\"")
        try:
            self.client("s3").head_bucket(Bucket=parsed.netloc)
        except Exception as exc:
            if error_code(exc) in ("404", "NoSuchBucket", "403", "AccessDenied"):
                return Check("store", Status.FIX, f"bucket {parsed.netloc}: "
                             f"{error_code(exc)}; create it or grant access")
            raise
        return Check("store", Status.OK, f"{uri} reachable")
