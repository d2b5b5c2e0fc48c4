"""The Checkpointer's option objects: defaults, bad values, moved keywords (issue 41)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from spotrun.errors import ConfigError  # noqa: E402
from spotrun.store.file import FileStore  # noqa: E402
from spotrun.torch import Checkpointer, NoticeOptions, RuntimeOptions, SaveOptions  # noqa: E402
from spotrun.torch.options import DEFAULT_MTBF_S, GROUPS, MOVED  # noqa: E402

QUIET = RuntimeOptions(env={}, install_signal=False)


def _model():
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_defaults_are_the_documented_ones():
    assert SaveOptions() == SaveOptions(async_save=True, overlap_snapshot=True, sharded=False,
                                        shard_bytes=None, retries=3, retry_backoff_s=0.5,
                                        mtbf_s=DEFAULT_MTBF_S)
    assert NoticeOptions() == NoticeOptions(file=None, background=True, grace_s=None,
                                            margin_s=None)
    rt = RuntimeOptions()
    assert (rt.env, rt.install_signal, rt.progress_file, rt.progress_interval_s) == \
        (None, True, None, 1.0)
    assert rt.clock is time.monotonic and rt.wall is time.time
    with pytest.raises(dataclasses.FrozenInstanceError):
        SaveOptions().retries = 5   # type: ignore[misc]


def test_the_simple_use_is_unchanged(tmp_path: Path):
    model, opt = _model()
    ck = Checkpointer(model, opt, store=FileStore(tmp_path), every_steps=2, total_steps=4,
                      runtime=QUIET)
    try:
        assert (ck.every_steps, ck.total_steps, ck.async_save, ck.overlap_snapshot) == \
            (2, 4, True, True)
        assert ck.guard.background and ck.persister.retries == 3
        assert ck.restore() == 0
    finally:
        ck.close()


def test_options_reach_the_parts_they_steer(tmp_path: Path):
    model, opt = _model()
    ticks = iter(range(10_000))
    ck = Checkpointer(model=model, optimizer=opt, store=FileStore(tmp_path / "s"),
                      save=SaveOptions(async_save=False, overlap_snapshot=False, shard_bytes=256,
                                       retries=5, retry_backoff_s=0.01, mtbf_s=7200.0),
                      notice=NoticeOptions(file=tmp_path / "notice", background=False,
                                           grace_s=0.5, margin_s=2.0),
                      runtime=RuntimeOptions(env={}, install_signal=False,
                                             clock=lambda: float(next(ticks)),
                                             progress_file=str(tmp_path / "progress.json"),
                                             progress_interval_s=30.0))
    try:
        assert not ck.async_save and not ck.overlap_snapshot and ck.mtbf_s == 7200.0
        assert (ck.persister.retries, ck.persister.backoff_s, ck.persister.shard_bytes) == \
            (5, 0.01, 256)
        g = ck.guard
        assert (g.notice_file, g.background, g.grace_s, g.margin_s) == \
            (tmp_path / "notice", False, 0.5, 2.0)
        assert ck.progress.path == tmp_path / "progress.json" and ck.progress_interval_s == 30.0
        assert ck.clock() < ck.clock()   # the injected clock
    finally:
        ck.close()


@pytest.mark.parametrize("make, field", [
    (lambda: SaveOptions(retries=-1), "SaveOptions.retries"),
    (lambda: SaveOptions(retries=2.5), "SaveOptions.retries"),
    (lambda: SaveOptions(async_save="no"), "SaveOptions.async_save"),
    (lambda: SaveOptions(shard_bytes=0), "SaveOptions.shard_bytes"),
    (lambda: SaveOptions(mtbf_s=0), "SaveOptions.mtbf_s"),
    (lambda: SaveOptions(retry_backoff_s=float("nan")), "SaveOptions.retry_backoff_s"),
    (lambda: NoticeOptions(grace_s="soon"), "NoticeOptions.grace_s"),
    (lambda: NoticeOptions(margin_s=-1.0), "NoticeOptions.margin_s"),
    (lambda: NoticeOptions(background=None), "NoticeOptions.background"),
    (lambda: NoticeOptions(file=3), "NoticeOptions.file"),
    (lambda: RuntimeOptions(env=["SPOTRUN_JOB_ID"]), "RuntimeOptions.env"),
    (lambda: RuntimeOptions(clock=0.0), "RuntimeOptions.clock"),
    (lambda: RuntimeOptions(progress_interval_s=float("inf")), "RuntimeOptions.progress_interval_s"),
])
def test_a_bad_value_is_one_config_error_naming_the_field(make, field):
    with pytest.raises(ConfigError) as err:
        make()
    assert err.value.field == field
    assert "\n" not in str(err.value) and str(err.value).startswith(f"{field}: must be ")


def test_a_moved_keyword_names_its_new_place(tmp_path: Path):
    model, opt = _model()
    with pytest.raises(ConfigError) as err:
        Checkpointer(model=model, optimizer=opt, store=FileStore(tmp_path), async_save=False)
    assert err.value.field == "async_save"
    assert str(err.value) == ("async_save: moved to SaveOptions.async_save "
                              "(Checkpointer(save=SaveOptions(async_save=...)))")
    secret = {"SPOTRUN_CHECKPOINT_URI": "s3://b/k?token=hush"}
    with pytest.raises(ConfigError) as err:
        Checkpointer(model=model, store=FileStore(tmp_path), env=secret)
    assert "RuntimeOptions.env" in str(err.value) and "hush" not in str(err.value)
    with pytest.raises(ConfigError, match=r"background_notice: moved to NoticeOptions\.background"):
        Checkpointer(model=model, store=FileStore(tmp_path), background_notice=False)


def test_every_moved_keyword_points_at_a_field_that_exists():
    for old, (key, field) in MOVED.items():
        assert field in {f.name for f in dataclasses.fields(GROUPS[key])}, old
    assert len(MOVED) == 17   # the 29 old parameters less the 12 Checkpointer kept


def test_an_unknown_keyword_or_a_wrong_object_says_what_is_allowed(tmp_path: Path):
    model, _ = _model()
    with pytest.raises(ConfigError) as err:
        Checkpointer(model=model, store=FileStore(tmp_path), every_step=3)
    assert err.value.field == "every_step" and "every_steps" in str(err.value)
    with pytest.raises(ConfigError) as err:
        Checkpointer(model=model, store=FileStore(tmp_path), save={"async_save": False})
    assert err.value.field == "save" and "SaveOptions" in str(err.value)
