"""`spotrun doctor`: check AWS credentials, quotas and resources; say what to fix."""

from __future__ import annotations

import click

from spotrun.cli.common import echo_json, get_settings, json_option


@click.command(name="doctor")
@json_option
def doctor(as_json: bool) -> None:
    """Check cloud credentials, quotas and resources; one line each, exit 1 if any needs a fix."""
    from spotrun.providers.aws_doctor import AwsDoctor, Status  # boto3 only when asked for

    settings = get_settings()
    if settings.provider != "aws":
        checks = []
        message = f"provider is {settings.provider!r}: nothing to check in a cloud"
    else:
        checks = AwsDoctor(settings).run()
        message = ""
    if as_json:
        echo_json({"provider": settings.provider, "checks": [c.to_dict() for c in checks],
                   "message": message})
    else:
        from rich.console import Console
        from rich.table import Table

        if message:
            click.echo(message)
        else:
            table = Table("check", "status", "detail", show_lines=False)
            style = {Status.OK: "green", Status.FIX: "red", Status.UNKNOWN: "yellow"}
            for c in checks:
                table.add_row(c.name, f"[{style[c.status]}]{c.status.value}[/]", c.detail)
            Console(width=160).print(table)
    if any(c.status is Status.FIX for c in checks):
        raise SystemExit(1)
