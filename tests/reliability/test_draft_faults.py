"""A broken draft is refused wherever one is read, in one line naming the file and what is wrong, before
anything is written: truncated weights (an interrupted copy) in `check-draft`, `import`, `export`, `eval`
and a warm start (exit 2); NaN or Inf weights (exit 2, or listed by `check-draft`, exit 1); config fields
of the wrong type or missing, each named once with its own wording; and `check-draft` lists every problem
`eval` lists for the same draft and target."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eyas.config import ExportConfig
from eyas.draft.config import draft_config_for_target
from eyas.draft.model import Eagle3Draft, save_draft
from eyas.export.writer import run_export
from eyas.models.fingerprint import target_fingerprint
from eyas.models.layers import default_aux_layers
from eyas.models.load import load_config
from eyas.models.tokenizer import load_tokenizer
from eyas.testing.tiny import build_tiny_target

pytestmark = pytest.mark.usefixtures("one_thread")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "data"
DRAFT_VOCAB = 40


@pytest.fixture(scope="module")
def drafts(weighted_target, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`target`; `draft`: an eyas draft for it (random weights, a valid vocabulary mapping); `published`: that
    draft exported for vLLM, which `check-draft` finds no problem with; `shallow`: a 4-layer target."""
    root = tmp_path_factory.mktemp("drafts")
    target = weighted_target("llama")
    target_config = load_config(target)
    fingerprint = target_fingerprint(target, load_tokenizer(target))
    config = draft_config_for_target(target_config, default_aux_layers(target_config.num_hidden_layers), DRAFT_VOCAB,
                                     fingerprint)
    draft = Eagle3Draft(config)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        for parameter in draft.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)
        ids = torch.arange(DRAFT_VOCAB) * 3  # [N] target ids, strictly increasing
        draft.d2t.copy_(ids - torch.arange(DRAFT_VOCAB))
        draft.t2d[ids] = True
    save_draft(draft, root / "draft")
    run_export(ExportConfig(draft=root / "draft", format="vllm", out=root / "published", target=target))
    return {"target": target, "draft": root / "draft", "published": root / "published",
            "shallow": build_tiny_target(root / "shallow", num_layers=4)}


def copy(source: Path, root: Path) -> Path:
    out = root / source.name
    shutil.copytree(source, out)
    return out


def refused(run_cli, *args: str | Path) -> str:
    """Return the one-line error of a command that must exit 2 without a traceback."""
    result = run_cli(*args)
    assert result.code == 2, (result.code, result.out, result.err)
    assert result.err.count("\n") == 1 and result.err.startswith("eyas: error: ") and "Traceback" not in result.err
    return result.err.removeprefix("eyas: error: ").removesuffix("\n")


def commands(drafts: dict[str, Path], draft: Path, published: Path, out: Path) -> dict[str, tuple]:
    """The commands that read a draft: (arguments, the directory they read)."""
    target = drafts["target"]
    return {
        "check-draft": (("check-draft", published, "--target", target, "--engine", "vllm"), published),
        "import": (("import", published, "--out", out), published),
        "export": (("export", "--draft", draft, "--format", "vllm", "--out", out), draft),
        "eval": (("eval", "--draft", draft, "--target", target, "--prompts", EXAMPLES / "prompts.jsonl", "--out", out,
                  "--device", "cpu", "--dtype", "float32"), draft),
    }


@pytest.mark.parametrize("verb", ["check-draft", "import", "export", "eval"])
def test_truncated_weights_are_named_in_one_line(verb: str, drafts, run_cli, tmp_path: Path) -> None:
    """An interrupted copy (F13): exit 2 naming the file (check-draft too: the draft cannot be read at all, as
    when its config is unreadable), and no output directory."""
    draft, published = copy(drafts["draft"], tmp_path), copy(drafts["published"], tmp_path)
    out = tmp_path / "out"
    args, read = commands(drafts, draft, published, out)[verb]
    weights = read / "model.safetensors"
    with open(weights, "r+b") as handle:
        handle.truncate(5000)
    assert refused(run_cli, *args).startswith(f"{weights}: cannot read it: not a readable safetensors file (")
    assert not out.exists()


def test_a_truncated_pytorch_bin_is_named_by_import(drafts, run_cli, tmp_path: Path) -> None:
    """A published draft in `pytorch_model.bin` (SafeAILab's format), cut short."""
    published = copy(drafts["published"], tmp_path)
    weights = published / "pytorch_model.bin"
    torch.save(load_file(str(published / "model.safetensors")), weights)
    (published / "model.safetensors").unlink()
    with open(weights, "r+b") as handle:
        handle.truncate(3000)
    out = tmp_path / "out"
    assert refused(run_cli, "import", published, "--out", out) == (
        f"{weights}: cannot read it: not a readable PyTorch checkpoint (PytorchStreamReader failed reading zip "
        "archive: failed finding central directory)")
    assert not out.exists()


def test_a_warm_start_from_truncated_weights_is_named(drafts, example_store: Path, run_cli, tmp_path: Path) -> None:
    init = copy(drafts["draft"], tmp_path)
    with open(init / "model.safetensors", "r+b") as handle:
        handle.truncate(5000)
    out = tmp_path / "run"
    err = refused(run_cli, "train", "--features", example_store, "--init", init, "--out", out, "--device", "cpu",
                  "dtype=float32", "target_dtype=float32")
    assert err.startswith(f"{init / 'model.safetensors'}: cannot read it: not a readable safetensors file (")
    assert not out.exists()


def poison(weights: Path, every: bool) -> list[str]:
    """Set every floating-point value of `weights` to NaN (`every`), or one value of `fc.weight` to Inf; return
    the problems `non_finite_problems` names for the eyas tensor names."""
    tensors = load_file(str(weights))
    if every:
        tensors = {name: torch.full_like(t, float("nan")) if t.is_floating_point() else t for name, t in tensors.items()}
    else:
        tensors["fc.weight"][0, 0] = float("inf")
    save_file(tensors, str(weights), metadata={"format": "pt"})
    floating = {name.replace("midlayer.", "layers.0."): t for name, t in tensors.items() if t.is_floating_point()}
    if not every:
        return [f"fc.weight: 1 of {floating['fc.weight'].numel()} values are NaN or Inf"]
    named = list(floating.items())
    rest = named[3:]
    return [*(f"{name}: {t.numel()} of {t.numel()} values are NaN or Inf" for name, t in named[:3]),
            f"{len(rest)} more tensors hold NaN or Inf ({sum(t.numel() for _, t in rest)} of "
            f"{sum(t.numel() for _, t in rest)} values)"]


@pytest.mark.parametrize("every", [True, False], ids=["all-nan", "one-inf"])
@pytest.mark.parametrize("verb", ["check-draft", "import", "export", "eval"])
def test_non_finite_weights_are_refused_wherever_a_draft_is_read(verb: str, every: bool, drafts, run_cli,
                                                                 tmp_path: Path) -> None:
    """F7: check-draft lists them (exit 1); import, export and eval refuse the draft (exit 2) before writing."""
    draft, published = copy(drafts["draft"], tmp_path), copy(drafts["published"], tmp_path)
    out = tmp_path / "out"
    args, read = commands(drafts, draft, published, out)[verb]
    problems = poison(read / "model.safetensors", every)
    if verb == "check-draft":
        result = run_cli(*args)
        assert result.code == 1 and "Traceback" not in result.err, (result.out, result.err)
        listed = [line.split(". ", 1)[1] for line in result.out.splitlines()[1:]]
        assert listed == problems, result.out
        return
    where = read if verb == "import" else read / "model.safetensors"
    assert refused(run_cli, *args) == f"{where}: " + "; ".join(problems)
    assert not out.exists()


def edit_config(published: Path, edit) -> Path:
    config = json.loads((published / "config.json").read_text())
    edit(config)
    (published / "config.json").write_text(json.dumps(config))
    return published / "config.json"


def check(run_cli, published: Path, target: Path) -> list[str]:
    """Return the problems `eyas check-draft` lists (exit 1)."""
    result = run_cli("check-draft", published, "--target", target, "--engine", "vllm")
    assert result.code == 1 and "Traceback" not in result.err, (result.out, result.err)
    return [line.split(". ", 1)[1] for line in result.out.splitlines()[1:]]


def test_a_size_given_as_a_string_is_named_as_such(drafts, run_cli, tmp_path: Path) -> None:
    published = copy(drafts["published"], tmp_path)
    config = edit_config(published, lambda c: c.update(hidden_size="64", rms_norm_eps=[1]))
    assert check(run_cli, published, drafts["target"]) == [f'{config}: hidden_size: expected an integer, got "64"',
                                                           f"{config}: rms_norm_eps: expected a number, got [1]"]


def test_a_missing_field_is_reported_once(drafts, run_cli, tmp_path: Path) -> None:
    published = copy(drafts["published"], tmp_path)
    config = edit_config(published, lambda c: c.pop("hidden_size"))
    assert check(run_cli, published, drafts["target"]) == [f"{config}: hidden_size: missing"]
    published = copy(drafts["published"], tmp_path / "second")
    config = edit_config(published, lambda c: c.pop("intermediate_size"))
    out = tmp_path / "out"
    assert refused(run_cli, "import", published, "--out", out) == f"{config}: intermediate_size: missing"
    assert not out.exists()


def test_check_draft_lists_every_problem_eval_lists_for_the_pair(drafts, run_cli, tmp_path: Path) -> None:
    """A draft for an 8-layer target checked against a 4-layer one: the layer ids (in the engine's convention,
    as the engine reads them) and the fingerprint, both."""
    shallow = drafts["shallow"]
    evaluated = refused(run_cli, "eval", "--draft", drafts["draft"], "--target", shallow, "--prompts",
                        EXAMPLES / "prompts.jsonl", "--out", tmp_path / "eval", "--device", "cpu")
    fingerprint, layers = evaluated.removeprefix(f"{drafts['draft']}: not a draft for {shallow}: ").split("; ")
    assert fingerprint.startswith("target: trained for fingerprint ") and layers.startswith("aux_layer_ids: [2, 4, 5]")
    out_of_range = "[5] out of range for a 4-layer target in the input convention (0..4)"
    assert layers.endswith(out_of_range)
    config = drafts["published"] / "config.json"
    assert check(run_cli, drafts["published"], shallow) == [
        f"{config}: eagle_aux_hidden_state_layer_ids: {out_of_range}", fingerprint]
