"""A run that stopped after claiming its output directory and before any work (an engine that did not start)
leaves only its claim; the corrected rerun, another run key, takes the directory over without --overwrite,
while a directory holding any work of another run is still refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eyas import config as configs
from eyas.config import DECIDES, StageConfig
from eyas.errors import EyasError
from eyas.stage import CONFIG_FILE, RUN_FILE, Stage


class Toy(StageConfig):
    out: Path
    size: int = configs.Field(1, json_schema_extra=DECIDES)
    overwrite: bool = False


TOY = Stage("toy", "a toy output", ("data-*.txt", "progress.json"), keyed=("progress.json",))


def test_a_bare_claim_gives_way_to_the_corrected_run_and_work_does_not(tmp_path: Path) -> None:
    out = tmp_path / "out"
    failed = TOY.claim(Toy(out=out), {"target": "with a bad config"})  # then its engine did not start
    assert {p.name for p in out.iterdir()} >= {RUN_FILE, CONFIG_FILE}
    fixed = TOY.claim(Toy(out=out), {"target": "fixed"})
    assert not fixed.resumed and fixed.key != failed.key
    assert json.loads((out / RUN_FILE).read_text())["run_key"] == fixed.key
    assert TOY.claim(Toy(out=out), {"target": "fixed"}).resumed  # the same run: resumed, as before
    (out / "data-0.txt").write_text("work")
    with pytest.raises(EyasError, match="holds a toy output made from other inputs or settings"):
        TOY.claim(Toy(out=out, size=2), {"target": "fixed"})
    assert (out / "data-0.txt").read_text() == "work"


def test_a_bare_claim_of_another_stage_is_still_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    Stage("other", "an other output", ("x-*.txt",)).claim(Toy(out=out), {})
    with pytest.raises(EyasError, match="holds the output of `eyas other`"):
        TOY.claim(Toy(out=out), {})
