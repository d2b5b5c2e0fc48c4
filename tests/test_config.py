"""Settings: the annotated sample loads, and bad settings name their key."""

from __future__ import annotations

import shutil
from dataclasses import fields, is_dataclass
from pathlib import Path

import pytest

from spotrun.config import Settings, load_settings
from spotrun.errors import ConfigError

SAMPLE = Path(__file__).resolve().parent.parent / "configs" / "spotrun.toml"


def test_sample_loads_and_equals_defaults(tmp_path):
    shutil.copy(SAMPLE, tmp_path / "spotrun.toml")
    loaded = load_settings(str(tmp_path))
    default = load_settings(str(tmp_path / "empty-home"))
    for section in ("local", "daemon", "agent"):
        assert getattr(loaded, section) == getattr(default, section)


def test_sample_documents_every_setting():
    text = SAMPLE.read_text()

    def names(cls, prefix=""):
        for f in fields(cls):
            if is_dataclass(f.type) or f.name in ("local", "daemon", "agent", "aws"):
                continue
            yield f.name
    for name in names(Settings):
        if name == "home":
            continue
        assert name in text, f"{name} missing from configs/spotrun.toml"


@pytest.mark.parametrize("toml,field", [
    ('provider = 3\n', "provider"),
    ('[local]\ntime_scale = "fast"\n', "local.time_scale"),
    ('[daemon]\nheartbeat_timeout_s = -1\n', "daemon.heartbeat_timeout_s"),
    ('[daemon]\nbogus = 1\n', "daemon.bogus"),
    ('nonsense = 1\n', "nonsense"),
    ('[local]\npools = "us-east-1a"\n', "local.pools"),
    ('this is = not toml [\n', "spotrun.toml"),
])
def test_bad_setting_names_its_key(tmp_path, toml, field):
    (tmp_path / "spotrun.toml").write_text(toml)
    with pytest.raises(ConfigError) as info:
        load_settings(str(tmp_path))
    assert info.value.field == field
    assert info.value.exit_code == 2


def test_env_overrides_db_url(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTRUN_DB_URL", "sqlite:////tmp/elsewhere.db")
    assert load_settings(str(tmp_path)).database_url == "sqlite:////tmp/elsewhere.db"
    monkeypatch.delenv("SPOTRUN_DB_URL")
    assert load_settings(str(tmp_path)).database_url.endswith("spotrun.db")


@pytest.mark.parametrize("toml,field,says", [
    ('[aws]\nretry_attempts = true\n', "aws.retry_attempts", "an integer >= 0"),
    ('[aws]\nplacement_scores = 1\n', "aws.placement_scores", "true or false"),
    ('daemon = 3\n', "daemon", "must be a mapping"),
    ('[local]\npools = ["a", 2]\n', "local.pools[1]", "a list of strings"),
    ('[daemon]\nbogus = 1\n', "daemon.bogus", "allowed here: deadman_timeout_s"),
])
def test_bad_setting_says_what_is_allowed_in_one_line(tmp_path, toml, field, says):
    (tmp_path / "spotrun.toml").write_text(toml)
    with pytest.raises(ConfigError) as info:
        load_settings(str(tmp_path))
    assert info.value.field == field and says in str(info.value)
    assert "\n" not in str(info.value)
