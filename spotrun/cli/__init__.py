"""The `spotrun` command line. Verbs load lazily so `spotrun status` never imports boto3 or torch.

Exit codes: 0 ok, 1 failure, 2 bad input.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from spotrun.errors import SpotrunError

# verb -> "module:attribute"; each module owns one verb (or a small family).
VERBS: dict[str, str] = {
    "submit": "spotrun.cli.jobs:submit",
    "status": "spotrun.cli.jobs:status",
    "logs": "spotrun.cli.jobs:logs",
    "pull": "spotrun.cli.pull:pull",
    "cancel": "spotrun.cli.jobs:cancel",
    "resume": "spotrun.cli.jobs:resume",
    "interrupt": "spotrun.cli.interrupt:interrupt",
    "plan": "spotrun.cli.plan:plan",
    "audit": "spotrun.cli.audit:audit",
    "budgets": "spotrun.cli.budgets:budgets",
    "simulate": "spotrun.cli.simulate:simulate",
    "daemon": "spotrun.cli.daemon:daemon",
    "agent": "spotrun.cli.agent:agent",
    "market": "spotrun.cli.market:market",
    "demo": "spotrun.cli.demo:demo",
    "doctor": "spotrun.cli.doctor:doctor",
    "ui": "spotrun.cli.ui:ui",
    "users": "spotrun.cli.users:users",
    "trail": "spotrun.cli.trail:trail",
    "server": "spotrun.cli.server:server",
    "login": "spotrun.cli.remote:login",
    "logout": "spotrun.cli.remote:logout",
}

HELP = {
    "submit": "Submit a job spec (YAML); prints the job id.",
    "status": "Show jobs and their attempts.",
    "logs": "Print a job's output (shipped to the store by the agent).",
    "pull": "Download a job's outputs and its final checkpoint as a plain state_dict.",
    "cancel": "Cancel a job; its instances are terminated.",
    "resume": "Resume a stopped job, e.g. with a raised budget.",
    "interrupt": "Rehearse a reclaim: send a spot interruption to a job's instance(s).",
    "plan": "Rank instance candidates for a job by modelled cost per unit of progress.",
    "audit": "Actual spend against the on-demand baseline, per job, project or owner.",
    "budgets": "Project and owner budgets: spent this period, committed, left.",
    "simulate": "What-if: replay a spot trace under scheduling policies.",
    "daemon": "Run the daemon that launches, watches and books jobs.",
    "agent": "Run the on-instance agent (started by the instance's user data).",
    "market": "The local provider's simulated spot market (a separate process).",
    "demo": "Train a small real PyTorch job through reclaims, end to end.",
    "doctor": "Check cloud credentials, quotas and resources; say what to fix.",
    "ui": "Serve a read-only web dashboard (and /metrics) on 127.0.0.1.",
    "users": "Team server users and API tokens: add, list, token, revoke (server host).",
    "trail": "The action trail: who changed what through the server, and what was denied.",
    "server": "Serve the team API (token auth) beside the daemon.",
    "login": "Use a team server: check and store its URL and your token.",
    "logout": "Forget the team server; verbs act on the local home again.",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(VERBS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = VERBS.get(name)
        if target is None:
            return None
        mod_name, attr = target.split(":")
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as exc:
            if exc.name == mod_name:
                return _unavailable(name)
            raise
        return getattr(mod, attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Help text comes from HELP so `spotrun --help` imports no verb module.
        rows = [(name, HELP.get(name, "")) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SpotrunError as exc:
            click.echo(f"error: {exc}"[:500], err=True)
            ctx.exit(exc.exit_code)
        except Exception as exc:
            # A database that turns locked, broken or unreachable mid-verb: one line, exit 1.
            # lazy: start-up cost (`spotrun --help` imports no database code)
            from spotrun.db.faults import database_error
            err = database_error(exc)
            if err is None:
                raise
            click.echo(f"error: {err}"[:500], err=True)
            ctx.exit(err.exit_code)


def _unavailable(name: str) -> click.Command:
    @click.command(name=name, help=HELP.get(name, ""))
    def cmd() -> None:
        raise SpotrunError(f"'{name}' is not available in this build")
    return cmd


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="spotrun")
@click.option("--local", is_flag=True,
              help="Act on the local home even when `spotrun login` stored a server.")
@click.pass_context
def cli(ctx: click.Context, local: bool) -> None:
    """spotrun keeps PyTorch training running on spot GPUs and audits the cost.

    State lives in $SPOTRUN_HOME (default ~/.spotrun): the SQLite database, the
    local object store and logs. After `spotrun login URL`, status, cancel, resume,
    audit, budgets and trail go to that server instead (unless --local or SPOTRUN_HOME
    is given; docs/server.md). Exit codes: 0 ok, 1 failure, 2 bad input.
    """
    ctx.meta["spotrun.local"] = local


def main() -> None:
    """Console-script entry point."""
    try:
        cli.main(prog_name="spotrun", standalone_mode=True)
    except SpotrunError as exc:  # raised outside a verb (e.g. during option parsing)
        click.echo(f"error: {exc}"[:500], err=True)
        sys.exit(exc.exit_code)
