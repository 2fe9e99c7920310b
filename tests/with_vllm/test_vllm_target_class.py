"""The real vLLM asked, before any weight loads, which class builds a target and whether it implements EAGLE-3's
auxiliary hidden states (`SupportsEagle3`), and an engine that does not start refused in one line.

The oracles are vLLM's own: its registry and `supports_eagle3` (model_class.py asks them through vLLM's
`ModelConfig`), and its engine refusing a target whose config names a quantization it does not know. Gemma-2
is an architecture vLLM 0.32 builds natively without SupportsEagle3 (gemma2.py: SupportsLoRA, SupportsPP)
and its Transformers backend serves; the targets here are configs only, or 2-head tiny models.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import get_args

import pytest
import torch

from eyas.backends.vllm.startup import EngineRefused, ModelImpl
from eyas.testing.tiny import build_tiny_target, save_spaced_draft

CHAT = Path(__file__).resolve().parents[2] / "examples" / "data" / "chat.jsonl"


def _with_architecture(target: Path, architecture: str) -> Path:
    """`target` with `architectures` in its config.json (a weightless tiny config has none; vLLM reads it)."""
    path = target / "config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "architectures": [architecture]}))
    return target


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A weightless tiny Gemma-2 target (config and tokenizer only) and an eyas draft for it exported for vLLM."""
    from eyas.config import ExportConfig
    from eyas.export.writer import run_export

    root = tmp_path_factory.mktemp("gemma2")
    target = _with_architecture(build_tiny_target(root / "target", architecture="gemma2", num_layers=4,
                                                  attention_heads=2), "Gemma2ForCausalLM")
    run_export(ExportConfig(draft=save_spaced_draft(target, root / "draft"), format="vllm", out=root / "published",
                            target=target))
    assert not list(target.glob("*.safetensors"))  # nothing to load: the check reads the config only
    return {"target": target, "published": root / "published"}


def test_model_impl_choices_are_vllms() -> None:
    from vllm.config.model import ModelImpl as VllmModelImpl

    assert set(get_args(ModelImpl)) <= set(get_args(VllmModelImpl))  # vLLM 0.32: a Literal (also "terratorch")


def test_vllms_registry_gives_the_class_and_its_eagle3_interface(gemma2: dict[str, Path], tmp_path: Path) -> None:
    from eyas.backends.vllm.model_class import served_class

    native = served_class(gemma2["target"], "auto")
    assert (native.name, native.eagle3) == ("Gemma2ForCausalLM", False)
    assert served_class(gemma2["target"], "vllm") == native
    backend = served_class(gemma2["target"], "transformers")
    assert (backend.name, backend.eagle3) == ("TransformersForCausalLM", True)
    llama = _with_architecture(build_tiny_target(tmp_path / "llama", num_layers=4, attention_heads=2),
                               "LlamaForCausalLM")
    assert served_class(llama, "auto").eagle3  # vLLM's LlamaForCausalLM implements SupportsEagle3
    config = json.loads((llama / "config.json").read_text())
    (llama / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "gguf"}}))
    with pytest.raises(EngineRefused, match=rf"^{llama}: vLLM refused to start it: Unknown quantization method: gguf$"):
        served_class(llama, "auto")


def test_check_draft_refuses_the_native_class_and_passes_the_transformers_backend(gemma2: dict[str, Path],
                                                                                  eyas_process) -> None:
    args = ("check-draft", gemma2["published"], "--target", gemma2["target"], "--engine", "vllm")
    native = eyas_process(*args, timeout=300)
    assert native.returncode == 1, native.stdout + native.stderr[-2000:]
    assert "1 problem(s)" in native.stdout and "Traceback" not in native.stderr
    line = next(line for line in native.stdout.splitlines() if "SupportsEagle3" in line)
    assert "vLLM builds it as Gemma2ForCausalLM (model_impl=auto)" in line
    assert line.endswith("give model_impl=transformers (vLLM's Transformers backend, TransformersForCausalLM, "
                         "implements it)")
    chosen = eyas_process(*args, "--model-impl", "transformers", timeout=300)
    assert chosen.returncode == 0 and "no problems found" in chosen.stdout, chosen.stdout + chosen.stderr[-2000:]


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("eyas: error:")]


def test_an_engine_that_does_not_start_is_one_line_and_the_fixed_rerun_takes_the_out(eyas_process,
                                                                                      tmp_path: Path) -> None:
    target = build_tiny_target(tmp_path / "target", with_weights=True, attention_heads=2)
    config_path = target / "config.json"
    good = config_path.read_text()
    config_path.write_text(json.dumps({**json.loads(good), "quantization_config": {"quant_method": "gguf"}}))
    prepared = eyas_process("prepare", "--target", target, "--data", CHAT, "--out", tmp_path / "ds", "--max-length", "48")
    assert prepared.returncode == 0, prepared.stderr[-2000:]
    args = ("extract", "--target", target, "--data", tmp_path / "ds", "--out", tmp_path / "x", "--backend", "vllm",
            "--device", "cpu", "--dtype", "float32", "--storage-dtype", "fp32")
    failed = eyas_process(*args, timeout=300)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stderr[-3000:]
    assert _error_lines(failed.stderr) == [
        f"eyas: error: {target}: vLLM refused to start it: Unknown quantization method: gguf"]
    assert (tmp_path / "x" / "run.json").is_file()  # claimed before the engine start failed
    config_path.write_text(good)  # the fix changes the target's fingerprint, hence the run key
    fixed = eyas_process(*args, timeout=600)
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert eyas_process("verify", tmp_path / "x").returncode == 0


def test_the_transformers_backend_serves_the_learned_draft_with_eyas_tau(vllm_pair: dict[str, Path]) -> None:
    """`model_impl=transformers` (vLLM's Transformers backend, its own SupportsEagle3) serves the on-policy pair's
    draft: its tau (vLLM's counters) agrees with eyas's replayed chain on the same prompt ids, as vLLM's native
    Llama class does (test_serve.py)."""
    from eyas.config import EvalConfig
    from eyas.data.prompts import target_eos_ids
    from eyas.decode.prompts import read_prompts
    from eyas.decode.replay import greedy_continuations, pooled_chain_tau
    from eyas.decode.served import served_draft_tau
    from eyas.draft.model import load_draft
    from eyas.models.load import load_target
    from eyas.models.tokenizer import load_tokenizer

    target, draft_dir = vllm_pair["target"], vllm_pair["run"] / "final"
    tokenizer = load_tokenizer(target)
    prompts = read_prompts(vllm_pair["prompts"], tokenizer, 6)
    stop = target_eos_ids(target, tokenizer)
    config = EvalConfig(target=target, draft=draft_dir, prompts=vllm_pair["prompts"], out=draft_dir / "unused",
                        chain=3, max_new_tokens=48, dtype="float32", engine="vllm", model_impl="transformers")
    served = served_draft_tau(config, {"held-out": prompts}, stop)["held-out"]
    parts = load_target(target, torch.float32, "cpu")
    draft = load_draft(draft_dir, parts.embed.weight.detach()).eval()
    replayed = pooled_chain_tau(draft, greedy_continuations(parts, prompts, 48, draft.config.aux_layer_ids), 3, stop)
    figures = f"vLLM (Transformers backend) tau {served.tau:.3f}, eyas replay {replayed['tau']:.3f}"
    assert served.tau > 1.3 and abs(served.tau / replayed["tau"] - 1) <= 0.10, figures
    assert served.drafts > 0 and len(served.per_position_acceptance) == 3


def test_extraction_refuses_the_transformers_backend_before_the_engine_starts(eyas_process, tmp_path: Path) -> None:
    target = build_tiny_target(tmp_path / "target", with_weights=True, attention_heads=2)
    assert eyas_process("prepare", "--target", target, "--data", CHAT, "--out", tmp_path / "ds",
                        "--max-length", "32").returncode == 0
    done = eyas_process("extract", "--target", target, "--data", tmp_path / "ds", "--out", tmp_path / "x",
                        "--backend", "vllm", "--device", "cpu", "--model-impl", "transformers", timeout=300)
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert _error_lines(done.stderr) == [
        f"eyas: error: {target}: vLLM builds it with its Transformers backend (TransformersForCausalLM, "
        "model_impl=transformers); eyas's vLLM extraction hooks read vLLM's own decoder layers: give --model-impl "
        "vllm where vLLM has a class of its own, or --backend hf"]
    assert not list((tmp_path / "x").glob("shard-*"))
