"""`dtype: auto`: bfloat16 only where the device computes it natively, float32 elsewhere; the choice and
its reason printed once and recorded in the resolved config and in the store manifest / eval report;
an explicit dtype honoured, with one warning when this CPU emulates it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from eyas import precision
from eyas.config import EvalConfig, ExtractConfig, RegenerateConfig, TrainConfig
from eyas.features.store import read_store_manifest
from eyas.precision import CpuFeatures, choose_dtype

AVX2 = CpuFeatures("AVX2", avx512_bf16=False, amx_bf16=False, avx512_fp16=False, amx_fp16=False)
SAPPHIRE = CpuFeatures("AVX512", avx512_bf16=True, amx_bf16=True, avx512_fp16=True, amx_fp16=False)


@pytest.fixture
def cpu(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201 - returns a setter
    """Return a function that makes this process see the given CPU features (and forget what it said)."""
    monkeypatch.setattr(precision, "_said", set())

    def use(features: CpuFeatures) -> None:
        monkeypatch.setattr(precision, "cpu_features", lambda: features)

    return use


@pytest.mark.parametrize("stage", [ExtractConfig, TrainConfig, RegenerateConfig, EvalConfig])
def test_auto_is_the_default_of_every_stage(stage: type) -> None:
    fields = {name: field.default for name, field in stage.model_fields.items() if name in ("dtype", "target_dtype")}
    assert fields and set(fields.values()) == {"auto"}, fields


def test_auto_is_float32_where_bfloat16_is_emulated(cpu, capsys: pytest.CaptureFixture[str]) -> None:
    cpu(AVX2)
    chosen = choose_dtype("auto", "cpu")
    assert (chosen.dtype, chosen.requested, chosen.emulated) == ("float32", "auto", False)
    assert "AVX2" in chosen.reason and "emulated" in chosen.reason
    assert capsys.readouterr().err == ""  # choosing says nothing; the stage announces once it starts
    chosen.announce("extract dtype")
    choose_dtype("auto", "cpu").announce("extract dtype")  # the same choice again: said once
    assert capsys.readouterr().err.splitlines() == [f"eyas: extract dtype auto -> float32: {chosen.reason}"]


def test_auto_is_bfloat16_where_the_cpu_has_avx512_bf16_or_amx(cpu, capsys: pytest.CaptureFixture[str]) -> None:
    cpu(SAPPHIRE)
    chosen = choose_dtype("auto", "cpu")
    chosen.announce("eval dtype")
    assert (chosen.dtype, chosen.emulated) == ("bfloat16", False)
    assert "AVX-512-BF16 and AMX-BF16" in chosen.reason
    assert capsys.readouterr().err.startswith("eyas: eval dtype auto -> bfloat16: this CPU has AVX-512-BF16")


def test_kernels_forced_below_avx512_make_bfloat16_not_native(cpu) -> None:
    """ATEN_CPU_CAPABILITY=default|avx2 on an AMX CPU: torch's bfloat16 paths cannot use the CPU's BF16
    instructions (they fail in pack_vnni2), so auto must not pick bfloat16 there."""
    cpu(CpuFeatures("DEFAULT", avx512_bf16=True, amx_bf16=True, avx512_fp16=True, amx_fp16=False))
    chosen = choose_dtype("auto", "cpu")
    assert chosen.dtype == "float32" and "torch runs DEFAULT kernels (ATEN_CPU_CAPABILITY)" in chosen.reason
    assert choose_dtype("bfloat16", "cpu").emulated and choose_dtype("float16", "cpu").emulated


def test_an_explicit_dtype_is_honoured_and_warned_once_when_emulated(cpu, capsys: pytest.CaptureFixture[str]) -> None:
    cpu(AVX2)
    for _ in range(2):
        chosen = choose_dtype("bfloat16", "cpu")
        chosen.announce("regenerate dtype")
    assert (chosen.dtype, chosen.emulated) == ("bfloat16", True)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("eyas: warning: regenerate dtype bfloat16 is slow here: ")
    assert err[0].endswith("(dtype auto would pick float32)")
    assert choose_dtype("float32", "cpu").dtype == "float32"
    half = choose_dtype("float16", "cpu")
    half.announce("regenerate dtype")
    assert half.emulated  # no AVX-512-FP16 / AMX-FP16
    assert "regenerate dtype float16 is slow here" in capsys.readouterr().err
    cpu(SAPPHIRE)
    native = choose_dtype("bfloat16", "cpu")
    native.announce("regenerate dtype")
    assert not native.emulated
    assert capsys.readouterr().err == ""  # a native explicit dtype is not stated


def test_cuda_auto_follows_the_devices_bf16_support(cpu, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    cpu(AVX2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "GPU-X")
    for supported, expected in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *_, s=supported: s)
        chosen = choose_dtype("auto", "cuda:0")
        assert chosen.dtype == expected and "GPU-X" in chosen.reason


def test_this_machine_reports_what_torch_and_cpuinfo_say() -> None:
    import torch

    features = precision.cpu_features()
    assert features.capability == torch.backends.cpu.get_cpu_capability()
    flags = Path("/proc/cpuinfo").read_text().split("flags")[1].splitlines()[0].split()
    assert features.native_bfloat16 == (("avx512_bf16" in flags or "amx_bf16" in flags)
                                        and torch.backends.cpu.get_cpu_capability().startswith("AVX512"))
    record = precision.machine_record()
    assert record["cpu_capability"] == features.capability and record["torch_threads"] == torch.get_num_threads()


def test_extract_records_the_choice_in_the_manifest_and_the_resolved_config(weighted_target, prepared, run_cli,
                                                                            tmp_path: Path) -> None:
    target = weighted_target("llama")
    out = tmp_path / "store"
    result = run_cli("extract", "--target", target, "--data", prepared(target), "--out", out, "--device", "cpu")
    assert result.code == 0, result.err
    expected = "bfloat16" if precision.cpu_features().native_bfloat16 else "float32"
    manifest = read_store_manifest(out)
    assert manifest.compute_dtype == expected
    assert manifest.precision is not None and manifest.precision["requested"] == "auto"
    assert manifest.precision["dtype"] == expected and manifest.precision["reason"]
    text = (out / "config.yaml").read_text()
    assert f"# dtype auto -> {expected}: {manifest.precision['reason']}" in text
    assert yaml.safe_load(text)["extract"]["dtype"] == expected  # what ran, rerunnable as is
    assert f"extract dtype auto -> {expected}" in result.err
    reused = run_cli("extract", "--config", out / "config.yaml")  # the resolved config is this very run
    assert reused.code == 0, reused.err
    assert json.loads((out / "manifest.json").read_text())["run_key"] == manifest.run_key
