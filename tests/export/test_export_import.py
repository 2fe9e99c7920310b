"""Export to vLLM / SGLang / speculators and import of published drafts.

Round trips give identical tensors and logits; layer ids convert both ways (vLLM and speculators:
input of layer k, as eyas; SGLang: output of layer k); drafts as SafeAILab/EAGLE, SpecForge,
NVIDIA ModelOpt and speculators publish them (fixtures written here from the formats' docs) load;
broken drafts are refused naming every problem; `eyas check-draft` reports all an engine would
trip over.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from eyas.draft.attention import EagerTTTAttention
from eyas.draft.config import draft_config_for_target
from eyas.draft.model import Eagle3Draft, load_draft, save_draft
from eyas.models.layers import from_input_convention, to_input_convention

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, DRAFT_VOCAB, HIDDEN, TARGET_LAYERS = 96, 40, 32, 8
AUX = [2, 4, 5]  # input convention


def random_draft(root: Path, layers: int = 1, **family: object) -> Path:
    target = transformers.LlamaConfig(hidden_size=HIDDEN, intermediate_size=64, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=VOCAB, num_hidden_layers=TARGET_LAYERS)
    draft = Eagle3Draft(draft_config_for_target(target, AUX, DRAFT_VOCAB, None, {"num_hidden_layers": layers, **family}))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in draft.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.2)
        ids = torch.randperm(VOCAB, generator=generator)[:DRAFT_VOCAB].sort().values
        draft.d2t.copy_(ids - torch.arange(DRAFT_VOCAB))
        draft.t2d[ids] = True
    save_draft(draft, root / "eyas-draft")
    return root / "eyas-draft"


def test_a_full_vocabulary_draft_is_exported_without_a_mapping(run_cli, tmp_path: Path) -> None:
    """vLLM creates no `draft_id_to_target_id` when the draft's vocabulary is the target's and refuses the tensor;
    importing restores the identity mapping, so the round trip is exact."""
    target = transformers.LlamaConfig(hidden_size=HIDDEN, intermediate_size=64, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=VOCAB, num_hidden_layers=TARGET_LAYERS)
    draft = Eagle3Draft(draft_config_for_target(target, AUX, VOCAB, None))
    draft.t2d[:] = True
    save_draft(draft, tmp_path / "full")
    assert run_cli("export", "--draft", tmp_path / "full", "--format", "vllm", "--out", tmp_path / "vllm").code == 0
    assert not {"d2t", "t2d"} & set(load_file(str(tmp_path / "vllm" / "model.safetensors")))
    assert run_cli("import", tmp_path / "vllm", "--out", tmp_path / "back").code == 0
    expected, got = load_file(str(tmp_path / "full" / "model.safetensors")), load_file(str(tmp_path / "back" / "model.safetensors"))
    assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in expected)


def logits_of(draft_dir: Path) -> torch.Tensor:
    """Logits of two draft steps on fixed inputs, with a fixed random embedding."""
    embed = torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(1))
    draft = load_draft(draft_dir, embed).eval()
    generator = torch.Generator().manual_seed(2)
    aux = torch.randn(1, 10, 3 * HIDDEN, generator=generator)
    ids = torch.randint(0, VOCAB, (1, 10), generator=generator)
    with torch.no_grad():
        kv, attention = draft.new_kv(), EagerTTTAttention(torch.zeros(1, 10, dtype=torch.long))
        hidden = draft.step(draft.fuse(aux), ids, torch.arange(10)[None], kv, attention)
        second = draft.step(hidden, ids.roll(-1, 1), torch.arange(1, 11)[None], kv, attention)
    return torch.cat([draft.logits(hidden), draft.logits(second)])


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("fmt", ["vllm", "sglang", "speculators"])
def test_export_then_import_gives_identical_tensors_and_logits(run_cli, tmp_path: Path, fmt: str, layers: int) -> None:
    original = random_draft(tmp_path, layers)
    exported = tmp_path / fmt
    result = run_cli("export", "--draft", original, "--format", fmt, "--out", exported)
    if fmt == "sglang" and layers == 2:
        assert result.code == 2 and "SGLang's EAGLE-3 draft has one layer" in result.err
        return
    assert result.code == 0, result.err
    names = set(load_file(str(exported / "model.safetensors")))
    layer_prefix = "midlayer." if layers == 1 and fmt != "speculators" else "layers.0."
    assert f"{layer_prefix}self_attn.q_proj.weight" in names and "embed_tokens.weight" not in names
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= names
    back = tmp_path / "back"
    assert run_cli("import", exported, "--out", back).code == 0
    expected, got = load_file(str(original / "model.safetensors")), load_file(str(back / "model.safetensors"))
    assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in expected)
    assert torch.equal(logits_of(back), logits_of(original))
    assert json.loads((back / "config.json").read_text())["aux_layer_ids"] == AUX


@pytest.mark.parametrize("family", [{"family": "peagle"}, {"fc_norm": True, "norm_output": True},
                                    {"family": "peagle", "mask_token_id": 5, "fc_norm": True}],
                         ids=["peagle", "eagle3.1", "peagle-fc-norm"])
@pytest.mark.parametrize("fmt", ["vllm", "speculators"])
def test_families_export_where_vllm_reads_them_and_import_back(run_cli, tmp_path: Path, fmt: str,
                                                                family: dict[str, object]) -> None:
    """The keys sit where vLLM 0.32 reads them (llama_eagle3.py, speculators/algos.py: a peagle layer config
    carries the options, an eagle3 one the top level); the round trip is exact, family and options included."""
    original = random_draft(tmp_path, **family)
    exported = tmp_path / fmt
    assert run_cli("export", "--draft", original, "--format", fmt, "--out", exported).code == 0
    written = json.loads((exported / "config.json").read_text())
    names = set(load_file(str(exported / "model.safetensors")))
    parallel = family.get("family") == "peagle"
    options = {k: True for k in ("fc_norm", "norm_output") if family.get(k)}
    if fmt == "vllm":
        assert {k: written.get(k) for k in options} == options
    else:
        assert written["speculators_model_type"] == ("peagle" if parallel else "eagle3")
        where = written["transformer_layer_config"] if parallel else written
        assert {k: where.get(k) for k in options} == options
    assert ("mask_hidden" in names) == parallel and ("fc_norm.0.weight" in names) == bool(family.get("fc_norm"))
    if parallel:
        assert written["mask_token_id"] == family.get("mask_token_id", VOCAB - 1)  # the default: the last id
    back = tmp_path / "back"
    assert run_cli("import", exported, "--out", back).code == 0
    expected, got = load_file(str(original / "model.safetensors")), load_file(str(back / "model.safetensors"))
    assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in expected)
    keys = ("family", "mask_token_id", "fc_norm", "norm_output")
    mine, theirs = json.loads((original / "config.json").read_text()), json.loads((back / "config.json").read_text())
    assert {k: theirs[k] for k in keys} == {k: mine[k] for k in keys}


def test_sglang_refuses_what_its_eagle3_draft_does_not_read(run_cli, tmp_path: Path) -> None:
    result = run_cli("export", "--draft", random_draft(tmp_path, family="peagle", fc_norm=True), "--format", "sglang",
                     "--out", tmp_path / "sglang")
    assert result.code == 2 and "fc_norm, family: peagle; SGLang's EAGLE-3 draft reads none of these" in result.err
    assert not (tmp_path / "sglang").exists()


def test_layer_ids_per_engine_and_back(run_cli, tmp_path: Path) -> None:
    original = random_draft(tmp_path)
    written = {}
    for fmt in ("vllm", "sglang", "speculators"):
        assert run_cli("export", "--draft", original, "--format", fmt, "--out", tmp_path / fmt).code == 0
        config = json.loads((tmp_path / fmt / "config.json").read_text())
        written[fmt] = config.get("eagle_aux_hidden_state_layer_ids") or config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert written == {"vllm": [2, 4, 5], "sglang": [1, 3, 4], "speculators": [2, 4, 5]}
    assert from_input_convention(AUX, "output") == [1, 3, 4]
    assert to_input_convention([1, 3, 4], "output", TARGET_LAYERS) == AUX
    with pytest.raises(Exception, match="embedding output"):
        from_input_convention([0, 3, 5], "output")


def published_hf(root: Path, ids: list[int] | None, names: str = "midlayer", prefix: str = "", bin_file: bool = False,
                 drop: tuple[str, ...] = (), with_t2d: bool = True) -> Path:
    """A draft as published in the EAGLE-3 HF format: SafeAILab (pytorch_model.bin, no ids), SpecForge
    (safetensors, ids in SGLang's output convention), ModelOpt (`layers.0.*`, no t2d)."""
    source = random_draft(root / "source")
    tensors = load_file(str(source / "model.safetensors"))
    config = json.loads((source / "config.json").read_text())
    out = root / "published"
    out.mkdir(parents=True)
    renamed = {}
    for name, tensor in tensors.items():
        if name == "t2d" and not with_t2d or name in drop:
            continue
        name = name.replace("layers.0.", f"{names}.") if names == "midlayer" else name
        renamed[prefix + name if name not in ("d2t", "t2d") else name] = tensor
    renamed["embed_tokens.weight"] = torch.zeros(VOCAB, HIDDEN)  # published with an embedding copy: ignored
    if bin_file:
        torch.save(renamed, out / "pytorch_model.bin")
    else:
        save_file(renamed, str(out / "model.safetensors"))
    hf = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": HIDDEN,
          "intermediate_size": config["intermediate_size"], "num_attention_heads": 4, "num_key_value_heads": 2,
          "num_hidden_layers": 1, "rms_norm_eps": config["rms_norm_eps"], "rope_theta": config["rope_theta"],
          "max_position_embeddings": config["max_position_embeddings"], "vocab_size": VOCAB,
          "draft_vocab_size": DRAFT_VOCAB, "torch_dtype": "float32"}
    if ids is not None:
        hf["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}
    (out / "config.json").write_text(json.dumps(hf))
    return out


def test_specforge_and_modelopt_style_drafts_need_their_convention(run_cli, tmp_path: Path) -> None:
    published = published_hf(tmp_path, ids=[1, 3, 4], names="layers", prefix="model.", with_t2d=False)
    ambiguous = run_cli("import", published, "--out", tmp_path / "a")
    assert ambiguous.code == 2 and "pass --layer-convention input|output" in ambiguous.err
    assert run_cli("import", published, "--out", tmp_path / "b", "--layer-convention", "output").code == 0
    config = json.loads((tmp_path / "b" / "config.json").read_text())
    assert config["aux_layer_ids"] == AUX
    assert torch.equal(logits_of(tmp_path / "b"), logits_of(tmp_path / "source" / "eyas-draft"))
    rebuilt = load_file(str(tmp_path / "b" / "model.safetensors"))["t2d"]  # t2d rebuilt from d2t
    assert torch.equal(rebuilt, load_file(str(tmp_path / "source" / "eyas-draft" / "model.safetensors"))["t2d"])


def test_safeailab_style_bin_without_ids_takes_the_defaults_of_the_target(run_cli, tmp_path: Path, learned) -> None:
    published = published_hf(tmp_path, ids=None, bin_file=True)
    without_target = run_cli("import", published, "--out", tmp_path / "x")
    assert without_target.code == 2 and "not given (EAGLE-3's defaults depend on the target: pass --target)" in without_target.err
    with_target = run_cli("import", published, "--out", tmp_path / "y", "--target", learned["target"])
    assert with_target.code == 2  # the learned target is 64 wide with another vocabulary: every misfit is named
    assert "target_hidden_size: 32, the target's hidden size is 64" in with_target.err
    assert "vocab_size: 96, the target's vocabulary has" in with_target.err


@pytest.mark.parametrize(("drop", "edit", "messages"), [
    (("fc.weight",), {}, ["fc.weight: missing"]),
    ((), {"hidden_size": 48}, ["hidden_size: 48 in config.json, the weights are 32 wide (norm.weight)",
                                "fc.weight: shape [32, 96], config implies [48, 144]",
                                "layers.0.self_attn.q_proj.weight: shape [32, 64], config implies [48, 96]"]),
    (("fc.weight", "norm.weight"), {}, ["fc.weight: missing", "norm.weight: missing"]),
])
def test_broken_drafts_are_refused_naming_every_problem(run_cli, tmp_path: Path, drop: tuple[str, ...], edit: dict,
                                                        messages: list[str]) -> None:
    published = published_hf(tmp_path, ids=[1, 3, 4], drop=drop)
    config = json.loads((published / "config.json").read_text())
    config.update(edit)
    (published / "config.json").write_text(json.dumps(config))
    result = run_cli("import", published, "--out", tmp_path / "x", "--layer-convention", "output")
    assert result.code == 2 and result.err.count("\n") == 1, result.err
    for message in messages:
        assert message in result.err
    assert not (tmp_path / "x").exists()


def test_check_draft_reports_what_each_engine_would_trip_over(run_cli, tmp_path: Path, learned) -> None:
    target, draft = learned["target"], learned["run"] / "final"
    for fmt in ("vllm", "sglang", "speculators"):
        assert run_cli("export", "--draft", draft, "--format", fmt, "--out", tmp_path / fmt, "--target", target).code == 0
    clean = run_cli("check-draft", tmp_path / "vllm", "--target", target, "--engine", "vllm")
    assert clean.code == 0 and "no problems found" in clean.out
    assert run_cli("check-draft", tmp_path / "sglang", "--target", target, "--engine", "sglang").code == 0
    assert run_cli("check-draft", tmp_path / "speculators", "--target", target, "--engine", "vllm").code == 0
    crossed = run_cli("check-draft", tmp_path / "vllm", "--target", target, "--engine", "sglang")
    assert crossed.code == 1 and "written for the input convention, sglang reads the output convention" in crossed.out
    broken = tmp_path / "broken"
    shutil.copytree(tmp_path / "vllm", broken)
    tensors = load_file(str(broken / "model.safetensors"))
    del tensors["fc.weight"]
    tensors["d2t"] = tensors["d2t"].flip(0)
    tensors["extra.weight"] = torch.zeros(2)
    save_file(tensors, str(broken / "model.safetensors"))
    report = run_cli("check-draft", broken, "--target", target, "--engine", "vllm")
    assert report.code == 1
    for message in ("fc.weight: missing", "extra.weight: unexpected tensor", "d2t: "):
        assert message in report.out
    assert "3 problem(s)" in report.out
