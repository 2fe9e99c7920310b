"""One stage abstraction (`eyas.stage`) and one CLI definition per option (`eyas.cli_options`): the run key
follows only the fields marked as deciding the result, JSONL survives a torn line, claims behave the
same for every stage, no stage module keeps its own copy of that machinery, and every verb's options
are its config's fields."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import typer

from eyas import config as configs
from eyas.config import DECIDES, ARGUMENT_KEY, StageConfig, deciding_fields
from eyas.errors import EyasError
from eyas.stage import CONFIG_FILE, RUN_FILE, JsonLines, Stage, run_key

SRC = Path(configs.__file__).parent
STAGE_CONFIGS = {"prepare": configs.PrepareConfig, "regenerate": configs.RegenerateConfig,
                 "extract": configs.ExtractConfig, "train": configs.TrainConfig, "eval": configs.EvalConfig,
                 "export": configs.ExportConfig, "import": configs.ImportConfig,
                 "check-draft": configs.CheckDraftConfig}
NEVER_DECIDE = {"out", "overwrite", "device", "preflight", "resume", "log_every", "save_every", "keep_last", "fsdp",
                "trust_remote_code", "target", "data", "features", "prompts", "draft", "source"}


def train_config(**changes: object) -> configs.TrainConfig:
    return configs.TrainConfig(**{"out": Path("/runs/a"), "features": Path("/stores/s"), **changes})  # type: ignore[arg-type]


def test_the_run_key_follows_only_the_marked_fields_and_the_inputs() -> None:
    base = run_key("train", train_config(), {"store": "k1"})
    for unmarked in ({"out": Path("/elsewhere")}, {"log_every": 1}, {"device": "cpu"}, {"overwrite": True},
                     {"features": Path("/moved/store")}):
        assert run_key("train", train_config(**unmarked), {"store": "k1"}) == base, unmarked
    assert run_key("train", train_config(lr=3e-4), {"store": "k1"}) != base
    assert run_key("train", train_config(), {"store": "k2"}) != base
    assert run_key("eval", train_config(), {"store": "k1"}) != base  # the stage is part of the key


@pytest.mark.parametrize("stage", sorted(STAGE_CONFIGS))
def test_paths_devices_and_switches_never_decide_a_run(stage: str) -> None:
    decided = set(deciding_fields(STAGE_CONFIGS[stage]))
    assert not decided & NEVER_DECIDE, decided & NEVER_DECIDE


def test_a_new_unmarked_field_keeps_every_earlier_key() -> None:
    class Before(StageConfig):
        out: Path
        size: int = configs.Field(1, json_schema_extra=DECIDES)

    class After(Before):
        verbose: bool = False

    assert run_key("x", Before(out=Path("o")), {}) == run_key("x", After(out=Path("o")), {})


def test_json_lines_drop_a_torn_line_and_refuse_a_malformed_one(tmp_path: Path) -> None:
    log = JsonLines(tmp_path / "results.jsonl")
    assert log.read() == []
    log.path.write_text('{"a": 1}\n{"a": 2}\n{"a": 3')
    assert log.read() == [{"a": 1}, {"a": 2}]
    with log.appender() as appender:
        appender.append(json.dumps({"a": 4}))
    assert log.path.read_text() == '{"a": 1}\n{"a": 2}\n{"a": 4}\n'
    log.keep(1)
    assert log.read() == [{"a": 1}]
    log.path.write_text('{"a": 1}\nnot json\n')
    with pytest.raises(EyasError, match=re.escape(f"{log.path}:2: malformed JSON")):
        log.read()


class Toy(StageConfig):
    out: Path
    size: int = configs.Field(1, json_schema_extra=DECIDES)
    overwrite: bool = False


TOY = Stage("toy", "a toy output", ("data-*.txt", "progress.json"), keyed=("progress.json",))


def test_a_claim_records_the_run_resumes_it_and_refuses_another(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = TOY.claim(Toy(out=out), {"input": "a"}, notes=("why",))
    assert not first.resumed
    assert json.loads((out / RUN_FILE).read_text())["run_key"] == first.key
    text = (out / "config.yaml").read_text()
    assert "# why\n" in text and "toy:" in text
    (out / "data-0.txt").write_text("done")
    again = TOY.claim(Toy(out=out), {"input": "a"})
    assert again.resumed and again.key == first.key and (out / "data-0.txt").exists()
    with pytest.raises(EyasError, match="holds a toy output made from other inputs or settings"):
        TOY.claim(Toy(out=out, size=2), {"input": "a"})
    (out / "notes.md").write_text("the user's")
    replaced = TOY.claim(Toy(out=out, size=2, overwrite=True), {"input": "a"})
    assert not replaced.resumed and not (out / "data-0.txt").exists() and (out / "notes.md").exists()


def test_a_progress_record_copied_into_a_fresh_directory_is_recognised(tmp_path: Path) -> None:
    key = TOY.claim(Toy(out=tmp_path / "a"), {}).key
    fresh = tmp_path / "b"
    fresh.mkdir()
    (fresh / "progress.json").write_text(json.dumps({"run_key": key}))
    assert TOY.claim(Toy(out=fresh), {}).resumed


@pytest.mark.parametrize("machinery", ["claim_output_dir(", "write_resolved_config(", "LineLog(",
                                       "splitlines(keepends=True)", '"run_key": sha256', "decisive = {"])
def test_no_stage_module_keeps_its_own_run_directory_code(machinery: str) -> None:
    homes = {"stage.py", "outputs.py", "config.py", "files.py"}
    found = [str(path.relative_to(SRC)) for path in SRC.rglob("*.py")
             if path.name not in homes and machinery in path.read_text(encoding="utf-8")]
    assert not found, f"{machinery} outside eyas.stage: {found}"


def _command(verb: str):  # noqa: ANN202 - typer's own (vendored) click command
    from eyas.cli import app

    return typer.main.get_command(app).commands[verb]  # type: ignore[attr-defined]


@pytest.mark.parametrize("verb", sorted(STAGE_CONFIGS))
def test_every_option_of_a_verb_is_its_configs_field(verb: str) -> None:
    fields = STAGE_CONFIGS[verb].model_fields
    params = {param.name: param for param in _command(verb).params}
    assert set(params) == {*fields, "config", "overrides"}
    for name, field in fields.items():
        param = params[name]
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if extra.get(ARGUMENT_KEY):
            assert param.param_type_name == "argument"
            continue
        assert param.param_type_name == "option" and param.opts == ["--" + name.replace("_", "-")]
        assert param.help.startswith(field.description or "")  # the help is the field's description
        if field.annotation is bool:
            assert param.secondary_opts == ["--no-" + name.replace("_", "-")]  # every boolean spelled alike


def test_flags_config_file_and_overrides_layer_the_same_fields(tmp_path: Path, run_cli) -> None:
    config_file = tmp_path / "eyas.yaml"
    config_file.write_text("export:\n  draft: /nowhere\n  format: vllm\n  out: /tmp/x\n")
    result = run_cli("export", "--config", config_file, "--format", "nonsense")
    assert result.code == 2 and "nonsense" in result.err
    result = run_cli("export", "--config", config_file, "export.speculative_tokens=0")
    assert result.code == 2 and "export.speculative_tokens" in result.err


def test_nested_stage_outputs_are_never_foreign_nor_removed(tmp_path: Path) -> None:
    """The demo's root holds the stages' own directories (each claimed by its stage): claiming the root,
    even a root left by an earlier eyas with no run key, must not remove them."""
    root = Stage("toy", "a toy output", ("data-*.txt",), nested=("features", "train"))
    out = tmp_path / "out"
    (out / "features").mkdir(parents=True)
    (out / "features" / "shard.safetensors").write_text("hours of work")
    (out / "data-0.txt").write_text("made before run.json existed")
    assert not root.claim(Toy(out=out), {}).resumed
    assert (out / "features" / "shard.safetensors").read_text() == "hours of work"
    assert not (out / "data-0.txt").exists()  # the root's own file of an unkeyed run goes, as for every stage
    (out / "stray.bin").write_text("?")
    with pytest.raises(EyasError, match="holds a toy output made from other inputs or settings"):
        root.claim(Toy(out=out, size=3), {})


# A run that stopped after claiming its output and before any work (an engine that did not start) leaves only
# its claim: the corrected rerun takes it over without --overwrite; any work of another run is still refused.
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
