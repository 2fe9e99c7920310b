"""What `eyas train` refuses instead of quietly doing something else: a draft vocabulary size that
`eyas prepare` refuses (never clamped), and target head tensors it cannot find by name (never a
silent load of the whole target)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eyas.config import PrepareConfig, TrainConfig
from eyas.data.prepare import run_prepare
from eyas.errors import EyasError
from eyas.models.head import load_target_head
from eyas.models.load import load_target
from eyas.train.setup import resolve_train

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "data"
TOO_MANY = "draft_vocab_size: 100000 must be between 1 and the target vocabulary size 512"


def test_train_refuses_the_draft_vocab_size_prepare_refuses(tiny_targets, prepared, tmp_path: Path) -> None:
    target = tiny_targets["chatml"]
    with pytest.raises(EyasError) as prepare_error:
        run_prepare(PrepareConfig(target=target, data=[EXAMPLES], out=tmp_path / "ds", draft_vocab_size=100000))
    with pytest.raises(EyasError) as train_error:
        resolve_train(TrainConfig(target=target, data=prepared(target), out=tmp_path / "run", draft_vocab_size=100000))
    assert str(train_error.value) == str(prepare_error.value) == TOO_MANY


def test_the_head_is_read_by_name_alone(weighted_target, capsys: pytest.CaptureFixture[str]) -> None:
    target = weighted_target("llama")
    head = load_target_head(target, torch.float32, "cpu")
    parts = load_target(target, torch.float32, "cpu")
    assert torch.equal(head.embed, parts.embed.weight) and torch.equal(head.lm_head, parts.lm_head.weight)
    assert torch.equal(head.final_norm.weight, parts.final_norm.weight)
    assert "eyas:" not in capsys.readouterr().err


def test_a_tied_head_is_the_embedding_read_by_its_own_name(weighted_target, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    import json

    target = tmp_path / "tied"  # as save_pretrained writes a tied model (and the embedded SmolLM2): no lm_head.weight
    shutil.copytree(weighted_target("llama"), target)
    tensors = load_file(str(target / "model.safetensors"))
    del tensors["lm_head.weight"]
    save_file(tensors, str(target / "model.safetensors"))
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    head = load_target_head(target, torch.float32, "cpu")
    assert torch.equal(head.embed, tensors["model.embed_tokens.weight"]) and torch.equal(head.lm_head, head.embed)
    assert torch.equal(head.final_norm.weight, tensors["model.norm.weight"])
    assert "eyas:" not in capsys.readouterr().err


def test_head_tensors_under_other_names_are_refused_not_loaded_whole(weighted_target, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "renamed"
    shutil.copytree(weighted_target("llama"), target)
    tensors = load_file(str(target / "model.safetensors"))
    tensors["output.weight"] = tensors.pop("lm_head.weight")
    save_file(tensors, str(target / "model.safetensors"))
    with pytest.raises(EyasError) as error:
        load_target_head(target, torch.float32, "cpu")
    message = str(error.value)
    assert message.startswith(f"{target / '*.safetensors'}: no tensor lm_head.weight (looked for ")
    assert "model.embed_tokens.weight" in message and "\n" not in message
    assert "eyas:" not in capsys.readouterr().err
