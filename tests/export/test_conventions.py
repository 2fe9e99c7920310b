"""Layer ids have one home (eyas.models.layers) and one check: `eyas import` and `eyas check-draft`
refuse ids a target cannot give (repeated, out of range, or EAGLE-3's defaults for a target too
shallow for them) and ids an engine would misread (not ascending: engines concatenate the layers
in ascending order), naming the file and the field; `eyas export` refuses to write the latter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eyas.errors import EyasError
from eyas.models.layers import (
    check_layer_ids,
    default_aux_layers,
    from_input_convention,
    layer_id_problems,
    to_engine_ids,
    to_input_convention,
)
from eyas.testing.tiny import build_tiny_target, save_spaced_draft

pytestmark = pytest.mark.usefixtures("one_thread")

FIELD = "eagle_aux_hidden_state_layer_ids"


def test_one_check_for_every_id_list() -> None:
    assert layer_id_problems([2, 2, 1], "input", 4) == ["[2, 2, 1] repeats an id"]
    assert layer_id_problems([3, 1, 2], "input", 4) == []  # eyas captures in the order given
    assert layer_id_problems([3, 1, 2], "input", 4, engine=True) == [
        "[3, 1, 2] not ascending (engines concatenate the layers in ascending order)"]
    assert layer_id_problems([1, 2, 5], "input", 4) == [
        "[5] out of range for a 4-layer target in the input convention (0..4)"]
    assert layer_id_problems([1, 2, 4], "output", 4) == [
        "[4] out of range for a 4-layer target in the output convention (0..3)"]
    assert layer_id_problems([-1, 2, 9], "input", None) == [
        "[-1] out of range in the input convention (ids start at 0)"]
    with pytest.raises(EyasError, match=r"^f: \[2, 2, 1\] repeats an id$"):
        check_layer_ids([2, 2, 1], "input", 4, "f")
    with pytest.raises(EyasError, match=r"num_hidden_layers: 4 is too few for EAGLE-3's default layers \[2, 2, 1\]"):
        default_aux_layers(4)
    assert to_input_convention([5, 1, 2], "output", 8) == [6, 2, 3]
    with pytest.raises(EyasError, match=r"^layers: \[5, 1, 2\] not ascending"):
        to_input_convention([5, 1, 2], "output", 8, engine=True)
    with pytest.raises(EyasError, match=r"^aux_layer_ids: \[2, 0, 1\] not ascending"):
        to_engine_ids([3, 1, 2], "output")
    with pytest.raises(EyasError, match=r"aux_layer_ids: \[-1\] out of range .*embedding output \(input id 0\)"):
        from_input_convention([0, 3, 5], "output")
    assert from_input_convention(to_input_convention([0, 3, 7], "output", 8), "output", 8) == [0, 3, 7]


@pytest.fixture(scope="module")
def shallow(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A 4-layer tiny target and a draft for it exported in the vLLM format (ids [1, 2, 3], input convention)."""
    root = tmp_path_factory.mktemp("shallow")
    target = build_tiny_target(root / "target", num_layers=4)
    save_spaced_draft(target, root / "draft")
    return {"target": target, "draft": root / "draft"}


def published_with(shallow: dict[str, Path], run_cli, root: Path, ids: list[int] | None) -> Path:
    """The vLLM export of the shallow draft with its config's aux layer ids replaced by `ids` (None: removed)."""
    published = root / "published"
    assert run_cli("export", "--draft", shallow["draft"], "--format", "vllm", "--out", published).code == 0
    config = json.loads((published / "config.json").read_text())
    if ids is None:
        del config["eagle_config"][FIELD]
    else:
        config["eagle_config"][FIELD] = ids
    (published / "config.json").write_text(json.dumps(config))
    return published


def one_line_error(result) -> str:
    assert result.code == 2, (result.code, result.out, result.err)
    assert result.err.count("\n") == 1 and "Traceback" not in result.err, result.err
    return result.err


def test_the_export_itself_checks_clean(shallow: dict[str, Path], run_cli, tmp_path: Path) -> None:
    published = published_with(shallow, run_cli, tmp_path, [1, 2, 3])
    report = run_cli("check-draft", published, "--target", shallow["target"], "--engine", "vllm")
    assert report.code == 0 and "no problems found" in report.out, report.out
    assert run_cli("import", published, "--out", tmp_path / "back", "--target", shallow["target"]).code == 0


@pytest.mark.parametrize("with_target", [True, False])
@pytest.mark.parametrize(("ids", "message"), [([2, 2, 1], "[2, 2, 1] repeats an id"),
                                              ([3, 1, 2], "[3, 1, 2] not ascending")])
def test_import_refuses_repeated_or_unordered_ids(shallow: dict[str, Path], run_cli, tmp_path: Path, with_target: bool,
                                                  ids: list[int], message: str) -> None:
    published = published_with(shallow, run_cli, tmp_path, ids)
    target = ["--target", shallow["target"]] if with_target else []
    err = one_line_error(run_cli("import", published, "--out", tmp_path / "x", *target))
    assert f"{published / 'config.json'}: {FIELD}: {message}" in err
    assert not (tmp_path / "x").exists()


def test_export_refuses_ids_an_engine_would_read_in_another_order(shallow: dict[str, Path], run_cli,
                                                                  tmp_path: Path) -> None:
    draft = tmp_path / "unordered"
    config = json.loads((shallow["draft"] / "config.json").read_text())
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({**config, "aux_layer_ids": [3, 1, 2]}))
    (draft / "model.safetensors").write_bytes((shallow["draft"] / "model.safetensors").read_bytes())
    err = one_line_error(run_cli("export", "--draft", draft, "--format", "vllm", "--out", tmp_path / "out"))
    assert "aux_layer_ids: [3, 1, 2] not ascending (engines concatenate the layers in ascending order)" in err
    assert not (tmp_path / "out" / "config.json").exists()


def test_import_refuses_ids_out_of_range_for_the_target(shallow: dict[str, Path], run_cli, tmp_path: Path) -> None:
    published = published_with(shallow, run_cli, tmp_path, [1, 2, 7])
    err = one_line_error(run_cli("import", published, "--out", tmp_path / "x", "--target", shallow["target"]))
    assert f"{published / 'config.json'}: {FIELD}: [7] out of range for a 4-layer target in the input convention (0..4)" in err


def test_import_refuses_the_defaults_of_a_too_shallow_target(shallow: dict[str, Path], run_cli, tmp_path: Path) -> None:
    published = published_with(shallow, run_cli, tmp_path, None)
    err = one_line_error(run_cli("import", published, "--out", tmp_path / "x", "--target", shallow["target"]))
    assert f"{published / 'config.json'}: {FIELD}: not given, and the target's num_hidden_layers: 4 is too few " \
           "for EAGLE-3's default layers [2, 2, 1]" in err


@pytest.mark.parametrize(("ids", "message"), [
    ([2, 2, 1], f"{FIELD}: [2, 2, 1] repeats an id"),
    ([3, 1, 2], f"{FIELD}: [3, 1, 2] not ascending (engines concatenate the layers in ascending order)"),
    (None, f"{FIELD}: not given, and the target's num_hidden_layers: 4 is too few for EAGLE-3's default layers [2, 2, 1]"),
    ([1, 2, 4], f"{FIELD}: [4] out of range for a 4-layer target in the output convention (0..3)"),
])
def test_check_draft_reports_ids_the_engine_would_trip_over(shallow: dict[str, Path], run_cli, tmp_path: Path,
                                                            ids: list[int] | None, message: str) -> None:
    published = published_with(shallow, run_cli, tmp_path, ids)
    engine = "sglang" if ids == [1, 2, 4] else "vllm"
    report = run_cli("check-draft", published, "--target", shallow["target"], "--engine", engine)
    assert report.code == 1, (report.out, report.err)
    assert f"{published / 'config.json'}: {message}" in report.out
