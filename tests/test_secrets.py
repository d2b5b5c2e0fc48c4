"""Secret resolution (env, SSM and Secrets Manager via real boto3 to moto on 127.0.0.1)
and streaming redaction."""

from __future__ import annotations

import pytest

from spotrun.errors import SecretError
from spotrun.secrets import Redactor, boto3_client_factory, parse_ref, resolve_secrets

SSM_VALUE = "ssm-value-93ab"
SM_VALUE = "sm-value-c0de"


@pytest.fixture(scope="module")
def moto_url():
    from moto.server import ThreadedMotoServer
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture()
def aws_clients(moto_url, monkeypatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_SESSION_TOKEN": "testing"}.items():
        monkeypatch.setenv(k, v)
    clients = boto3_client_factory("us-east-1", endpoint_url=moto_url)
    clients("ssm").put_parameter(Name="/team/hf-token", Value=SSM_VALUE, Type="SecureString",
                                 Overwrite=True)
    try:
        clients("secretsmanager").create_secret(Name="db-pass", SecretString=SM_VALUE)
    except clients("secretsmanager").exceptions.ResourceExistsException:
        pass
    return clients


def test_parse_ref_accepts_the_three_kinds_and_names_the_bad_one():
    assert parse_ref("A", "env:X") == ("env", "X")
    assert parse_ref("B", "ssm:/a/b") == ("ssm", "/a/b")
    assert parse_ref("C", "secretsmanager:name") == ("secretsmanager", "name")
    for bad in ("vault:x", "env:", "plain"):
        with pytest.raises(SecretError) as ei:
            parse_ref("TOKEN", bad)
        assert ei.value.field == "secrets.TOKEN"


def test_env_secrets_never_touch_aws():
    def no_clients(service):
        raise AssertionError(f"client for {service} built for an env secret")
    got = resolve_secrets({"A": "env:SRC_A", "B": "env:SRC_B"},
                          environ={"SRC_A": "1", "SRC_B": "two"}, clients=no_clients)
    assert got == {"A": "1", "B": "two"}


def test_missing_env_secret_names_the_secret_not_a_value():
    with pytest.raises(SecretError) as ei:
        resolve_secrets({"DB_PASS": "env:NOPE"}, environ={"OTHER": "hunter2"})
    assert "DB_PASS" in str(ei.value) and "hunter2" not in str(ei.value)


def test_ssm_and_secretsmanager_resolve_over_http(aws_clients):
    got = resolve_secrets({"HF": "ssm:/team/hf-token", "DB": "secretsmanager:db-pass"},
                          environ={}, clients=aws_clients)
    assert got == {"HF": SSM_VALUE, "DB": SM_VALUE}


@pytest.mark.parametrize("ref", ["ssm:/team/missing", "secretsmanager:missing"])
def test_unknown_aws_secret_raises_naming_it(aws_clients, ref):
    with pytest.raises(SecretError) as ei:
        resolve_secrets({"MISSING_ONE": ref}, environ={}, clients=aws_clients)
    msg = str(ei.value)
    assert "MISSING_ONE" in msg and SSM_VALUE not in msg and SM_VALUE not in msg


def _stream(redactor: Redactor, chunks: list[bytes]) -> bytes:
    return b"".join(redactor.feed(c) for c in chunks) + redactor.finish()


def test_redactor_catches_values_split_at_every_position():
    secret = b"tok-ABCDEF"
    text = b"head " + secret + b" middle " + secret + b" tail"
    for cut in range(1, len(text)):
        out = _stream(Redactor(["tok-ABCDEF"]), [text[:cut], text[cut:]])
        assert out == b"head *** middle *** tail", cut
    one_by_one = _stream(Redactor(["tok-ABCDEF"]), [bytes([b]) for b in text])
    assert one_by_one == b"head *** middle *** tail"


def test_redactor_holds_back_only_possible_prefixes():
    r = Redactor(["secret"])
    assert r.feed(b"a sec") == b"a "          # "sec" might start the secret
    assert r.feed(b"ond x") == b"second x"    # it did not
    assert r.feed(b"secre") == b""
    assert r.finish() == b"secre"             # stream ended: release the tail


def test_redactor_prefers_longest_and_ignores_empty_values():
    r = Redactor(["abc", "abcdef", ""])
    assert _stream(r, [b"xx abcdef abc yy"]) == b"xx *** *** yy"
    assert _stream(Redactor([]), [b"plain", b" text"]) == b"plain text"
