"""Loading targets: config without weights, the weightless (meta-device) model, and real weights."""

from __future__ import annotations

import contextlib
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from eyas.errors import CannotRun, EyasError
from eyas.models.fingerprint import hf_location, is_gguf, read_model_config
from eyas.models.parts import TargetParts, locate_parts

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_CUDA_ONLY_QUANT = {"fp8", "fbgemm_fp8", "gptq", "awq", "marlin", "exl2", "hqq", "eetq", "fp_quant", "mxfp4"}


def load_config(target: Path, trust_remote_code: bool = False) -> Any:
    """Return the transformers config of a local model dir (reads config.json only)."""
    raw = read_model_config(target)
    from transformers import AutoConfig

    try:
        if is_gguf(target):  # already parsed from the file once: rebuild rather than parse again
            return AutoConfig.for_model(**raw)
        return AutoConfig.from_pretrained(str(target), local_files_only=True, trust_remote_code=trust_remote_code)
    except Exception as exc:  # unknown model_type, custom code refused, ...
        raise EyasError(f"{target}: transformers cannot read its config: {str(exc).strip().splitlines()[0]}") from None


def weight_problems(target: Path) -> list[str]:
    """Return problems with the weight files of `target` (none listed, or shards named by the index missing)."""
    if is_gguf(target):
        return []  # the weights are the file itself, which read_model_config has opened
    indexes = sorted(target.glob("*.index.json"))
    if indexes:
        listed = set(json.loads(indexes[0].read_text(encoding="utf-8")).get("weight_map", {}).values())
        return [f"{target / name}: missing (listed in {indexes[0].name})" for name in sorted(listed)
                if not (target / name).is_file()]
    if not any(target.glob("*.safetensors")) and not any(target.glob("*.bin")):
        return [f"{target}: no weight files (*.safetensors or *.bin)"]
    return []


def quantization_problems(config: Any, device: str) -> list[str]:
    """Return why this machine cannot load the target's quantized weights (empty if it can)."""
    quant = getattr(config, "quantization_config", None)
    if not quant:
        return []
    method = (quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)) or "?"
    method = str(getattr(method, "value", method))
    problems = []
    if method in _CUDA_ONLY_QUANT and (device == "cpu" or not torch.cuda.is_available()):
        problems.append(f"quantization_config: {method} weights need a CUDA device; this run has {device}")
    if method == "compressed-tensors" and importlib.util.find_spec("compressed_tensors") is None:
        problems.append("quantization_config: compressed-tensors weights need the `compressed-tensors` package")
    return problems


def build_meta_target(config: Any, dtype: torch.dtype) -> TargetParts:
    """Return the target's parts built from its config on the meta device: no weights read or allocated."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return locate_parts(model.to(dtype).eval())


@contextlib.contextmanager
def meta_execution() -> Iterator[None]:
    """Let a meta-device forward pass through two things meta tensors cannot do on their own.

    - `torch.autocast(device_type="meta")`, which transformers 4.x rotary embeddings open, is
      run as a CPU autocast (they only use it to turn autocast off);
    - `nonzero` (MoE expert dispatch loops in transformers 4.x) returns the all-nonzero shape, so
      every expert runs once: shapes stay exact, no value is read;
    - a `ModuleList` indexed by a meta tensor (those loops pick `experts[expert_idx]`, which reads the
      index's value) returns its first module: every expert has the same shapes.
    The patches are undone on exit.
    """
    original = torch.autocast
    module_at = nn.ModuleList.__getitem__

    def meta_safe_module_at(self: nn.ModuleList, index: Any) -> Any:
        if isinstance(index, torch.Tensor) and index.device.type == "meta":
            return module_at(self, 0)
        return module_at(self, index)

    class MetaSafeAutocast(original):  # type: ignore[misc, valid-type]
        def __init__(self, device_type: str, *args: Any, **kwargs: Any) -> None:
            super().__init__("cpu" if device_type == "meta" else device_type, *args, **kwargs)

    from torch.fx.experimental import _config as fx_config

    torch.autocast = MetaSafeAutocast
    nn.ModuleList.__getitem__ = meta_safe_module_at  # type: ignore[method-assign]
    try:
        with fx_config.patch(meta_nonzero_assume_all_nonzero=True):
            yield
    finally:
        torch.autocast = original
        nn.ModuleList.__getitem__ = module_at  # type: ignore[method-assign]


def resolve_device(device: str | None) -> str:
    """Return the device to run on: `device` as given (a stage config has checked its name), or `cuda` when
    available and none was asked for, else `cpu`. Refuses (exit 3, this machine cannot run it) a CUDA device
    torch cannot see. `auto` (a device map over the GPUs, where a stage takes it) passes as it is.
    """
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise CannotRun(f"--device: {device} asked for, but torch sees no CUDA device")
        index = torch.device(device).index
        if index is not None and index >= torch.cuda.device_count():
            raise CannotRun(f"--device: {device} asked for, but torch sees {torch.cuda.device_count()} CUDA device(s)")
    return device


def load_target(target: Path, dtype: torch.dtype, device: str, trust_remote_code: bool = False) -> TargetParts:
    """Return the parts of the target with its weights, in eval mode on `device` (`auto` spreads it over GPUs).

    A GGUF target is dequantized by transformers into `dtype` while loading.
    """
    from transformers import AutoModelForCausalLM

    path, kwargs = hf_location(target)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, local_files_only=True, trust_remote_code=trust_remote_code,
            device_map="auto" if device == "auto" else None, **kwargs,
        )
    except Exception as exc:  # corrupt shard, OOM, unsupported architecture, ...
        raise EyasError(f"{target}: loading the weights failed: {str(exc).strip().splitlines()[0]}") from None
    if device != "auto":
        model = model.to(device)
    return locate_parts(model.eval())
