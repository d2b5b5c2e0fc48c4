"""A training script run directly (`python train.py`) by a user who exported the CLI's
settings runs as outside spotrun: under spotrun is the agent's ids, not any SPOTRUN_* name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spotrun.errors import ConfigError
from spotrun.torch import envconf

# docs/checkpointing.md's three lines, as a user's script has them.
TRAIN = """
import torch
from spotrun.torch import Checkpointer

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
ckpt = Checkpointer(model=model, optimizer=opt)
start = ckpt.restore()
for step in range(start, 3):
    opt.zero_grad(); model(torch.ones(2, 4)).sum().backward(); opt.step()
    ckpt.step(step + 1)
ckpt.finish(3)
print("trained from", start)
"""


def _user_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTRUN_")}
    env.update(extra)
    return env


def test_a_direct_run_with_the_cli_home_exported_checkpoints_locally(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    home = tmp_path / "home"
    env = _user_env(SPOTRUN_HOME=str(home), SPOTRUN_DB_URL=f"sqlite:///{home}/spotrun.db",
                    SPOTRUN_UI_TOKEN="t0ken")
    run = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env=env, timeout=120,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "trained from 0" in run.stdout
    assert (tmp_path / "spotrun-checkpoints" / "ckpt-000000000003" / "MANIFEST.json").is_file()
    assert not home.exists()     # nothing of the CLI's state was touched


@pytest.mark.parametrize("env, under", [
    ({"SPOTRUN_HOME": "/h", "SPOTRUN_DB_URL": "sqlite:///x.db"}, False),
    # The library's own settings, exported by hand, are settings, not the agent.
    ({"SPOTRUN_CHECKPOINT_KEEP": "5", "SPOTRUN_CHECKPOINT_INTERVAL_S": "60"}, False),
    ({"SPOTRUN_JOB_ID": "j-1", "SPOTRUN_ATTEMPT": "2", "SPOTRUN_CHECKPOINT_URI": "file:///c"},
     True),
    # One id: the agent's, whatever else is missing (a missing location is then an error).
    ({"SPOTRUN_ATTEMPT": "1", "SPOTRUN_CHECKPOINT_URI": "file:///c"}, True),
])
def test_under_spotrun_is_the_agents_ids(env: dict[str, str], under: bool) -> None:
    assert envconf.from_env(env).under_spotrun is under


def test_one_id_without_a_location_names_the_variables_seen(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from spotrun.torch import Checkpointer, RuntimeOptions
    env = {"SPOTRUN_JOB_ID": "j-1", "SPOTRUN_HOME": "/h"}
    runtime = RuntimeOptions(env=env, install_signal=False)
    with pytest.raises(ConfigError) as err:
        Checkpointer(model=torch.nn.Linear(2, 1), runtime=runtime)
    assert err.value.field == "SPOTRUN_CHECKPOINT_URI"
    text = str(err.value)
    assert "SPOTRUN_JOB_ID" in text and "SPOTRUN_ATTEMPT" in text and "SPOTRUN_HOME" in text
    assert "/h" not in text          # names, never values
    # A location passed in code is all the Checkpointer needs.
    ck = Checkpointer(model=torch.nn.Linear(2, 1), runtime=runtime, uri=(tmp_path / "c").as_uri())
    ck.close()
