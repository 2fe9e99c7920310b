"""TTT attention: the fast paths (`EagerTTTAttention`, `FlexTTTAttention`) equal a plain reference
that concatenates every step's keys and masks a dense `[T, (j+1)T]` score matrix; documents of a
packed row never see each other; the diagonal terms of earlier steps are where they belong."""

from __future__ import annotations

import pytest
import torch
import transformers

from eyas.draft.attention import (
    AttentionFactory,
    EagerTTTAttention,
    FlexTTTAttention,
    default_attention,
)
from eyas.draft.config import draft_config_for_target
from eyas.draft.model import Eagle3Draft
from eyas.draft.objective import StepScorer, Teacher, step_validity, weighted_objective
from eyas.draft.ttt import unroll

pytestmark = pytest.mark.usefixtures("one_thread")

STEPS = 7
VOCAB, DRAFT_VOCAB, HIDDEN = 64, 24, 32
FLEX_WARNING = "ignore:flex_attention called without torch.compile"
# Documents of each packed row as (doc id, length); the rest of the row is padding (doc id -1).
ROWS = [[(0, 9), (1, 8)], [(0, 6), (1, 11), (2, 5)]]
LENGTH = 24


class DenseTTTAttention:
    """The reference: at step j, keys/values of steps 0..j concatenated along the sequence axis
    (`[B, kv, (j+1)T, d]`), one dense `[T, (j+1)T]` bool mask, softmax attention.

    Block 0 of the mask is causal AND same document; block i >= 1 is the identity (query t sees
    key t of step i). `diagonal` selects deliberately wrong variants, to show the tests catch them:
    "none" drops the diagonal blocks, "latest" keeps only the current step's, "previous" puts each
    diagonal one position early (query t sees key t-1 of step i).
    """

    def __init__(self, doc_ids: torch.Tensor, diagonal: str = "identity") -> None:
        self.doc_ids = doc_ids
        self.diagonal = diagonal

    def mask(self, steps: int) -> torch.Tensor:
        """Return `[B, 1, T, steps*T]` bool."""
        B, T = self.doc_ids.shape
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        same_doc = self.doc_ids[:, :, None] == self.doc_ids[:, None, :]  # [B, T, T]
        blocks = [causal & same_doc]
        for i in range(1, steps):
            if self.diagonal == "none" or (self.diagonal == "latest" and i < steps - 1):
                block = torch.zeros(T, T, dtype=torch.bool)
            elif self.diagonal == "previous":
                block = torch.zeros(T, T, dtype=torch.bool)
                block[torch.arange(1, T), torch.arange(T - 1)] = True  # query t sees key t-1 (query 0: none)
            else:
                block = torch.eye(T, dtype=torch.bool)
            blocks.append(block.expand(B, T, T))
        return torch.cat(blocks, dim=-1)[:, None]

    def __call__(self, q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
        B, heads, _, d = q.shape
        k = torch.cat(keys, dim=2)  # [B, kv, (j+1)T, d]
        v = torch.cat(values, dim=2)
        kv_heads = k.shape[1]
        groups = heads // kv_heads  # query head h reads kv head h // groups
        k = k[:, :, None].expand(B, kv_heads, groups, *k.shape[2:]).reshape(B, heads, *k.shape[2:])
        v = v[:, :, None].expand(B, kv_heads, groups, *v.shape[2:]).reshape(B, heads, *v.shape[2:])
        scores = (q @ k.transpose(-1, -2)) / d**0.5  # [B, h, T, (j+1)T]
        scores = scores.masked_fill(~self.mask(len(keys)), float("-inf"))
        return scores.softmax(dim=-1) @ v


def make_draft(heads: int = 4, kv_heads: int = 2, layers: int = 1, seed: int = 0) -> Eagle3Draft:
    target = transformers.LlamaConfig(hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_attention_heads=heads,
                                      num_key_value_heads=kv_heads, head_dim=HIDDEN // heads, vocab_size=VOCAB,
                                      num_hidden_layers=6, max_position_embeddings=128)
    config = draft_config_for_target(target, aux_layer_ids=[2, 4, 5], draft_vocab_size=DRAFT_VOCAB, target=None,
                                     overrides={"num_hidden_layers": layers})
    assert (config.num_attention_heads, config.num_key_value_heads) == (heads, kv_heads)
    assert config.num_hidden_layers == layers
    draft = Eagle3Draft(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if p.dim() == 1:  # norm weights
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=generator))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=generator))
        ids = torch.randperm(VOCAB, generator=generator)[:DRAFT_VOCAB].sort().values
        draft.d2t.copy_(ids - torch.arange(DRAFT_VOCAB))
        draft.t2d.zero_()
        draft.t2d[ids] = True
    assert torch.equal(draft.to_target_ids(torch.arange(DRAFT_VOCAB)), ids)
    return draft


def packed_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Two packed rows: several documents each, position ids restarting per document, right padding."""
    generator = torch.Generator().manual_seed(seed)
    doc_ids = torch.full((len(ROWS), LENGTH), -1)
    position_ids = torch.zeros(len(ROWS), LENGTH, dtype=torch.long)
    for b, docs in enumerate(ROWS):
        start = 0
        for doc, length in docs:
            doc_ids[b, start:start + length] = doc
            position_ids[b, start:start + length] = torch.arange(length)
            start += length
        assert start < LENGTH  # every row ends in padding
    loss_mask = (torch.rand(len(ROWS), LENGTH, generator=generator) < 0.8) & (doc_ids >= 0)
    return {
        "aux": torch.randn(len(ROWS), LENGTH, 3 * HIDDEN, generator=generator),
        "input_ids": torch.randint(0, VOCAB, (len(ROWS), LENGTH), generator=generator),
        "position_ids": position_ids,
        "doc_ids": doc_ids,
        "loss_mask": loss_mask,
    }


def run_unroll(draft: Eagle3Draft, batch: dict[str, torch.Tensor], attention: AttentionFactory | None = None
               ) -> list[torch.Tensor]:
    return list(unroll(draft, batch["aux"], batch["input_ids"], batch["position_ids"], batch["doc_ids"], STEPS,
                       attention=attention))


def logits_and_grads(draft: Eagle3Draft, batch: dict[str, torch.Tensor], attention: AttentionFactory | None = None
                     ) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """Unroll, back-propagate the weighted TTT loss plus a random-weighted sum of every step's logits."""
    draft.zero_grad(set_to_none=True)
    generator = torch.Generator().manual_seed(1)
    B, T = batch["doc_ids"].shape
    teacher_logits = torch.randn(B, T, DRAFT_VOCAB, generator=generator)
    teacher = Teacher(teacher_logits, torch.randint(0, VOCAB, (B, T), generator=generator))
    scorer = StepScorer(teacher, batch["doc_ids"], batch["loss_mask"], draft.d2t, draft.t2d, STEPS, "keep")
    losses, all_logits = [], []
    for j, logits in enumerate(unroll(draft, batch["aux"], batch["input_ids"], batch["position_ids"],
                                      batch["doc_ids"], STEPS, attention=attention)):
        weights = torch.randn(logits.shape, generator=generator)
        losses.append(scorer.score(j, logits) + (weights * logits).sum() / logits.shape[-1])
        all_logits.append(logits.detach())
    weighted_objective(losses).backward()
    grads = {name: p.grad.clone() for name, p in draft.named_parameters() if p.requires_grad}
    return all_logits, grads


def test_default_attention_on_cpu_is_the_eager_path() -> None:
    assert default_attention(torch.device("cpu")) is EagerTTTAttention


@pytest.mark.parametrize(("heads", "kv_heads", "layers"), [(4, 4, 1), (4, 2, 1), (4, 2, 2)],
                         ids=["mha", "gqa", "gqa-2layers"])
def test_eager_path_equals_dense_reference_in_logits_and_gradients(heads: int, kv_heads: int, layers: int) -> None:
    draft = make_draft(heads, kv_heads, layers)
    batch = packed_batch()
    # the validity of later steps must not be empty, or the loss would not reach them
    assert all(step_validity(batch["doc_ids"], batch["loss_mask"], j).any() for j in range(STEPS))
    fast_logits, fast_grads = logits_and_grads(draft, batch)  # default attention on CPU: EagerTTTAttention
    ref_logits, ref_grads = logits_and_grads(draft, batch, attention=DenseTTTAttention)
    assert len(fast_logits) == len(ref_logits) == STEPS
    for j, (fast, ref) in enumerate(zip(fast_logits, ref_logits)):
        assert fast.shape == (2, LENGTH, DRAFT_VOCAB)
        diff = (fast - ref).abs().max().item()
        assert diff < 1e-5, f"step {j}: logits differ from the dense reference by {diff}"
    assert fast_grads.keys() == ref_grads.keys()
    assert "embed_tokens.weight" not in fast_grads  # frozen
    for name, grad in fast_grads.items():
        assert grad.abs().max() > 0, f"{name}: no gradient"
        diff = (grad - ref_grads[name]).abs().max().item()
        assert diff < 1e-5, f"{name}: gradient differs from the dense reference by {diff}"


@pytest.mark.filterwarnings(FLEX_WARNING)
@pytest.mark.parametrize(("heads", "kv_heads", "layers"), [(4, 4, 1), (4, 2, 2)], ids=["mha", "gqa-2layers"])
def test_flex_path_forward_equals_dense_reference(heads: int, kv_heads: int, layers: int) -> None:
    # FlexAttention has no backward on CPU (only compiled, on CUDA), so only the forward is compared here.
    draft = make_draft(heads, kv_heads, layers)
    batch = packed_batch()
    with torch.no_grad():
        flex = run_unroll(draft, batch, FlexTTTAttention)
        ref = run_unroll(draft, batch, DenseTTTAttention)
    for j, (a, b) in enumerate(zip(flex, ref)):
        diff = (a - b).abs().max().item()
        assert diff < 1e-5, f"step {j}: FlexTTTAttention differs from the dense reference by {diff}"


def random_step_kv(steps: int, heads: int = 4, kv_heads: int = 2, seed: int = 0
                   ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    B, T, d = 2, LENGTH, 8
    q = torch.randn(B, heads, T, d, generator=generator)
    keys = [torch.randn(B, kv_heads, T, d, generator=generator) for _ in range(steps)]
    values = [torch.randn(B, kv_heads, T, d, generator=generator) for _ in range(steps)]
    return q, keys, values


@pytest.mark.filterwarnings(FLEX_WARNING)
@pytest.mark.parametrize("path", [EagerTTTAttention, FlexTTTAttention], ids=["eager", "flex"])
def test_attention_call_equals_dense_reference_and_not_its_wrong_variants(path: AttentionFactory) -> None:
    doc_ids = packed_batch()["doc_ids"]
    q, keys, values = random_step_kv(STEPS)
    fast, ref = path(doc_ids), DenseTTTAttention(doc_ids)
    wrong = {variant: DenseTTTAttention(doc_ids, variant) for variant in ("none", "latest", "previous")}
    with torch.no_grad():
        for j in range(STEPS):
            out = fast(q, keys[: j + 1], values[: j + 1])
            assert out.shape == q.shape
            diff = (out - ref(q, keys[: j + 1], values[: j + 1])).abs().max().item()
            assert diff < 1e-5, f"step {j}: {path.__name__} differs from the dense reference by {diff}"
            for variant, attend in wrong.items():
                if j >= 1 and not (variant == "latest" and j == 1):  # where the variant really differs
                    gap = (out - attend(q, keys[: j + 1], values[: j + 1])).abs().max().item()
                    assert gap > 1e-2, f"step {j}: indistinguishable from the '{variant}' diagonal variant"


@pytest.mark.filterwarnings(FLEX_WARNING)
@pytest.mark.parametrize("path", [EagerTTTAttention, FlexTTTAttention], ids=["eager", "flex"])
def test_earlier_step_keys_reach_only_the_same_position(path: AttentionFactory) -> None:
    doc_ids = packed_batch()["doc_ids"]
    q, keys, values = random_step_kv(3)
    attend = path(doc_ids)
    position = 7  # inside document 0 of row 0, and document 1 of row 1
    with torch.no_grad():
        base = attend(q, keys, values)  # step 2: keys of steps 0, 1, 2
        for step in (1, 2):
            for changed in ("keys", "values"):
                k, v = list(keys), list(values)
                target = k if changed == "keys" else v
                target[step] = target[step].clone()
                target[step][:, :, position] += 1.0
                moved = (attend(q, k, v) - base).abs().amax(dim=(1, 3))  # [B, T]
                assert (moved[:, position] > 1e-3).all(), f"step-{step} {changed} at t={position} are ignored"
                others = torch.ones(LENGTH, dtype=torch.bool)
                others[position] = False
                assert moved[:, others].max() == 0, f"step-{step} {changed} at t={position} reach other positions"
        # a step-0 key at s reaches the queries t >= s of its own document only
        k = list(keys)
        k[0] = k[0].clone()
        k[0][:, :, position] += 1.0
        moved = (attend(q, k, values) - base).abs().amax(dim=(1, 3)) > 0  # [B, T]
        t = torch.arange(LENGTH)
        expected = (t >= position) & (doc_ids == doc_ids[:, position : position + 1])  # [B, T]
        assert torch.equal(moved, expected)


def test_dropped_or_misplaced_diagonals_change_the_unrolled_logits() -> None:
    """The model-level parity test has power: the wrong variants differ from the step 1 on, never at step 0."""
    draft = make_draft()
    batch = packed_batch()
    with torch.no_grad():
        fast = run_unroll(draft, batch)
        for variant in ("none", "latest", "previous"):
            wrong = run_unroll(draft, batch, lambda doc_ids, variant=variant: DenseTTTAttention(doc_ids, variant))
            assert (fast[0] - wrong[0]).abs().max() < 1e-5
            first = 2 if variant == "latest" else 1  # "latest" only drops diagonals of steps before the current
            for j in range(first, STEPS):
                assert (fast[j] - wrong[j]).abs().max() > 1e-4, f"step {j}: '{variant}' variant not detected"


@pytest.mark.filterwarnings(FLEX_WARNING)
@pytest.mark.parametrize("path", [EagerTTTAttention, FlexTTTAttention], ids=["eager", "flex"])
@pytest.mark.parametrize("changed_doc", [0, 1, 2], ids=["first", "middle", "last"])
def test_documents_of_a_packed_row_never_see_each_other(path: AttentionFactory, changed_doc: int) -> None:
    draft = make_draft(4, 2, 2)
    batch = packed_batch()
    row = 1  # documents 0 (t 0..5), 1 (t 6..16), 2 (t 17..21), padding (t 22, 23)
    other = packed_batch(seed=5)
    in_doc = batch["doc_ids"][row] == changed_doc  # [T]
    changed = dict(batch)
    for name in ("aux", "input_ids"):  # the document's features and tokens
        changed[name] = batch[name].clone()
        changed[name][row, in_doc] = other[name][row, in_doc]
    with torch.no_grad():
        before = run_unroll(draft, batch, path)
        after = run_unroll(draft, changed, path)
    everything = torch.ones_like(batch["loss_mask"])
    for j in range(STEPS):
        # anchor t of step j reads tokens up to t+1+j: only anchors whose t+1+j is still in their own document
        # are closed to the other documents (the others read the next document's first tokens and are never scored)
        own = step_validity(batch["doc_ids"], everything, j) | (batch["doc_ids"] == -1)  # [B, T] (and padding)
        others = own & (batch["doc_ids"] != changed_doc)
        others[1 - row] = True  # the other row is untouched entirely
        diff = (before[j] - after[j]).abs().amax(-1)  # [B, T]
        assert diff[others].max() == 0, f"step {j}: document {changed_doc} leaks into another document"
        assert diff[row, in_doc].max() > 1e-4  # the change itself is visible
