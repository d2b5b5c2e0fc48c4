"""`spotrun agent`: run one attempt of a job on this instance (started by user data)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from spotrun.errors import ConfigError
from spotrun.agent.imds import DEFAULT_ENDPOINT, USER_DATA, ImdsClient, endpoint_for
from spotrun.agent.attempt import Agent
from spotrun.agent.userdata import config_from_user_data
from spotrun.logsetup import configure_logging as setup


def configure_logging() -> None:
    """JSON lines on stderr (the instance's console log), stdlib records included."""
    setup(json=True, stream=sys.stderr)


@click.command(name="agent")
@click.option("--user-data", "user_data", type=click.Path(dir_okay=False, path_type=Path),
              help="File holding the agent config (JSON or a boot script with the marker line).")
@click.option("--user-data-imds", "from_imds", is_flag=True,
              help="Read the config from IMDS /latest/user-data (on AWS).")
@click.option("--dir", "workdir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("."), show_default=True,
              help="Instance disk folder: the job runs in <dir>/job.")
def agent(user_data: Path | None, from_imds: bool, workdir: Path) -> None:
    """Run the on-instance agent: set up, run the command, report, exit with its code."""

    if (user_data is None) == (not from_imds):
        raise ConfigError("give exactly one of --user-data FILE or --user-data-imds",
                          field="user_data")
    configure_logging()
    if user_data is not None:
        try:
            text = user_data.read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read: {exc.strerror}", field="user_data",
                              value=str(user_data)) from None
    else:
        text = ImdsClient(endpoint_for(DEFAULT_ENDPOINT), timeout_s=5.0).get(USER_DATA) or ""
    config = config_from_user_data(text)
    workdir.mkdir(parents=True, exist_ok=True)
    sys.exit(Agent(config, workdir=workdir).run())
