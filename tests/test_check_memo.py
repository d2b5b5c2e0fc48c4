"""The team server's submit-time checks shared between alike specs for a second
(spotrun.decide.memo): a sweep's specs differ in name, command and env, not in what the
decision reads; a spec that differs there is checked on its own, and nothing is kept longer."""

from __future__ import annotations

from pathlib import Path

import pytest

from spotrun.decide.memo import CheckMemo
from spotrun.errors import SpecError
from spotrun.spec import parse_spec


def spec(tmp_path: Path, body: dict):
    raw = {"name": "sweep-a", "command": "python train.py --lr 1e-3",
           "resources": {"gpus": 1}, "policy": {"market": "spot"}, **body}
    return parse_spec(raw, base_dir=tmp_path, instance_types=["g5.xlarge", "p3.2xlarge"],
                      zones=["us-east-1a"])


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_alike_specs_share_one_check_within_its_age_and_no_longer(tmp_path):
    clock = Clock()
    memo = CheckMemo(max_age_s=1.0, clock=clock)
    calls: list[str] = []

    def check(tag: str):
        return lambda: calls.append(tag) or [f"warned {tag}"]

    a = spec(tmp_path, {})
    b = spec(tmp_path, {"name": "sweep-b", "command": "python train.py --lr 3e-4",
                        "env": {"SEED": "2"}})
    assert memo.get(a, check("a")) == ["warned a"]
    assert memo.get(b, check("b")) == ["warned a"]          # alike: the same decision
    other = spec(tmp_path, {"resources": {"gpus": 1, "instance_types": ["g5.xlarge"]}})
    assert memo.get(other, check("other")) == ["warned other"]   # reads other pools
    clock.t += 1.5
    assert memo.get(b, check("b")) == ["warned b"]          # older than a second: again
    assert calls == ["a", "other", "b"]


def test_a_refusal_is_kept_and_raised_for_each_alike_spec(tmp_path):
    memo = CheckMemo(max_age_s=1.0, clock=Clock())
    calls = []

    def refuse():
        calls.append(1)
        raise SpecError("can never run", field="resources.gpus")

    for name in ("x-1", "x-2"):
        with pytest.raises(SpecError) as err:
            memo.get(spec(tmp_path, {"name": name}), refuse)
        assert err.value.field == "resources.gpus"
    assert calls == [1]
