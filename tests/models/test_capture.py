"""Capture hooks: features equal `output_hidden_states` at the right indices in both conventions,
and the teacher recomputed from the stored pre-norm state equals the model's own logits."""

from __future__ import annotations

import pytest
import torch

from eyas.errors import EyasError
from eyas.models.capture import FeatureCapture, teacher_logits
from eyas.models.layers import default_aux_layers, from_input_convention, to_input_convention
from eyas.models.load import load_target
from eyas.models.parts import locate_parts

ARCHITECTURES = ["llama", "qwen3", "mistral", "qwen3_moe", "deepseek_v3", "gemma2", "phi3", "gpt_neox"]


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 300, (2, 12), generator=generator)  # [B, T]
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 9:] = 0  # right padding on the second row
    return ids, mask


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_capture_matches_output_hidden_states_in_both_conventions(weighted_target, architecture: str) -> None:
    parts = load_target(weighted_target(architecture), torch.float32, "cpu")
    hidden = parts.model.config.hidden_size
    ids, mask = batch()
    with torch.no_grad():
        reference = parts.model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    # hidden_states[k] is the input of decoder layer k (k < N); the last entry may be normed (transformers 5)
    for convention, given in (("input", [0, 3, 7]), ("output", [2, 5, 6])):
        aux_ids = to_input_convention(given, convention, parts.num_layers)
        with FeatureCapture(parts, aux_ids) as capture:
            captured = capture.run(ids, mask)
        assert captured.aux.shape == (2, 12, 3 * hidden)
        for block, layer in enumerate(aux_ids):
            torch.testing.assert_close(captured.aux[..., block * hidden:(block + 1) * hidden],
                                       reference.hidden_states[layer], rtol=0, atol=0)
    assert torch.equal(torch.tensor(from_input_convention(to_input_convention([2, 5, 6], "output", 8), "output")),
                       torch.tensor([2, 5, 6]))
    # last: the input of the final norm, i.e. the un-normed output of the last layer
    assert not torch.allclose(parts.final_norm(captured.last), captured.last)
    diff = (teacher_logits(parts, captured.last) - reference.logits).abs().max().item()
    assert diff < 1e-4, f"{architecture}: teacher differs from the model's logits by {diff}"


def test_layer_conventions_and_defaults() -> None:
    assert default_aux_layers(32) == [2, 16, 29]
    assert default_aux_layers(61) == [2, 30, 58]
    assert to_input_convention([1, 15, 28], "output", 32) == [2, 16, 29]
    assert from_input_convention([2, 16, 29], "output") == [1, 15, 28]
    with pytest.raises(EyasError, match=r"layers: \[32\] out of range .* output convention \(0..31\)"):
        to_input_convention([1, 32], "output", 32)
    with pytest.raises(EyasError, match="too few"):
        default_aux_layers(6)


def test_unlocatable_model_names_its_class() -> None:
    class Odd(torch.nn.Module):
        config = type("Config", (), {"num_hidden_layers": 2})()

        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Linear(2, 2)

        @property
        def base_model(self) -> torch.nn.Module:
            return self.inner

        def get_output_embeddings(self) -> None:
            return None

        def get_input_embeddings(self) -> None:
            return None

    with pytest.raises(EyasError, match="Odd: cannot locate the decoder layer list .*final norm.*LM head"):
        locate_parts(Odd())
