"""`eyas train` through the CLI: outputs of an offline run, reuse and refusal of `--out`, warm start,
the checks that inputs belong together, and online training as the same code path as offline."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eyas.config import ExtractConfig, PrepareConfig
from eyas.data.dataset import VOCAB
from eyas.data.prepare import run_prepare
from eyas.data.vocab import load_draft_vocab
from eyas.draft.config import read_draft_config
from eyas.errors import EyasError
from eyas.features.extract import run_extract
from eyas.features.store import read_store_manifest
from eyas.models.head import load_target_layer
from eyas.precision import cpu_features
from eyas.train.loop import ttt_depth
from eyas.train.setup import check_store_matches

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "data"
DRAFT_VOCAB = 200  # of the tiny target's 512 tokens: d2t is not all zeros
TTT = 2
# Rows of up to 128 tokens, micro-batches of up to 512 padded tokens: 4 micro-batches per epoch.
SMALL = ["--ttt-steps", str(TTT), "--token-budget", "512", "--device", "cpu", "row_tokens=128", "log_every=1"]


@dataclass(frozen=True)
class Inputs:
    target: Path
    data: Path
    store: Path


@pytest.fixture(scope="module")
def inputs(weighted_target, tmp_path_factory: pytest.TempPathFactory) -> Inputs:
    """The tiny llama target, the example dataset with a 200-token draft vocab, and its float32 store."""
    root = tmp_path_factory.mktemp("train-cli-inputs")
    target = weighted_target("llama")
    run_prepare(PrepareConfig(target=target, data=[EXAMPLES], out=root / "ds", draft_vocab_size=DRAFT_VOCAB))
    run_extract(ExtractConfig(target=target, data=root / "ds", out=root / "store", dtype="float32",
                              storage_dtype="fp32", device="cpu"))
    return Inputs(target, root / "ds", root / "store")


@pytest.fixture(scope="module")
def offline_run(inputs: Inputs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 2-step offline run (trained in-process, once for the module)."""
    from eyas.cli import main

    run = tmp_path_factory.mktemp("train-cli-run") / "run"
    args = ["train", "--features", str(inputs.store), "--out", str(run), "--max-steps", "2", *SMALL]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.argv", ["eyas", *args])
        with pytest.raises(SystemExit) as done:
            main()
    assert done.value.code in (0, None), done.value.code
    return run


def metric_lines(run: Path, split: str) -> list[dict]:
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [line for line in lines if line["split"] == split]


def one_line_error(result) -> str:
    assert result.code == 2, (result.code, result.out, result.err)
    assert result.err.count("\n") == 1 and "Traceback" not in result.err, result.err
    assert result.err.startswith("eyas: error: ")
    return result.err


def test_offline_run_writes_the_draft_metrics_and_provenance(inputs: Inputs, offline_run) -> None:
    run = offline_run
    manifest = read_store_manifest(inputs.store)
    assert {p.name for p in (run / "final").iterdir()} == {"config.json", "model.safetensors"}
    assert (run / "summary.json").is_file() and (run / "config.yaml").is_file()
    assert "train:" in (run / "config.yaml").read_text()

    tensors = load_file(str(run / "final" / "model.safetensors"))
    assert "embed_tokens.weight" not in tensors
    vocab = load_draft_vocab(inputs.data / VOCAB)
    assert len(vocab.d2t) == DRAFT_VOCAB and vocab.d2t.any()
    assert torch.equal(tensors["d2t"], torch.from_numpy(vocab.d2t).to(tensors["d2t"].dtype))
    assert torch.equal(tensors["t2d"], torch.from_numpy(vocab.t2d).to(tensors["t2d"].dtype))

    config = json.loads((run / "final" / "config.json").read_text())
    assert config["aux_layer_ids"] == manifest.layer_ids == [2, 4, 5]
    assert config["layer_convention"] == "input"
    assert config["draft_vocab_size"] == DRAFT_VOCAB and config["vocab_size"] == 512
    assert config["target"] == manifest.target.model_dump(mode="json")
    assert read_draft_config(run / "final").target.id == manifest.target.id

    keys = {"loss", "implied_tau"} | {f"{name}_{j}" for name in ("loss", "acc", "cond_acc") for j in range(TTT)}
    train, held_out = metric_lines(run, "train"), metric_lines(run, "eval")
    assert [line["step"] for line in train] == [1, 2] and [line["step"] for line in held_out] == [2]
    for line in train + held_out:
        assert keys <= line.keys(), keys - line.keys()
        assert all(math.isfinite(line[k]) for k in keys)
        assert 1.0 <= line["implied_tau"] <= 1.0 + TTT
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["final"]["loss"] == train[-1]["loss"]
    assert summary["eval"]["loss"] == held_out[-1]["loss"]


def test_rerun_reuses_and_other_settings_are_refused_unless_overwrite(inputs: Inputs, run_cli, tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["train", "--features", inputs.store, "--out", run, "--max-steps", "1", *SMALL]
    assert run_cli(*args).code == 0
    weights = (run / "final" / "model.safetensors").read_bytes()
    metrics, stamp = (run / "metrics.jsonl").read_text(), (run / "final" / "model.safetensors").stat().st_mtime_ns

    again = run_cli(*args)
    assert again.code == 0, again.err
    assert "already trained; reused" in " ".join(again.out.split())  # rich wraps the title
    assert (run / "metrics.jsonl").read_text() == metrics
    assert (run / "final" / "model.safetensors").stat().st_mtime_ns == stamp

    err = one_line_error(run_cli(*args, "--seed", "1"))
    assert f"{run}: holds an eyas training run made from other inputs or settings" in err and "--overwrite" in err
    assert (run / "metrics.jsonl").read_text() == metrics  # nothing touched

    replaced = run_cli(*args, "--seed", "1", "--overwrite")
    assert replaced.code == 0, replaced.err
    assert "reused" not in replaced.out
    assert (run / "final" / "model.safetensors").read_bytes() != weights
    assert [line["step"] for line in metric_lines(run, "train")] == [1]  # the old run's lines are gone


def test_check_store_matches_names_manifest_and_field(inputs: Inputs, offline_run) -> None:
    run = offline_run
    manifest = read_store_manifest(inputs.store)
    draft = read_draft_config(run / "final")
    check_store_matches(inputs.store, manifest, draft)  # the store it was trained from
    where = f"{inputs.store / 'manifest.json'}: does not match the draft: "
    other_target = manifest.target.model_copy(update={"id": "f" * 64})
    cases = {
        "hidden_size": ({"hidden_size": 128}, "hidden_size: 128, the draft reads 64"),
        "layer_ids": ({"layer_ids": [1, 4, 7]}, "layer_ids: [1, 4, 7], the draft reads [2, 4, 5]"),
        "target": ({"target": other_target},
                   f"target: extracted from {manifest.target_path} (fingerprint ffffffffffff)"),
    }
    for field, (update, expected) in cases.items():
        with pytest.raises(EyasError) as caught:
            check_store_matches(inputs.store, manifest.model_copy(update=update), draft)
        message = str(caught.value)
        assert message.startswith(where) and expected in message and "\n" not in message, (field, message)
    everything = manifest.model_copy(update={k: v for update, _ in cases.values() for k, v in update.items()})
    with pytest.raises(EyasError) as caught:  # every problem at once
        check_store_matches(inputs.store, everything, draft)
    assert all(expected in str(caught.value) for _, expected in cases.values())


def test_store_from_another_target_and_missing_inputs_are_refused(inputs: Inputs, run_cli, tmp_path: Path) -> None:
    other = tmp_path / "other-target"
    shutil.copytree(inputs.target, other)
    config = json.loads((other / "config.json").read_text())
    config["rms_norm_eps"] = 1e-5  # same tokenizer and template, another model
    (other / "config.json").write_text(json.dumps(config))
    out = tmp_path / "run"
    err = one_line_error(run_cli("train", "--features", inputs.store, "--target", other, "--out", out, *SMALL))
    assert f"{inputs.store / 'manifest.json'}: target: extracted from {inputs.target}, not from {other}" in err
    assert not out.exists()

    err = one_line_error(run_cli("train", "--out", out, *SMALL))
    assert "give --features STORE_DIR (offline) or --data DATASET_DIR (online)" in err
    assert not out.exists()


def test_warm_start_begins_at_the_init_weights(inputs: Inputs, offline_run, run_cli, tmp_path: Path) -> None:
    run = offline_run
    warm = tmp_path / "warm"
    result = run_cli("train", "--features", inputs.store, "--init", run / "final", "--out", warm, "--max-steps", "1",
                     "--lr", "1e-12", *SMALL)
    assert result.code == 0, result.err
    start = load_file(str(run / "final" / "model.safetensors"))
    after = load_file(str(warm / "final" / "model.safetensors"))
    assert start.keys() == after.keys()
    for name, tensor in start.items():
        assert torch.allclose(after[name].float(), tensor.float(), rtol=0, atol=1e-9), name
    # the init run moved its weights well beyond that tolerance from a fresh draft of the same seed
    fresh = tmp_path / "fresh"
    assert run_cli("train", "--features", inputs.store, "--out", fresh, "--max-steps", "1", "--lr", "1e-12",
                   *SMALL).code == 0
    scratch = load_file(str(fresh / "final" / "model.safetensors"))
    assert max((scratch[n].float() - start[n].float()).abs().max().item() for n in start) > 1e-6
    assert json.loads((warm / "final" / "config.json").read_text())["draft_vocab_size"] == DRAFT_VOCAB


def test_warm_start_refuses_a_dataset_with_another_draft_vocab(inputs: Inputs, offline_run, run_cli,
                                                                tmp_path: Path) -> None:
    run = offline_run
    other = tmp_path / "ds100"
    run_prepare(PrepareConfig(target=inputs.target, data=[EXAMPLES], out=other, draft_vocab_size=100))
    out = tmp_path / "warm"
    err = one_line_error(run_cli("train", "--target", inputs.target, "--data", other, "--init", run / "final",
                                 "--out", out, "--max-steps", "1", *SMALL))
    assert f"{run / 'final' / 'model.safetensors'}: d2t: the warm-start draft's vocabulary ({DRAFT_VOCAB} tokens) " \
           f"differs from {other / VOCAB} (100 tokens" in err
    assert not out.exists()


def test_init_layer_starts_every_draft_layer_from_the_target_layer(inputs: Inputs, offline_run, run_cli,
                                                                   tmp_path: Path) -> None:
    layer = load_target_layer(inputs.target, -1, torch.float32)
    runs = {}
    for mode, source in (("offline", ["--features", inputs.store]), ("online", ["--target", inputs.target, "--data", inputs.data])):
        runs[mode] = tmp_path / mode
        result = run_cli("train", *source, "--out", runs[mode], "--max-steps", "1", "--lr", "1e-12", *SMALL,
                         "init_layer=-1", "train.target_dtype=float32")
        assert result.code == 0, result.err
    offline = load_file(str(runs["offline"] / "final" / "model.safetensors"))
    online = load_file(str(runs["online"] / "final" / "model.safetensors"))
    hidden = layer["input_layernorm.weight"].shape[0]
    for name in ("mlp.down_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight"):
        assert torch.allclose(offline[f"layers.0.{name}"], layer[name], atol=1e-6), name
    assert torch.allclose(offline["layers.0.self_attn.k_proj.weight"][:, hidden:], layer["self_attn.k_proj.weight"], atol=1e-6)
    assert torch.allclose(offline["layers.0.hidden_norm.weight"], layer["input_layernorm.weight"], atol=1e-6)
    for name, tensor in offline.items():  # online reads the layer from the loaded target, offline from the files
        assert torch.allclose(online[name].float(), tensor.float(), atol=1e-6), name
    err = one_line_error(run_cli("train", "--features", inputs.store, "--init", offline_run / "final", "--out",
                                 tmp_path / "both", "--max-steps", "1", *SMALL, "init_layer=0"))
    assert "init_layer: not with init" in err and not (tmp_path / "both").exists()


def test_ttt_depth_grows_over_the_asked_share_of_the_steps() -> None:
    assert [ttt_depth(step, 10, 5, 0.5) for step in range(1, 11)] == [1, 2, 3, 4, 5, 5, 5, 5, 5, 5]
    assert [ttt_depth(step, 4, 2, 1.0) for step in range(1, 5)] == [1, 1, 2, 2]
    assert {ttt_depth(step, 10, 5, 0.0) for step in range(1, 11)} == {5}


def test_a_growing_unroll_trains_the_shallow_objective_first(inputs: Inputs, run_cli, tmp_path: Path) -> None:
    """Step 1 of a run growing from 1 to 2 steps is step 1 of a 1-step run, weight for weight; step 2 is not."""
    shallow_args = SMALL[2:]  # SMALL without its --ttt-steps
    assert SMALL[:2] == ["--ttt-steps", str(TTT)] and TTT == 2
    runs = {"growing": tmp_path / "growing", "one": tmp_path / "one"}
    for name, depth in (("growing", ["--ttt-steps", "2", "ttt_growth=0.5"]), ("one", ["--ttt-steps", "1"])):
        result = run_cli("train", "--features", inputs.store, "--out", runs[name], "--max-steps", "2", *depth,
                         *shallow_args, "save_every=1", "keep_last=3")
        assert result.code == 0, result.err
    weights = {name: [load_file(str(run / "checkpoints" / f"step-{step:08d}" / "draft" / "model.safetensors"))
                      for step in (1, 2)] for name, run in runs.items()}
    for tensor, value in weights["one"][0].items():
        assert torch.equal(weights["growing"][0][tensor], value), tensor
    assert max((weights["growing"][1][t].float() - weights["one"][1][t].float()).abs().max().item()
               for t in weights["one"][1]) > 1e-7
    lines = metric_lines(runs["growing"], "train")
    assert [line["ttt_depth"] for line in lines] == [1, 2]
    assert lines[0]["loss_1"] == 0 and lines[0]["acc_1"] == 0 and lines[1]["loss_1"] > 0
    final_eval = metric_lines(runs["growing"], "eval")[-1]
    assert final_eval["loss_1"] > 0  # held-out figures score the whole unroll


def test_online_training_is_the_offline_code_path(inputs: Inputs, offline_run, run_cli, tmp_path: Path) -> None:
    offline = offline_run
    online = tmp_path / "online"
    result = run_cli("train", "--target", inputs.target, "--data", inputs.data, "--out", online, "--max-steps", "2",
                     *SMALL, "train.target_dtype=float32")
    assert result.code == 0, result.err
    assert {p.name for p in (online / "final").iterdir()} == {"config.json", "model.safetensors"}
    config = json.loads((online / "final" / "config.json").read_text())
    assert config["aux_layer_ids"] == read_store_manifest(inputs.store).layer_ids
    assert config["draft_vocab_size"] == DRAFT_VOCAB
    first_online, first_offline = metric_lines(online, "train")[0], metric_lines(offline, "train")[0]
    assert first_online["step"] == first_offline["step"] == 1
    assert first_online["tokens"] == first_offline["tokens"]
    for key in ("loss", *(f"loss_{j}" for j in range(TTT))):
        assert first_online[key] == pytest.approx(first_offline[key], rel=1e-4), key


def test_inputs_changed_under_the_same_paths_are_not_reused(inputs: Inputs, run_cli, tmp_path: Path) -> None:
    # offline: the dataset re-prepared in place with another draft vocab size (its fingerprint stays the same)
    data, store = tmp_path / "ds", tmp_path / "store"
    shutil.copytree(inputs.data, data)
    shutil.copytree(inputs.store, store)
    args = ["train", "--features", store, "--data", data, "--out", tmp_path / "offline", "--max-steps", "1", *SMALL]
    assert run_cli(*args).code == 0
    run_prepare(PrepareConfig(target=inputs.target, data=[EXAMPLES], out=data, draft_vocab_size=100))
    err = one_line_error(run_cli(*args))
    assert "holds an eyas training run made from other inputs or settings" in err
    # online: other conversations prepared into the same dataset directory
    online = tmp_path / "online-ds"
    run_prepare(PrepareConfig(target=inputs.target, data=[EXAMPLES / "chat.jsonl"], out=online))
    args = ["train", "--target", inputs.target, "--data", online, "--out", tmp_path / "online", "--max-steps", "1",
            *SMALL, "target_dtype=float32"]
    assert run_cli(*args).code == 0
    run_prepare(PrepareConfig(target=inputs.target, data=[EXAMPLES / "sharegpt.json"], out=online, overwrite=True))
    err = one_line_error(run_cli(*args))
    assert "holds an eyas training run made from other inputs or settings" in err


def test_cpu_autocast_is_auto_unless_a_dtype_is_asked(inputs: Inputs, run_cli, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`train.dtype=bfloat16` puts the draft's forward under bfloat16 autocast on CPU too; the default (auto) is
    bfloat16 only on a CPU that computes it natively, float32 elsewhere, and says which and why."""
    seen: dict[str, set[torch.dtype]] = {}
    linear = torch.nn.Linear.forward

    def recording(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        out = linear(self, x)
        seen[current].add(out.dtype)
        return out

    monkeypatch.setattr(torch.nn.Linear, "forward", recording)
    features = cpu_features()
    native = features.native_bfloat16
    # A BF16/AMX CPU with torch's kernels forced below AVX-512 (make test-kernels): torch's own bfloat16 matmul
    # fails there (`pack_vnni2 is only supported when avx512 is supported`), so only auto and float32 run.
    torch_fails_bf16 = (features.avx512_bf16 or features.amx_bf16) and not features.avx512_kernels
    legs = [("default", []), ("float32", ["train.dtype=float32"])]
    legs += [] if torch_fails_bf16 else [("bfloat16", ["train.dtype=bfloat16"])]
    for current, extra in legs:
        seen[current] = set()
        result = run_cli("train", "--features", inputs.store, "--out", tmp_path / current, "--max-steps", "2",
                         *SMALL, *extra)
        assert result.code == 0, result.err
        losses = [line["loss"] for line in metric_lines(tmp_path / current, "train")]
        assert losses and all(math.isfinite(loss) for loss in losses)
        summary = json.loads((tmp_path / current / "summary.json").read_text())
        assert summary["precision"]["dtype"]["dtype"] == ("bfloat16" if current == "bfloat16" or
                                                          (current == "default" and native) else "float32")
    assert seen["default"] == ({torch.bfloat16} if native else {torch.float32})
    assert seen["float32"] == {torch.float32}
    resolved = (tmp_path / "default" / "config.yaml").read_text()
    assert f"# dtype auto -> {'bfloat16' if native else 'float32'}: " in resolved
    assert "  dtype: auto" not in resolved  # the resolved config holds what ran
    if torch_fails_bf16:
        return
    assert seen["bfloat16"] == {torch.bfloat16}
    weights = load_file(str(tmp_path / "bfloat16" / "final" / "model.safetensors"))
    assert all(t.dtype == torch.float32 for n, t in weights.items() if t.is_floating_point())  # master weights


@pytest.mark.parametrize("family", [["--family", "peagle", "--fc-norm"], ["--fc-norm", "--norm-output"],
                                    ["--family", "dflash", "--num-layers", "2"]], ids=["peagle", "eagle3.1", "dflash"])
def test_each_family_runs_train_eval_export_and_check_draft(inputs: Inputs, offline_run, run_cli, tmp_path: Path,
                                                           family: list[str]) -> None:
    """A tiny end-to-end per draft family through the CLI: train a few steps, decode losslessly (a chain and the
    auto shape; DFlash: a chain of its block, the auto draft branch refused before loading), export (vLLM and
    speculators, and `eyas check-draft`; DFlash: z-lab's format, loaded back by eyas's DFlash draft); a warm start
    from another family is refused in one line."""
    name = family[1] if family[0] == "--family" else "eagle3"
    run = tmp_path / "run"
    trained = run_cli("train", "--features", inputs.store, "--out", run, "--max-steps", "2", *SMALL, *family)
    assert trained.code == 0, trained.err
    config = read_draft_config(run / "final")
    assert config.family == name and config.fc_norm == ("--fc-norm" in family)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "The quick brown fox"}\n{"prompt": "def add(a, b):"}\n', encoding="utf-8")
    for shape in (["--chain", str(TTT)], ["--shape", "auto"]):
        out = tmp_path / f"eval-{shape[-1]}"
        evaluated = run_cli("eval", "--target", inputs.target, "--draft", run / "final", "--prompts", prompts, "--out",
                            out, "--max-new-tokens", "12", "--dtype", "float32", "--device", "cpu", *shape)
        if name == "dflash" and shape[-1] == "auto":
            assert evaluated.code == 2 and "the auto shape drafts with an eagle3 or peagle draft" in evaluated.err
            assert not out.exists()
            continue
        assert evaluated.code == 0, evaluated.err
        report = json.loads((out / "report.json").read_text())
        assert report["same_as_baseline"] == report["prompts"] == 2
    if name == "dflash":
        assert run_cli("export", "--draft", run / "final", "--format", "vllm", "--out", tmp_path / "vllm").code == 0
        written = json.loads((tmp_path / "vllm" / "config.json").read_text())
        assert written["architectures"] == ["DFlashDraftModel"] and written["block_size"] == TTT + 1
        assert written["dflash_config"]["target_layer_ids"] == [i - 1 for i in config.aux_layer_ids]
        names = set(load_file(str(tmp_path / "vllm" / "model.safetensors")))
        assert "layers.1.self_attn.k_norm.weight" in names and not names & {"lm_head.weight", "d2t", "embed_tokens.weight"}
        refused = run_cli("export", "--draft", run / "final", "--format", "sglang", "--out", tmp_path / "sglang")
        assert refused.code == 2 and "family: dflash" in refused.err
        unread = run_cli("train", "--features", inputs.store, "--out", tmp_path / "options", "--max-steps", "1", *SMALL,
                         "--family", "dflash", "--fc-norm", "--draft-vocab-size", "100")
        assert unread.code == 2 and "leave out draft_vocab_size, fc_norm" in one_line_error(unread)
    for fmt in ("vllm", "speculators") if name != "dflash" else ():
        assert run_cli("export", "--draft", run / "final", "--format", fmt, "--out", tmp_path / fmt).code == 0
        checked = run_cli("check-draft", tmp_path / fmt, "--target", inputs.target, "--engine", "vllm")
        assert checked.code == 0, checked.out + checked.err
    other = ["--family", "eagle3"] if name != "eagle3" else ["--family", "peagle"]
    refused = run_cli("train", "--features", inputs.store, "--out", tmp_path / "warm", "--max-steps", "1", *SMALL,
                      "--init", run / "final", *other)
    assert refused.code == 2 and "family: --init is" in one_line_error(refused)
