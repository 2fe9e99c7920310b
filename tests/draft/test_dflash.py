"""The DFlash draft: training's blocks after every anchor (`block_steps`) against a dense reference written
here from the paper's and the engines' description, and against what the decoder drafts (`ContextCache`); and
deliberately wrong layouts (a causal block, a block that also sees its own anchor's feature) that must differ."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from eyas.decode.dflash import ContextCache
from eyas.draft.config import DraftConfig
from eyas.draft.dflash import DFlashDraft, block_steps

pytestmark = pytest.mark.usefixtures("one_thread")

BLOCK, LENGTH, MASK = 4, 11, 7


def tiny_dflash(layers: int = 2, seed: int = 0) -> DFlashDraft:
    torch.manual_seed(seed)
    config = DraftConfig.model_validate({
        "hidden_size": 32, "target_hidden_size": 24, "intermediate_size": 48, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 40, "draft_vocab_size": 40, "aux_layer_ids": [1, 2],
        "family": "dflash", "mask_token_id": MASK, "block_size": BLOCK, "num_hidden_layers": layers})
    draft = DFlashDraft(config).double().eval()
    with torch.no_grad():
        for name, parameter in draft.named_parameters():
            if name.endswith("norm.weight"):
                parameter.uniform_(0.5, 1.5)  # norms away from one, so a norm left out shows
            else:
                parameter.normal_(0, 0.3)
    return draft


def document(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(LENGTH, 48, generator=generator, dtype=torch.float64), \
        torch.randint(0, 40, (LENGTH,), generator=generator)


def dense_block(draft: DFlashDraft, aux: torch.Tensor, tokens: torch.Tensor, anchor: int, causal: bool = False,
                own_feature: bool = False) -> torch.Tensor:
    """Return `[S, V]`: the block after anchor t computed layer by layer with a plain softmax over the context's
    keys (features 0..t, or 0..t+1 with `own_feature`) and the block's (all of them, or causally)."""
    seen = anchor + 2 if own_feature else anchor + 1
    context = draft.hidden_norm(draft.fc(aux[:seen]))  # [C, H]
    slots = torch.cat([tokens[anchor + 1:anchor + 2], torch.full((BLOCK - 1,), MASK)])
    positions = torch.arange(anchor + 1, anchor + 1 + BLOCK)
    h = draft.embed_tokens(slots)  # [S, H]
    cos_c, sin_c = draft.rotary_emb(context[None], torch.arange(seen)[None])
    cos_b, sin_b = draft.rotary_emb(h[None], positions[None])
    for layer in draft.layers:
        attn, d = layer.self_attn, layer.head_dim
        x = layer.input_layernorm(h)
        q = attn.q_norm(attn.q_proj(x).view(BLOCK, -1, d)).transpose(0, 1)[None]
        kb = attn.k_norm(attn.k_proj(x).view(BLOCK, -1, d)).transpose(0, 1)[None]
        kc = attn.k_norm(attn.k_proj(context).view(seen, -1, d)).transpose(0, 1)[None]
        q, kb = apply_rotary_pos_emb(q, kb, cos_b, sin_b)
        _, kc = apply_rotary_pos_emb(kc, kc, cos_c, sin_c)
        vb = attn.v_proj(x).view(BLOCK, -1, d).transpose(0, 1)[None]
        vc = attn.v_proj(context).view(seen, -1, d).transpose(0, 1)[None]
        keys = torch.cat([kc, kb], dim=2).repeat_interleave(2, dim=1)
        values = torch.cat([vc, vb], dim=2).repeat_interleave(2, dim=1)
        mask = torch.ones(BLOCK, seen + BLOCK, dtype=torch.bool)
        if causal:
            mask[:, seen:] = torch.ones(BLOCK, BLOCK, dtype=torch.bool).tril()
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)  # [1, h, S, d]
        h = h + attn.o_proj(out[0].transpose(0, 1).reshape(BLOCK, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return draft.logits(h)


def trained(draft: DFlashDraft, aux: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Return `[S-1, T, V]`: `block_steps`' logits of every step at every anchor of one document."""
    with torch.no_grad():
        return torch.stack([logits[0] for logits in block_steps(
            draft, aux[None], tokens[None], torch.arange(LENGTH)[None], torch.zeros(1, LENGTH, dtype=torch.long),
            BLOCK - 1)])


@pytest.mark.parametrize("layers", [1, 2])
def test_training_blocks_are_the_dense_reference_and_what_the_decoder_drafts(layers: int) -> None:
    draft = tiny_dflash(layers)
    aux, tokens = document()
    steps = trained(draft, aux, tokens)
    for anchor in (0, 4, LENGTH - 2):
        with torch.no_grad():
            reference = dense_block(draft, aux, tokens, anchor)
        torch.testing.assert_close(steps[:, anchor], reference[1:], rtol=1e-5, atol=1e-5)  # rope angles are float32
        cache = ContextCache(draft)
        cache.add(aux[:anchor + 1], 0)
        torch.testing.assert_close(cache.block(int(tokens[anchor + 1]), anchor + 1)[1:], reference[1:].float(),
                                   rtol=1e-5, atol=1e-5)


def test_the_reference_tells_the_wrong_layouts_apart() -> None:
    draft = tiny_dflash()
    aux, tokens = document()
    steps = trained(draft, aux, tokens)
    with torch.no_grad():
        causal = dense_block(draft, aux, tokens, 4, causal=True)
        leaky = dense_block(draft, aux, tokens, 4, own_feature=True)
    assert (steps[:, 4] - causal[1:]).abs().max() > 1e-3
    assert (steps[:, 4] - leaky[1:]).abs().max() > 1e-3


def test_a_block_after_features_added_in_pieces_is_the_same_block() -> None:
    """The decoder adds each round's features as they come: the context built piecewise is the one built at once."""
    draft = tiny_dflash()
    aux, tokens = document()
    whole, pieces = ContextCache(draft), ContextCache(draft)
    whole.add(aux[:7], 0)
    pieces.add(aux[:3], 0)
    pieces.block(int(tokens[3]), 3)
    pieces.add(aux[3:5], 3)
    pieces.add(aux[5:7], 5)
    torch.testing.assert_close(pieces.block(int(tokens[7]), 7), whole.block(int(tokens[7]), 7))
    assert pieces.forwards == 2


def test_a_document_boundary_hides_the_other_documents_context() -> None:
    """Packed rows: a block of the second document sees none of the first's context."""
    draft = tiny_dflash()
    aux, tokens = document()
    doc_ids = torch.tensor([[0] * 5 + [1] * (LENGTH - 5)])
    positions = torch.tensor([list(range(5)) + list(range(LENGTH - 5))])
    with torch.no_grad():
        packed = torch.stack([logits[0] for logits in block_steps(draft, aux[None], tokens[None], positions, doc_ids,
                                                                  BLOCK - 1)])
        alone = torch.stack([logits[0] for logits in block_steps(draft, aux[None, 5:], tokens[None, 5:],
                                                                 torch.arange(LENGTH - 5)[None],
                                                                 torch.zeros(1, LENGTH - 5, dtype=torch.long), BLOCK - 1)])
    torch.testing.assert_close(packed[:, 5:LENGTH - 1], alone[:, :LENGTH - 6], rtol=1e-5, atol=1e-5)  # float32 rope angles
