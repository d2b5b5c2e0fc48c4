"""The e2e harness pieces: user data -> agent config, and the IMDSv2 server protocol."""

from __future__ import annotations

from spotrun.agent.imds import ImdsClient
from spotrun.agent.userdata import config_from_user_data

from .harness import ImdsServer, user_data_of
from .test_aws_provider import request


def test_user_data_carries_the_agent_config_both_ways(provider, ec2):
    info = provider.launch(provider.plan_launch(request()))
    text = user_data_of(ec2, info.instance_id)
    # The agent reads it from IMDS user data (marker line) as well as from agent.json.
    cfg = config_from_user_data(text)
    assert (cfg.job_id, cfg.attempt) == ("job-a", 1)


def test_imds_server_speaks_imdsv2():
    srv = ImdsServer("i-0abc", user_data="{}")
    try:
        client = ImdsClient(srv.url)
        assert client.get("meta-data/instance-id") == "i-0abc"
        assert client.get("meta-data/spot/instance-action") is None
        srv.notice("terminate", "2026-01-01T00:02:00Z")
        assert '"terminate"' in client.get("meta-data/spot/instance-action")
        assert srv.requests[0] == "PUT /latest/api/token"
    finally:
        srv.stop()
