"""The draft families and EAGLE-3.1's options: what the config accepts, what the weights hold, and that the
decoder drafts exactly what training unrolled.

The agreement tests are the point: for a random draft of each kind, the training unroll's logits of step j at
anchor t (eyas.draft.ttt) equal what decoding computes for the same context (the P-EAGLE block of one forward,
or EAGLE-3's chain fed the same tokens), and deliberately wrong layouts (the block read as EAGLE-3's recurrence,
the slot feature left out of fc_norm) do not.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eyas.decode.drafting import DraftAnchors
from eyas.draft.attention import EagerTTTAttention
from eyas.draft.config import DraftConfig, read_draft_config
from eyas.draft.model import Eagle3Draft, load_draft, save_draft
from eyas.draft.ttt import unroll
from eyas.errors import EyasError

pytestmark = pytest.mark.usefixtures("one_thread")

STEPS = 4
LENGTH = 12


def tiny_config(**options: object) -> DraftConfig:
    return DraftConfig.model_validate({
        "hidden_size": 32, "target_hidden_size": 24, "intermediate_size": 48, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 40, "draft_vocab_size": 40, "aux_layer_ids": [1, 2, 3],
        **options})


def tiny_draft(seed: int = 0, **options: object) -> Eagle3Draft:
    torch.manual_seed(seed)
    draft = Eagle3Draft(tiny_config(**options)).double().eval()
    with torch.no_grad():
        draft.embed_tokens.weight.normal_()
        for name, parameter in draft.named_parameters():
            if name.endswith("norm.weight") or ".fc_norm." in name:
                parameter.uniform_(0.5, 1.5)  # norms away from one, so leaving one out shows
    return draft


def sequence(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Return `aux [T, 3*24]` float64 and `tokens [T]` of one random document."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(LENGTH, 72, generator=generator, dtype=torch.float64) * 3, \
        torch.randint(0, 40, (LENGTH,), generator=generator)


def unrolled(draft: Eagle3Draft, aux: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Return `[STEPS, T, N]`: the training unroll's logits of every step at every anchor."""
    with torch.no_grad():
        steps = unroll(draft, aux[None], tokens[None], torch.arange(LENGTH)[None], torch.zeros(1, LENGTH, dtype=torch.long),
                       STEPS, attention=EagerTTTAttention)
        return torch.stack([logits[0] for logits in steps])


def block_at(draft: Eagle3Draft, aux: torch.Tensor, tokens: torch.Tensor, anchor: int) -> torch.Tensor:
    """Return `[STEPS, N]`: the P-EAGLE block the decoder drafts after anchor `anchor` (context x_0..x_{anchor+1})."""
    anchors = DraftAnchors(draft)
    anchors.add(aux[:anchor + 1], tokens[1:anchor + 2].tolist(), 0)
    return anchors.block(STEPS)


@pytest.mark.parametrize("options", [{}, {"fc_norm": True}, {"norm_output": True}, {"num_hidden_layers": 2}],
                         ids=["plain", "fc-norm", "norm-output", "two-layers"])
def test_the_peagle_block_is_what_training_unrolled(options: dict[str, object]) -> None:
    draft = tiny_draft(family="peagle", mask_token_id=7, **options)
    aux, tokens = sequence()
    trained = unrolled(draft, aux, tokens)
    for anchor in (0, 3, LENGTH - STEPS - 1):
        torch.testing.assert_close(block_at(draft, aux, tokens, anchor), trained[:, anchor].float(), rtol=1e-5, atol=1e-5)


def test_a_block_after_anchors_read_earlier_is_the_same_block() -> None:
    """The auto shape reads anchors in batches while it does not draft: a block run with nothing waiting (only the
    slots in its forward) equals one that reads the anchors in the same forward."""
    draft = tiny_draft(family="peagle", mask_token_id=7)
    aux, tokens = sequence()
    anchors = DraftAnchors(draft)
    anchors.add(aux[:6], tokens[1:7].tolist(), 0)
    anchors.read()
    assert anchors.first_waiting is None
    torch.testing.assert_close(anchors.block(STEPS), block_at(draft, aux, tokens, 5))
    assert anchors.runner.length == 6  # the slots left the cache
    forwards = anchors.runner.forwards
    torch.testing.assert_close(anchors.block(1), block_at(draft, aux, tokens, 5)[:1])  # the root alone: no forward
    assert anchors.runner.forwards == forwards


def test_the_block_is_not_the_autoregressive_recurrence() -> None:
    """The power check: the same weights unrolled as EAGLE-3 (each step reading the next token and the last
    step's output) disagree with the block past its first token; a block whose slot feature skipped fc_norm
    disagrees too."""
    draft = tiny_draft(family="peagle", mask_token_id=7, fc_norm=True)
    aux, tokens = sequence()
    recurrent = Eagle3Draft(tiny_config(fc_norm=True)).double().eval()
    recurrent.load_state_dict({k: v for k, v in draft.state_dict().items() if k != "mask_hidden"})
    block = block_at(draft, aux, tokens, 3)
    as_eagle3 = unrolled(recurrent, aux, tokens)[:, 3].float()
    torch.testing.assert_close(block[0], as_eagle3[0], rtol=1e-5, atol=1e-5)  # the first token is EAGLE-3's
    assert (block[1:] - as_eagle3[1:]).abs().max() > 1e-2

    def unnormed(self: Eagle3Draft) -> tuple[int, torch.Tensor]:
        return 7, self.fc(self.mask_hidden)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Eagle3Draft, "mask_slot", unnormed)
        wrong = block_at(draft, aux, tokens, 3)
    assert (wrong[1:] - block[1:]).abs().max() > 1e-2


@pytest.mark.parametrize("options", [{}, {"norm_output": True}, {"fc_norm": True, "norm_output": True}],
                         ids=["eagle3", "norm-output", "fc-norm-and-norm-output"])
def test_the_eagle3_chain_fed_the_true_tokens_is_what_training_unrolled(options: dict[str, object]) -> None:
    """EAGLE-3 (and EAGLE-3.1's options): the decoder's draft runner, each step reading the previous step's
    `DraftStep.hidden` and the next true token, gives the unroll's logits; with norm_output a chain that passed
    the pre-norm output on would not."""
    draft = tiny_draft(**options)
    aux, tokens = sequence()
    trained = unrolled(draft, aux, tokens)
    anchor = 4
    anchors = DraftAnchors(draft)
    anchors.add(aux[:anchor + 1], tokens[1:anchor + 2].tolist(), 0)
    _, step = anchors.read()
    logits, hidden = [step.logits[-1]], step.hidden[-1:]
    for j in range(1, STEPS):
        step = anchors.runner.forward(hidden, tokens[anchor + 1 + j:anchor + 2 + j], torch.tensor([anchor + j]))
        logits.append(step.logits[-1])
        hidden = step.hidden[-1:]
    torch.testing.assert_close(torch.stack(logits), trained[:, anchor].float(), rtol=1e-5, atol=1e-5)
    if options.get("norm_output"):
        plain = Eagle3Draft(tiny_config(**{**options, "norm_output": False})).double().eval()
        plain.load_state_dict(draft.state_dict())
        assert (unrolled(plain, aux, tokens)[1:, anchor] - trained[1:, anchor]).abs().max() > 1e-2


def test_fc_norm_norms_each_aux_feature_before_fc() -> None:
    draft = tiny_draft(fc_norm=True)
    aux = sequence()[0]
    chunks = aux.chunk(3, dim=-1)
    normed = torch.cat([chunk * torch.rsqrt(chunk.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
                        for chunk, norm in zip(chunks, draft.fc_norm)], dim=-1)
    torch.testing.assert_close(draft.fuse(aux), draft.fc(normed))


def test_saved_weights_name_the_options_as_engines_do_and_load_back(tmp_path: Path) -> None:
    draft = tiny_draft(family="peagle", mask_token_id=7, fc_norm=True, norm_output=True).float()
    state = draft.trainable_state()
    assert {"fc_norm.0.weight", "fc_norm.2.weight", "mask_hidden"} <= set(state)
    assert state["mask_hidden"].shape == (72,)  # the aux space: [num_aux * target_hidden_size]
    save_draft(draft, tmp_path / "d")
    config = read_draft_config(tmp_path / "d")
    assert (config.family, config.mask_token_id, config.fc_norm, config.norm_output) == ("peagle", 7, True, True)
    back = load_draft(tmp_path / "d")
    torch.testing.assert_close(back.mask_hidden, draft.mask_hidden)


@pytest.mark.parametrize(("options", "message"), [
    ({"family": "peagle"}, "mask_token_id: Value error, None; a peagle or dflash draft needs one"),
    ({"mask_token_id": 3}, "an eagle3 draft has none"),
    ({"family": "peagle", "mask_token_id": 40}, "outside the 40-token vocabulary"),
    ({"family": "dflash3"}, "family"),
])
def test_the_config_refuses_a_family_without_its_parts(options: dict[str, object], message: str, tmp_path: Path) -> None:
    draft = tmp_path / "d"
    save_draft(Eagle3Draft(tiny_config()), draft)
    raw = (draft / "config.json").read_text()
    import json

    (draft / "config.json").write_text(json.dumps({**json.loads(raw), **options}))
    with pytest.raises(EyasError, match=message) as refused:
        read_draft_config(draft)
    assert str(draft / "config.json") in str(refused.value) and "\n" not in str(refused.value)


def test_a_draft_written_before_families_reads_as_eagle3(tmp_path: Path) -> None:
    import json

    save_draft(Eagle3Draft(tiny_config()), tmp_path / "d")
    raw = json.loads((tmp_path / "d" / "config.json").read_text())
    for key in ("family", "fc_norm", "norm_output", "mask_token_id"):
        raw.pop(key)
    (tmp_path / "d" / "config.json").write_text(json.dumps(raw))
    config = read_draft_config(tmp_path / "d")
    assert (config.family, config.fc_norm, config.norm_output, config.parallel) == ("eagle3", False, False, False)


def test_a_peagle_slot_of_an_eagle3_draft_is_refused() -> None:
    with pytest.raises(ValueError, match="eagle3 draft has none"):
        tiny_draft().mask_slot()
