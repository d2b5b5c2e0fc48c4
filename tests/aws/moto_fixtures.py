"""One moto server per test session on a free 127.0.0.1 port, behind the fault layer.

moto runs in this process (a werkzeug thread) so tests can change its backend state
the way AWS would on its own: a spot reclaim, an instance shutting itself down.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from dataclasses import dataclass
from typing import Any, Iterator

import pytest

from .moto_layer import FaultLayer

ACCOUNT = "123456789012"
REGION = "us-east-1"
FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SECURITY_TOKEN": "testing", "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION,
    "AWS_CONFIG_FILE": "/nonexistent/spotrun-test-aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/spotrun-test-aws-credentials",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def _ec2_backend() -> Any:
    from moto.ec2.models import ec2_backends
    return ec2_backends[ACCOUNT][REGION]


@dataclass
class MotoServer:
    """A running moto server and its fault layer."""

    url: str
    layer: FaultLayer
    server: Any
    thread: threading.Thread

    def reset(self, *, everything: bool = False) -> None:
        """Wipe moto's EC2 and S3 state (or all of it, via moto's reset API) and the layer's.

        IAM is left alone by default: rebuilding its managed policies costs ~2 s a test;
        tests that touch IAM use unique names instead.
        """
        if everything:
            req = urllib.request.Request(f"{self.url}/moto-api/reset", data=b"",
                                         method="POST")
            with urllib.request.urlopen(req, timeout=10) as resp:
                json.loads(resp.read())
        else:
            from moto.core.base_backend import backend_lock
            from moto.ec2.models import ec2_backends
            from moto.s3.models import s3_backends
            with backend_lock:
                # reset() re-runs the backend's __init__: default VPC and AMIs come back.
                ec2_backends[ACCOUNT][REGION].reset()
                s3_backends[ACCOUNT]["aws"].reset()
                from moto.fis.models import fis_backends
                fis_backends[ACCOUNT][REGION].reset()
        self.layer.reset()

    def stop(self) -> None:
        """Shut the server down."""
        self.server.shutdown()
        self.thread.join(timeout=10)

    # ------------------------------------------------ what AWS does on its own

    def reclaim(self, instance_id: str) -> None:
        """Terminate as EC2 reclaiming a spot instance does (Server.SpotInstanceTermination)."""
        _reclaim(instance_id)

    def shutdown_from_inside(self, instance_id: str) -> None:
        """Terminate as `shutdown -h now` on an instance with shutdown behaviour terminate."""
        from moto.ec2.models.instances import StateReason
        inst = _ec2_backend().get_instance(instance_id)
        inst.terminate()
        inst.state_reason = StateReason(
            "Client.InstanceInitiatedShutdown: Instance initiated shutdown",
            "Client.InstanceInitiatedShutdown")

    def backdate_launch(self, instance_id: str, seconds: float) -> None:
        """The instance was launched `seconds` earlier (a test cannot wait an hour to bill)."""
        from datetime import timedelta
        inst = _ec2_backend().get_instance(instance_id)
        inst.launch_time = inst.launch_time - timedelta(seconds=seconds)

    def instance_attr(self, instance_id: str, name: str) -> Any:
        """An attribute of moto's in-process instance (e.g. 'lifecycle')."""
        return getattr(_ec2_backend().get_instance(instance_id), name)


def _reclaim(instance_id: str) -> None:
    from moto.core.base_backend import backend_lock
    from moto.ec2.models.instances import StateReason
    with backend_lock:
        inst = _ec2_backend().get_instance(instance_id)
        if inst.state == "terminated":
            return
        inst.terminate()
        inst._reason = "Server.SpotInstanceTermination"
        inst.state_reason = StateReason(
            "Server.SpotInstanceTermination: Spot instance termination",
            "Server.SpotInstanceTermination")


def moto_settings(moto: MotoServer, ec2: Any, home: str,
                  overrides: dict[str, Any] | None = None) -> Any:
    """Settings for the aws provider on moto: default subnets in 1a-1c, an AMI, fast retries."""
    from spotrun.config import load_settings
    subnets = [f"{s['AvailabilityZone']}={s['SubnetId']}"
               for s in ec2.describe_subnets()["Subnets"]
               if s["AvailabilityZone"] in ("us-east-1a", "us-east-1b", "us-east-1c")]
    ami = ec2.describe_images(Owners=["amazon"], Filters=[
        {"Name": "name", "Values": ["Deep Learning AMI*"]}])["Images"][0]["ImageId"]
    sg = ec2.describe_security_groups()["SecurityGroups"][0]["GroupId"]
    return load_settings(home, {
        "provider": "aws", "aws.endpoint_url": moto.url, "aws.ami_id": ami,
        "aws.subnets": subnets, "aws.security_group_ids": [sg], "aws.key_name": "",
        "aws.instance_profile_arn": "",
        "aws.spotrun_install": "spotrun==0.1.0", "aws.volume_size_gb": 50,
        "aws.retry_base_s": 0.001, "aws.retry_max_s": 0.01, "aws.retry_attempts": 4,
        "aws.spot_advisor_url": "",   # tests reach only 127.0.0.1; risk tests serve one there
        **(overrides or {})})


def start_moto() -> MotoServer:
    """Start moto + the fault layer on 127.0.0.1, port chosen by the OS."""
    from moto.moto_server.werkzeug_app import (DomainDispatcherApplication,
                                               MotoRequestHandler, create_backend_app)
    from werkzeug.serving import make_server

    def zone_of_subnet(subnet_id: str) -> str:
        try:
            return _ec2_backend().get_subnet(subnet_id).availability_zone
        except Exception:  # noqa: BLE001 - an unknown subnet has no zone
            return ""

    class QuietHandler(MotoRequestHandler):
        def log_request(self, *args: Any, **kw: Any) -> None:  # one line per call is noise
            pass

    layer = FaultLayer(DomainDispatcherApplication(create_backend_app), zone_of_subnet,
                       reclaim=_reclaim)
    server = make_server("127.0.0.1", 0, layer, threaded=True, request_handler=QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="moto", daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    return MotoServer(url=f"http://{host}:{port}", layer=layer, server=server, thread=thread)


_shared: list[MotoServer] = []


@pytest.fixture(scope="session")
def moto_server() -> MotoServer:
    """The session's one moto server, started on first use (a daemon thread).

    A module-level singleton, because this fixture is imported by more than one test
    module and each import would otherwise be its own session fixture.
    """
    if not _shared:
        _shared.append(start_moto())
    return _shared[0]


@pytest.fixture
def moto(moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[MotoServer]:
    """Fresh moto state for one test; boto3 in this process and its children targets it."""
    for k, v in FAKE_ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server.url)
    moto_server.reset()
    yield moto_server
    moto_server.layer.reset()
