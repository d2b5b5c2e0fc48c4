"""`spotrun agent`: run one attempt of a job on this instance (started by user data)."""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from pathlib import Path

import click
import structlog

from spotrun.errors import ConfigError


class _JsonFormatter(logging.Formatter):
    """stdlib log records (e.g. from spotrun.checkpoints) as JSON lines like structlog's."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps({"event": record.getMessage(), "level": record.levelname.lower(),
                           "logger": record.name,
                           "timestamp": datetime.now(timezone.utc).isoformat()}, sort_keys=True)


def configure_logging() -> None:
    """structlog JSON lines on stderr (the instance's console log)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    structlog.configure(
        processors=[structlog.processors.add_log_level,
                    structlog.processors.TimeStamper(fmt="iso", utc=True),
                    structlog.processors.JSONRenderer(sort_keys=True)],
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True)


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
    from spotrun.agent.imds import DEFAULT_ENDPOINT, USER_DATA, ImdsClient, endpoint_for
    from spotrun.agent.runner import Agent
    from spotrun.agent.userdata import config_from_user_data

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
