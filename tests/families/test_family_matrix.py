"""Every target family users train drafts for, as a tiny random target, through every stage of the CLI:
prepare -> extract (HF) -> train -> eval (a chain, a tree and the auto shape) -> export (every format) ->
check-draft. Each stage's outcome is compared with tests/families/matrix.py, whose table docs/families.md
holds.

Eval decodes greedily in float32, so the speculative output must be the target alone's token for token on
every prompt and shape; the prompts are longer than the sliding window of Gemma-3 and GPT-OSS (8 tokens),
so their trees and auto rounds verify past the window (this test on the code before 2026-12-07's fix found
Gemma-3 tree and auto 1/3 prompts identical, GPT-OSS tree 0/3 and auto 2/3: the over-wide mask changed even
the token a verification commits when no draft token is accepted). The target alone is held to transformers' own greedy
`generate` (the oracle eval's comparison rests on). The drafts are trained 40 steps on random targets, so
they are accepted little or not at all (tau 1.0-1.9): acceptance is not what this matrix measures.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import write_jsonl
from matrix import EXAMPLES, FAMILIES, HF_STAGES, NEW_TOKENS, PASS, PROMPTS, TRAIN, Family, documented_table, table

from eyas.decode.decoder import Decoder
from eyas.decode.prompts import read_prompts
from eyas.decode.sampling import Sampling
from eyas.models.load import load_target
from eyas.models.tokenizer import load_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

SHAPES = {"eval chain": ("--chain", "3"), "eval tree": ("--tree", "3,2,5"), "eval auto": ()}
NOT_REACHED = "not reached"


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("family-prompts") / "prompts.jsonl", PROMPTS)


def failed(result, stage: str) -> str:
    """The outcome of a stage that exited non-zero: its exit code and last line of stderr."""
    lines = (result.err or result.out).strip().splitlines() or [""]
    return f"✗ {stage}: exit {result.code}: {lines[-1]}"


def run_family(target: Path, prompts: Path, root: Path, run_cli) -> dict[str, str]:
    """Run a tiny target through HF_STAGES; return each stage's outcome (PASS or why not). A stage whose input
    a failed stage should have made is NOT_REACHED."""
    found = dict.fromkeys(HF_STAGES, NOT_REACHED)
    steps = [("prepare", ("prepare", "--target", target, "--data", EXAMPLES, "--out", root / "ds",
                          "--draft-vocab-size", "200")),
             ("extract (HF)", ("extract", "--target", target, "--data", root / "ds", "--out", root / "store",
                               "--dtype", "float32", "--storage-dtype", "fp32", "--device", "cpu")),
             ("train", ("train", "--features", root / "store", "--out", root / "run", *TRAIN))]
    for stage, args in steps:
        result = run_cli(*args)
        found[stage] = PASS if result.code == 0 else failed(result, stage)
        if result.code != 0:
            return found
    draft = root / "run" / "final"
    for stage, shape in SHAPES.items():
        out = root / stage.replace(" ", "-")
        result = run_cli("eval", "--target", target, "--draft", draft, "--prompts", prompts, "--out", out,
                         "--max-new-tokens", str(NEW_TOKENS), "--dtype", "float32", "--device", "cpu", *shape)
        if result.code != 0:
            found[stage] = failed(result, stage)
            continue
        report = json.loads((out / "report.json").read_text())
        same = f"{report['same_as_baseline']}/{report['prompts']}"
        found[stage] = PASS if same == f"{len(PROMPTS)}/{len(PROMPTS)}" else f"✗ outputs identical to the target alone {same}"
    found["export + check-draft"] = exported(target, draft, root, run_cli)
    return found


def exported(target: Path, draft: Path, root: Path, run_cli) -> str:
    """Export `draft` in every format; check the vLLM and SGLang exports for their engines; return the outcome."""
    for form in ("vllm", "sglang", "speculators"):
        result = run_cli("export", "--draft", draft, "--format", form, "--out", root / f"export-{form}", "--target", target)
        if result.code != 0:
            return failed(result, f"export --format {form}")
    for engine in ("vllm", "sglang"):
        result = run_cli("check-draft", root / f"export-{engine}", "--target", target, "--engine", engine)
        if result.code != 0 or "no problems found" not in result.out:
            return failed(result, f"check-draft --engine {engine}")
    return PASS


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_family_through_every_stage(family: Family, weighted_target, prompts: Path, run_cli, tmp_path: Path) -> None:
    target = weighted_target(family.architecture)
    window = json.loads((target / "config.json").read_text()).get("sliding_window")
    rows = read_prompts(prompts, load_tokenizer(target))
    if window:  # every verification runs past the window
        assert min(map(len, rows)) > 3 * window, (window, [len(r) for r in rows])
    found = run_family(target, prompts, tmp_path, run_cli)
    assert found == dict(zip(HF_STAGES, family.hf)), json.dumps(found, indent=1, ensure_ascii=False)
    # the oracle behind "identical": eyas's target-alone loop is transformers' own greedy decoding
    parts = load_target(target, torch.float32, "cpu")
    for row in rows:
        ids = torch.tensor([row])
        reference = parts.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                         do_sample=False, eos_token_id=None, pad_token_id=0, temperature=None,
                                         top_p=None, top_k=None)[0, len(row):].tolist()
        assert Decoder(parts, None, None, Sampling(), set()).generate(row, NEW_TOKENS).tokens == reference


def test_docs_hold_the_matrix() -> None:
    expected = table()
    assert documented_table() == expected, f"docs/families.md: the matrix between its markers must read:\n{expected}"
