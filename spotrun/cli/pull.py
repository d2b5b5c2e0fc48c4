"""`spotrun pull JOB`: download a job's outputs and its final checkpoint as a plain state_dict.

Outputs come from `jobs/<job>/outputs/` as listed in `outputs.json` (the agent writes
both); the newest verified checkpoint is exported to `checkpoint/model.pt` (and
`model.safetensors` where installed), which load without spotrun (spotrun.pulls).
"""

from __future__ import annotations

from pathlib import Path

import click

from spotrun.cli.common import backend, echo_json, json_option
from spotrun.errors import BadInputError


@click.command()
@click.argument("job_ref")
@click.option("--to", "to_dir", type=click.Path(file_okay=False), default=None,
              help="Folder to write into (created); default ./<job id>.")
@click.option("--no-checkpoint", is_flag=True, help="Only the outputs; skip the export.")
@json_option
def pull(job_ref: str, to_dir: str | None, no_checkpoint: bool, as_json: bool) -> None:
    """Download a job's outputs, and its final checkpoint as checkpoint/model.pt.

    Outputs are the files the job spec's `outputs` names, uploaded by the agent when
    the command ended (or on the interruption notice). The checkpoint is the newest
    verified one, exported as a plain PyTorch state_dict (`torch.load(...,
    weights_only=True)`), plus `model.safetensors` where safetensors is installed.
    """
    dest = Path(to_dir) if to_dir else None
    if dest is not None and dest.exists() and not dest.is_dir():
        raise BadInputError("must be a folder (it is a file)", field="--to", value=str(dest))
    done = backend().pull(job_ref, dest, checkpoint=not no_checkpoint, show=not as_json)
    outputs, checkpoint = done["outputs"], done["checkpoint"]
    if as_json:
        echo_json(done)
        return
    click.echo(f"{done['job']} ({done['state']}) -> {done['to']}")
    for o in outputs:
        click.echo(f"  {o['path']}  {o['size']} bytes  (attempt {o['attempt']})")
    if checkpoint is not None:
        what = ", ".join(checkpoint["files"]) or checkpoint.get("skipped", "")
        click.echo(f"  {checkpoint['name']} (step {checkpoint['step']}, {checkpoint['kind']}): {what}")
