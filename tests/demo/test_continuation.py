"""A demo continuation's sizing, prompts and refusals (the whole path runs in test_demo_smoke.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from eyas.demo.continuation import next_prompts, run_continuation, seconds_per_prompt
from eyas.demo.prompts import training_prompts
from eyas.demo.timing import STAGE_SECONDS, StageClock
from eyas.errors import EyasError

SMOKE = Path(__file__).resolve().parents[2] / "examples" / "demo" / "smoke.yaml"


@pytest.mark.parametrize("general_share", [None, 0.5])
def test_next_prompts_are_new_and_keep_the_draw_and_its_mix(general_share: float | None) -> None:
    used = {p["prompt"] for p in training_prompts(40, 3, general_share)}
    fresh = next_prompts(3, general_share, used, 20)
    assert len(fresh) == 20 and len({p["prompt"] for p in fresh}) == 20
    assert not {p["prompt"] for p in fresh} & used
    assert next_prompts(3, general_share, used, 20) == fresh  # the same draw every call
    # the next prompts are those a larger draw adds: base + fresh is the draw of 60
    assert {p["prompt"] for p in training_prompts(60, 3, general_share)} == used | {p["prompt"] for p in fresh}
    if general_share is not None:
        general = sum(p["source"].startswith("eyas:general") for p in fresh)
        assert general == round(general_share * 60) - round(general_share * 40)


def test_next_prompts_refuses_a_draw_that_has_run_out() -> None:
    used = {p["prompt"] for p in training_prompts(900, 0, 0.5)}
    with pytest.raises(EyasError, match=r"--continue: the demo's draw \(seed 0, general_share 0.5\) has no 100 new "
                       r"training prompts left: only 480 general prompts can be derived here, 500 asked for"):
        next_prompts(0, 0.5, used, 100)


def test_seconds_per_prompt_sums_every_run_of_the_sized_stages(tmp_path: Path) -> None:
    (tmp_path / STAGE_SECONDS).write_text(json.dumps({"prompts": 5.0, "regenerate": 30.0, "prepare": 2.0,
                                                      "extract": 8.0, "train": 20.0, "held-out tau": 99.0}))
    assert seconds_per_prompt(tmp_path, 12) == pytest.approx(60.0 / 12)
    clock = StageClock(tmp_path / STAGE_SECONDS, "test")
    assert clock.timed("train", lambda: 7) == 7  # a second run adds to the first's sum
    again = json.loads((tmp_path / STAGE_SECONDS).read_text())
    assert again["train"] > 20.0 and set(clock.this_run) == {"train"}
    assert seconds_per_prompt(tmp_path, 12) > 60.0 / 12


def test_seconds_per_prompt_refuses_a_directory_without_stage_seconds(tmp_path: Path) -> None:
    with pytest.raises(EyasError, match=r"stage-seconds.json: no stage seconds recorded"):
        seconds_per_prompt(tmp_path, 10)


def _smoke_config(tmp_path: Path) -> Path:
    text = SMOKE.read_text().replace("runs/demo-smoke", str(tmp_path / "run"))
    config = tmp_path / "demo.yaml"
    config.write_text(text)
    assert yaml.safe_load(text)["demo"]["out"] == str(tmp_path / "run")
    return config


def test_a_continuation_refuses_an_untrained_demo_and_minutes_that_are_not_positive(tmp_path: Path) -> None:
    config = _smoke_config(tmp_path)
    with pytest.raises(EyasError, match=r"train/final: the demo's draft is not trained yet"):
        run_continuation(config, 5)
    with pytest.raises(EyasError, match=r"--continue: 0: minutes must be positive"):
        run_continuation(config, 0)
    assert not (tmp_path / "run" / "continue-1").exists()
