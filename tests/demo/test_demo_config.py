"""The demo refuses a malformed config before its first stage runs, and the shipped sizes parse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from eyas.config import STAGE_NAMES, DemoConfig, load_stage_config
from eyas.demo.run import run_demo
from eyas.errors import EyasError

SIZES = Path(__file__).resolve().parents[2] / "examples" / "demo"


def test_a_malformed_tree_is_refused_before_any_stage(tmp_path: Path) -> None:
    config = tmp_path / "demo.yaml"
    config.write_text(yaml.safe_dump({
        "demo": {"out": str(tmp_path / "run"), "train_prompts": 4, "tree": "6,4"},
        "eval": {"draft": str(tmp_path / "draft"), "prompts": str(tmp_path / "p.jsonl"), "out": str(tmp_path / "e"),
                 "chain": 3},
    }))
    with pytest.raises(EyasError, match=r"tree: '6,4': expected DEPTH,TOPK,TOTAL"):
        run_demo(config)
    assert not (tmp_path / "run").exists()  # not even the prompts were drawn


@pytest.mark.parametrize("size", ["smoke", "small", "full"])
def test_shipped_sizes_have_every_stage_under_their_own_out(size: str) -> None:
    path = SIZES / f"{size}.yaml"
    doc = yaml.safe_load(path.read_text())
    assert set(doc) == set(STAGE_NAMES) - {"import", "check-draft"}  # every pipeline stage; no published draft
    demo = load_stage_config(DemoConfig, "demo", path)
    for stage in ("regenerate", "prepare", "extract", "train", "eval", "export"):
        assert stage in doc, stage
        outputs = [str(v) for k, v in doc[stage].items() if k in ("out", "prompts", "data", "features", "draft")]
        assert all(str(demo.out) in value for value in outputs), (stage, outputs)


@pytest.mark.parametrize("size", ["smoke", "small", "full"])
def test_shipped_sizes_leave_every_compute_dtype_to_auto(size: str) -> None:
    """bfloat16 is emulated (several times slower) on CPUs without AVX-512-BF16/AMX: no size may force it."""
    doc = yaml.safe_load((SIZES / f"{size}.yaml").read_text())
    dtypes = {stage: section[key] for stage, section in doc.items() for key in ("dtype", "target_dtype")
              if key in section}
    assert dtypes and set(dtypes.values()) == {"auto"}, dtypes


def test_until_stops_after_the_named_stage_with_the_asked_data_mix(tmp_path: Path) -> None:
    doc = yaml.safe_load((SIZES / "smoke.yaml").read_text())
    root = str(tmp_path / "run")
    text = yaml.safe_dump(doc).replace("runs/demo-smoke", root)
    config = tmp_path / "demo.yaml"
    config.write_text(text.replace("demo:\n", "demo:\n  general_share: 1.0\n", 1))
    run_demo(config, until="prompts")
    train = [json.loads(line) for line in (tmp_path / "run" / "prompts" / "train-prompts.jsonl").read_text().splitlines()]
    assert train and all(p["source"].startswith("eyas:general#") for p in train)
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if not p.name.startswith(".")) == [
        "config.yaml", "prompts", "run.json", "stage-seconds.json"]  # no stage after the prompts, no report
