"""`train.init_layer`: a draft layer started from a target decoder layer computes that layer.

Oracle: transformers' own forward of the target. With the embedding half of the first layer's q/k/v
zeroed, the draft layer started from target layer i, fed the target's input to layer i as its feature,
must give the target's output of layer i (attention, rope, residuals, MLP and norms all placed right).
A deliberately wrong placement (the target's projections in the embedding half) must not.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eyas.draft.attention import EagerTTTAttention
from eyas.draft.config import draft_config_for_target
from eyas.draft.layer_init import FEATURE_HALF, init_from_target_layer
from eyas.draft.model import Eagle3Draft, set_embedding
from eyas.errors import EyasError
from eyas.models.head import load_target_layer
from eyas.models.load import load_config, load_target

LAYER = 1  # a middle layer: transformers' hidden_states[i + 1] is its raw output (the last one's is normed)


def _draft_and_target(target: Path) -> tuple[Eagle3Draft, torch.nn.Module]:
    config = load_config(target)
    draft = Eagle3Draft(draft_config_for_target(config, [0, 1, 2], 64, None))
    parts = load_target(target, torch.float32, "cpu")
    set_embedding(draft, parts.embed.weight.detach())
    return draft, parts.model


def _layer_output(draft: Eagle3Draft, hidden: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Return the draft's step-0 output `[1, T, H]` for feature `hidden [1, T, H]` and tokens `ids [1, T]`."""
    positions = torch.arange(ids.shape[1])[None]  # [1, T]
    attention = EagerTTTAttention(torch.zeros_like(ids))
    return draft.step(hidden, ids, positions, draft.new_kv(), attention)


@torch.no_grad()
def test_a_draft_layer_started_from_a_target_layer_computes_it(weighted_target) -> None:
    torch.manual_seed(0)
    target = weighted_target("llama")
    draft, model = _draft_and_target(target)
    init_from_target_layer(draft.layers[0], load_target_layer(target, LAYER, torch.float32), "test")
    ids = torch.randint(0, 200, (1, 12))  # [1, T]
    states = model(input_ids=ids, output_hidden_states=True).hidden_states
    H = draft.config.hidden_size
    attention = draft.layers[0].self_attn
    for name in FEATURE_HALF:
        dict(draft.layers[0].named_parameters())[name][:, :H] = 0  # the embedding half: nothing of the token

    got = _layer_output(draft, states[LAYER], ids)
    torch.testing.assert_close(got, states[LAYER + 1], atol=1e-5, rtol=1e-5)

    for projection in (attention.q_proj, attention.k_proj, attention.v_proj):  # wrong: the target's in the embedding half
        projection.weight[:, :H], projection.weight[:, H:] = projection.weight[:, H:].clone(), 0
    wrong = _layer_output(draft, states[LAYER], ids)
    assert (wrong - states[LAYER + 1]).abs().max() > 1e-2


def test_the_embedding_half_and_its_norm_keep_their_initialisation(weighted_target) -> None:
    target = weighted_target("llama")
    draft, _ = _draft_and_target(target)
    layer = draft.layers[0]
    before = layer.self_attn.q_proj.weight.detach().clone()
    weights = load_target_layer(target, -1, torch.float32)
    init_from_target_layer(layer, weights, "test")
    H = draft.config.hidden_size
    assert torch.equal(layer.self_attn.q_proj.weight[:, :H], before[:, :H])
    assert torch.equal(layer.self_attn.q_proj.weight[:, H:], weights["self_attn.q_proj.weight"])
    assert torch.equal(layer.hidden_norm.weight, weights["input_layernorm.weight"])
    assert torch.equal(layer.input_layernorm.weight, torch.ones(H))
    assert torch.equal(layer.mlp.down_proj.weight, weights["mlp.down_proj.weight"])


@pytest.mark.parametrize(("architecture", "tensor"), [("qwen2", "self_attn.q_proj.bias"), ("qwen3", "self_attn.q_norm.weight")])
def test_a_layer_the_draft_cannot_hold_whole_is_refused(weighted_target, architecture: str, tensor: str) -> None:
    target = weighted_target(architecture)
    draft, _ = _draft_and_target(target)
    with pytest.raises(EyasError, match=f"init_layer 0: {tensor}: the draft's decoder layer has no such tensor"):
        init_from_target_layer(draft.layers[0], load_target_layer(target, 0, torch.float32), "init_layer 0")


def test_a_layer_index_outside_the_target_is_refused(weighted_target) -> None:
    with pytest.raises(EyasError, match=r"init_layer: 8: the target has 8 decoder layers \(0\.\.7, or -1 for the last\)"):
        load_target_layer(weighted_target("llama"), 8, torch.float32)
