"""Exact verification on every attention layout transformers models have, past the window.

Tiny random targets with a window (or chunk) of 6 tokens and 40-token prompts: Gemma-3 (sliding
and full layers), GPT-OSS (sliding and full, attention sinks, MoE), Mistral (every layer
sliding), Qwen3 with sliding layers above `max_window_layers`, Llama-4 (chunked and full), and
Llama (full) as the control.

The oracle is transformers itself: every node of a verified tree must get the logits the target
computes for that node's path in one plain forward, and decoding with every shape (chain, tree,
the auto shape under flat costs, which verifies a draft chain and a lookup branch as one tree)
must equal `generate`. The drafts are oracles too (the target's own continuation plus a decoy at
every depth), so deep paths are accepted and the masks of nodes far past the window are used.
Each test is shown to have power: the position-only causal rule (the mask eyas used to build)
fails it on every windowed layout.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from eyas.decode import auto as auto_module
from eyas.decode.costs import RoundCosts
from eyas.decode.decoder import Decoder
from eyas.decode.drafting import TreeDrafter
from eyas.decode.proposers import ProposerTally
from eyas.decode.rounds import Context, Outcome, Proposal
from eyas.decode.runners import TargetRunner
from eyas.decode.sampling import Sampling
from eyas.decode.shapes import AutoShape, TreeShape
from eyas.decode.tree import DraftTree, chain_union
from eyas.decode.visibility import AttentionLayout, attention_layout
from eyas.draft.config import draft_config_for_target
from eyas.draft.model import Eagle3Draft
from eyas.errors import EyasError
from eyas.models.parts import TargetParts, locate_parts

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, WINDOW, PROMPT, NEW_TOKENS = 128, 6, 40, 24
_SIZES = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False, pad_token_id=0,
              bos_token_id=1, eos_token_id=2)
ALTERNATING = ["sliding_attention", "full_attention"] * 2
# model_type -> (config overrides, dtype); GPT-OSS's grouped expert matmul has no float64 kernel
LAYOUTS: dict[str, tuple[dict[str, Any], torch.dtype]] = {
    "llama": ({}, torch.float64),
    "gemma3_text": ({"head_dim": 16, "sliding_window": WINDOW, "layer_types": ALTERNATING, "query_pre_attn_scalar": 16},
                    torch.float64),
    "gpt_oss": ({"head_dim": 16, "sliding_window": WINDOW, "layer_types": ALTERNATING, "num_local_experts": 4,
                 "num_experts_per_tok": 2}, torch.float32),
    "mistral": ({"sliding_window": WINDOW}, torch.float64),
    "qwen3": ({"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 2}, torch.float64),
    "llama4_text": ({"attention_chunk_size": WINDOW, "head_dim": 16, "num_local_experts": 2, "num_experts_per_tok": 1,
                     "intermediate_size_mlp": 128, "no_rope_layers": [1, 0, 1, 0], "interleave_moe_layer_step": 2},
                    torch.float64),
}
WINDOWED = [name for name in LAYOUTS if name != "llama"]


def _target(model_type: str) -> TargetParts:
    from transformers import AutoConfig, AutoModelForCausalLM

    overrides, dtype = LAYOUTS[model_type]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **{**_SIZES, **overrides}))
    for parameter in model.parameters():  # wide weights: peaked, distinct logits (no near-ties)
        if parameter.dim() > 1:
            torch.nn.init.normal_(parameter, std=0.2)
    return locate_parts(model.to(dtype).eval())


@pytest.fixture(scope="module")
def targets() -> dict[str, TargetParts]:
    return {name: _target(name) for name in LAYOUTS}


def _prompt(seed: int) -> list[int]:
    return torch.randint(3, VOCAB, (PROMPT,), generator=torch.Generator().manual_seed(seed)).tolist()


def _greedy(parts: TargetParts, prompt: list[int], new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = parts.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                               pad_token_id=0, eos_token_id=None, temperature=None, top_p=None, top_k=None)
    return out[0, len(prompt):].tolist()


def _path_logits(parts: TargetParts, sequence: list[int]) -> torch.Tensor:
    """The target's logits `[V]` after `sequence`, from one plain forward (its own masks)."""
    with torch.inference_mode():
        return parts.model(input_ids=torch.tensor([sequence])).logits[0, -1].double()


def _oracle_tree(continuation: list[int], depth: int) -> DraftTree:
    """The true continuation as a chain of `depth` nodes with a decoy sibling before each node, and a decoy
    child under each decoy; node order interleaves them, so kept paths are not a prefix of the nodes."""
    tokens, parents, depths = [], [], []
    previous = -1
    for d in range(depth):
        decoy = (continuation[d] + 1) % VOCAB
        tokens += [decoy, continuation[d]]
        parents += [previous, previous]
        depths += [d + 1, d + 1]
        if d + 1 < depth:
            tokens.append((continuation[d + 1] + 7) % VOCAB)
            parents.append(len(tokens) - 3)  # under the decoy
            depths.append(d + 2)
        previous = len(tokens) - (2 if d + 1 < depth else 1)
    scores = -torch.tensor(depths, dtype=torch.float64)
    return DraftTree(torch.tensor(tokens), torch.tensor(parents), torch.tensor(depths), scores)


def _verify_against_plain_forwards(parts: TargetParts, prompt: list[int], depth: int) -> float:
    """Verify an oracle tree after `prompt` with the runner, keep its true path, take one more plain step;
    return the largest difference from the plain forwards of each node's path."""
    continuation = _greedy(parts, prompt, depth + 2)
    tree = _oracle_tree(continuation, depth)
    runner = TargetRunner(parts, None)
    runner.forward(torch.tensor(prompt[:-1]), torch.arange(PROMPT - 1))
    visible = torch.zeros(len(tree) + 1, len(tree) + 1, dtype=torch.bool)
    visible[:, 0] = True
    visible[1:, 1:] = tree.ancestor_mask()
    positions = torch.cat([torch.tensor([PROMPT - 1]), PROMPT - 1 + tree.depths])
    step = runner.forward(torch.cat([torch.tensor(prompt[-1:]), tree.tokens]), positions, visible)
    worst = (step.logits[0].double() - _path_logits(parts, prompt)).abs().max().item()
    for node in range(len(tree)):
        path = tree.tokens[tree.path_to(node)].tolist()
        worst = max(worst, (step.logits[node + 1].double() - _path_logits(parts, prompt + path)).abs().max().item())
    kept, node = [0], -1  # the root, then the true child at each depth
    for token in continuation[:depth]:
        node = next(child for child in tree.children(node) if int(tree.tokens[child]) == token)
        kept.append(node + 1)
    assert kept != list(range(len(kept)))  # the kept path is not a prefix of the nodes: entries move
    runner.keep(len(tree) + 1, kept)
    after = runner.forward(torch.tensor([continuation[depth]]), torch.tensor([PROMPT - 1 + depth + 1]))
    reference = _path_logits(parts, prompt + continuation[:depth + 1])
    return max(worst, (after.logits[0].double() - reference).abs().max().item())


def _tolerance(parts: TargetParts) -> float:
    """The runner returns float32 logits: float32 rounding for a float64 target, float32 accumulation otherwise."""
    return 1e-5 if parts.lm_head.weight.dtype == torch.float64 else 1e-3


@pytest.mark.parametrize("model_type", list(LAYOUTS))
def test_every_tree_node_gets_the_logits_of_its_path(targets, model_type: str) -> None:
    parts = targets[model_type]
    for seed, depth in ((0, 3), (1, WINDOW + 2)):  # a tree deeper than the window too
        assert _verify_against_plain_forwards(parts, _prompt(seed), depth) < _tolerance(parts), (model_type, depth)


@pytest.mark.parametrize("model_type", WINDOWED)
def test_the_position_only_causal_mask_is_caught(targets, model_type: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Power: the mask without the layer types' windows (what eyas used to pass) fails the same check."""
    parts = targets[model_type]
    monkeypatch.setattr(AttentionLayout, "allowed", lambda self, kind, query, key: key[None, :] <= query[:, None])
    assert _verify_against_plain_forwards(parts, _prompt(0), 3) > 0.1


def _oracle_drafts(monkeypatch: pytest.MonkeyPatch, reference: list[int]) -> None:
    """Make the draft propose `reference` (the prompt and the target's continuation) after every root: as a chain
    for chain shapes, else with decoys (`_oracle_tree`)."""
    def grow(self: TreeDrafter, root: Any, root_anchor: int) -> DraftTree:
        start = root_anchor + 2  # the root sits at position root_anchor + 1
        proposed = reference[start:start + self.shape.depth]
        return chain_union(proposed, []) if self.shape.chain else _oracle_tree(proposed, self.shape.depth)

    def chain(drafter: Any, root: Any, root_anchor: int, length: int, target_ids: torch.Tensor) -> list[int]:
        return reference[root_anchor + 2:root_anchor + 2 + length]

    monkeypatch.setattr(TreeDrafter, "grow", grow)
    monkeypatch.setattr(auto_module, "draft_chain", chain)


def _draft_for(parts: TargetParts) -> Eagle3Draft:
    config = draft_config_for_target(parts.model.config, [0, 1, 2], VOCAB, None, {"num_hidden_layers": 1})
    return Eagle3Draft(config).to(parts.lm_head.weight.dtype).eval()


FLAT = RoundCosts.linear(base=1.0, per_token=0.0, draft_step=0.0)
SHAPES = {"plain": None, "chain": TreeShape.chain_of(4), "tree": TreeShape(4, 3, 12), "auto-flat": AutoShape(4, 8)}


@pytest.mark.parametrize("shape_name", list(SHAPES))
@pytest.mark.parametrize("model_type", list(LAYOUTS))
def test_every_shape_decodes_what_generate_does(targets, model_type: str, shape_name: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    parts, shape = targets[model_type], SHAPES[shape_name]
    draft = _draft_for(parts) if shape is not None else None
    for seed in (2, 3):
        prompt = _prompt(seed)
        expected = _greedy(parts, prompt, NEW_TOKENS + 8)
        _oracle_drafts(monkeypatch, prompt + expected)
        decoder = Decoder(parts, draft, shape, Sampling(), set(), costs=FLAT if isinstance(shape, AutoShape) else None)
        generated = decoder.generate(prompt, NEW_TOKENS)
        assert generated.tokens == expected[:NEW_TOKENS], (model_type, shape_name, seed)
        if shape is not None:
            assert max(generated.accepted) >= 3  # deep paths, far past the window, were verified and kept


class OracleProposer:
    """A proposer written outside eyas against its protocol (eyas.decode.proposers): the true continuation with
    decoys as a tree, no draft and no target features."""

    aux_layer_ids = None

    def __init__(self, reference: list[int], depth: int) -> None:
        self.reference, self.depth = reference, depth

    def start(self, context: Context, prefill: Any, target: Any) -> OracleProposer:
        return self

    def propose(self, context: Context) -> Proposal:
        start = context.root_position + 1
        tree = _oracle_tree(self.reference[start:start + self.depth], self.depth)
        return Proposal(tree, drafted=len(tree))

    def observe(self, context: Context, outcome: Outcome) -> None:
        assert outcome.committed[:len(outcome.verdict.accepted)] == self.reference[outcome.position + 1:][
            :len(outcome.verdict.accepted)]

    def finish(self) -> ProposerTally:
        return ProposerTally()


@pytest.mark.parametrize("model_type", list(LAYOUTS))
def test_a_proposer_of_ones_own_runs_in_the_same_loop(targets, model_type: str) -> None:
    """Adding a proposer touches no loop: given to the decoder, it is verified exactly like eyas's own."""
    parts = targets[model_type]
    prompt = _prompt(4)
    expected = _greedy(parts, prompt, NEW_TOKENS + 8)
    generated = Decoder(parts, None, None, Sampling(), set(), proposer=OracleProposer(prompt + expected, 4)
                        ).generate(prompt, NEW_TOKENS)
    assert generated.tokens == expected[:NEW_TOKENS] and min(generated.accepted[:-1]) == 4


def test_layouts_are_read_as_transformers_reads_them(targets) -> None:
    layouts = {name: attention_layout(parts.model.config) for name, parts in targets.items()}
    assert layouts["llama"] == AttentionLayout(("full_attention",))
    assert layouts["mistral"] == AttentionLayout(("sliding_attention",), sliding_window=WINDOW)
    assert layouts["gemma3_text"] == AttentionLayout(("full_attention", "sliding_attention"), sliding_window=WINDOW)
    assert layouts["llama4_text"] == AttentionLayout(("chunked_attention", "full_attention"), chunk_size=WINDOW)
    assert layouts["gpt_oss"].describe() == "full_attention + sliding_attention (window 6)"


def test_a_layer_type_without_a_trimmable_cache_is_refused_before_decoding() -> None:
    from transformers import AutoConfig

    config = AutoConfig.for_model("llama", **_SIZES)
    config.layer_types = ["linear_attention", "full_attention"] * 2
    with pytest.raises(EyasError, match="layer types linear_attention cannot be"):
        attention_layout(config)
    config.layer_types = ["sliding_attention"] * 4
    config.sliding_window = None
    with pytest.raises(EyasError, match="sliding_window: None; sliding_attention layers need a positive size"):
        attention_layout(config)
