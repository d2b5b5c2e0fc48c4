"""`spotrun doctor` against moto: what is fine, what to fix, what it could not check."""

from __future__ import annotations

import json

from click.testing import CliRunner

from spotrun.aws_clients import make_client
from spotrun.cli import cli

from .conftest import make_instance_profile


def _write_toml(home, settings, **over):
    aws = settings.aws
    vals = {"ami_id": aws.ami_id, "subnets": list(aws.subnets),
            "security_group_ids": list(aws.security_group_ids),
            "instance_profile_arn": aws.instance_profile_arn, "endpoint_url": aws.endpoint_url,
            "spot_advisor_url": ""}
    vals.update(over)
    lines = ['provider = "aws"', f'store_uri = "{over.pop("store", "s3://doctor-bkt/spotrun")}"',
             "[aws]"]
    vals.pop("store", None)
    lines += [f"{k} = {json.dumps(v)}" for k, v in vals.items()]
    home.mkdir(parents=True, exist_ok=True)
    (home / "spotrun.toml").write_text("\n".join(lines) + "\n")


def _doctor(home, monkeypatch):
    monkeypatch.setenv("SPOTRUN_HOME", str(home))
    res = CliRunner().invoke(cli, ["doctor", "--json"])
    return res.exit_code, {c["name"]: c for c in json.loads(res.output)["checks"]}


def test_doctor_all_good_except_what_moto_cannot_answer(aws_settings, moto, tmp_path,
                                                         monkeypatch):
    arn = make_instance_profile(moto)
    make_client("s3", region="us-east-1", endpoint_url=moto.url).create_bucket(
        Bucket="doctor-bkt")
    _write_toml(tmp_path / "h", aws_settings, instance_profile_arn=arn)
    code, checks = _doctor(tmp_path / "h", monkeypatch)
    assert code == 0, checks
    for name in ("credentials", "region", "ami", "subnets", "security groups",
                 "instance profile", "store"):
        assert checks[name]["status"] == "ok", checks[name]
    # moto has no EC2 service quotas: said, not guessed.
    quota = [c for n, c in checks.items() if n.startswith("spot quota")]
    assert quota and all(c["status"] == "could-not-check" for c in quota)


def test_doctor_says_what_to_fix(aws_settings, moto, tmp_path, monkeypatch):
    wrong = [s.replace("us-east-1a=", "us-east-1c=X").replace("X", "")
             for s in aws_settings.aws.subnets if s.startswith("us-east-1a=")]
    windows = make_client("ec2", region="us-east-1", endpoint_url=moto.url).describe_images(
        Owners=["amazon"], Filters=[{"Name": "name", "Values": ["Windows*"]}])["Images"][0]
    _write_toml(tmp_path / "h", aws_settings, ami_id=windows["ImageId"], subnets=wrong,
                security_group_ids=["sg-0000000000000000f"],
                instance_profile_arn="arn:aws:iam::123456789012:instance-profile/nope")
    code, checks = _doctor(tmp_path / "h", monkeypatch)
    assert code == 1
    for name in ("ami", "subnets", "security groups", "instance profile", "store"):
        assert checks[name]["status"] == "fix", checks[name]
    assert "us-east-1c=" in checks["subnets"]["detail"]
    assert "doctor-bkt" in checks["store"]["detail"]


def test_doctor_checks_every_cloud_and_names_the_one_that_fails(aws_settings, moto, tmp_path,
                                                                monkeypatch):
    """Several clouds (docs/clouds.md): each cloud's checks, named for it; a cloud whose
    credentials are refused is reported, not a crash."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Refuse(BaseHTTPRequestHandler):
        """GCP's answer to bad credentials: 401 for every call."""

        def _refuse(self) -> None:
            body = b'{"error": {"code": 401, "message": "Request had invalid authentication'\
                   b' credentials.", "status": "UNAUTHENTICATED"}}'
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _refuse

        def log_message(self, *args) -> None:
            pass

    make_client("s3", region="us-east-1", endpoint_url=moto.url).create_bucket(
        Bucket="doctor-bkt")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    dead = f"http://127.0.0.1:{server.server_address[1]}"
    home = tmp_path / "h"
    _write_toml(home, aws_settings)
    text = (home / "spotrun.toml").read_text().replace('provider = "aws"',
                                                       'providers = ["aws", "gcp"]')
    (home / "spotrun.toml").write_text(
        text + f'[gcp]\nproject = "p"\nendpoint_url = "{dead}"\n'
               'store_uri = "gs://doctor-bkt/spotrun"\noperation_timeout_s = 2.0\n')
    monkeypatch.setenv("SPOTRUN_HOME", str(home))
    res = CliRunner().invoke(cli, ["doctor", "--json"])
    assert "Traceback" not in res.output
    out = json.loads(res.output)
    assert out["providers"] == ["aws", "gcp"]
    names = [c["name"] for c in out["checks"]]
    assert any(n.startswith("aws: ") for n in names) and any(n.startswith("gcp: ")
                                                             for n in names)
    assert {c["status"] for c in out["checks"] if c["name"] == "aws: ami"} == {"ok"}
    gcp = [c for c in out["checks"] if c["name"].startswith("gcp: ")]
    assert any(c["status"] != "ok" for c in gcp), gcp
    assert res.exit_code in (0, 1)
    server.shutdown()
