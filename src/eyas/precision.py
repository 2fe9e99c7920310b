"""The dtype a stage computes in: `auto` is bfloat16 only where the device computes it natively.

On CUDA, bfloat16 is native where `torch.cuda.is_bf16_supported()` says so (Ampere and newer). On an
x86 CPU, bfloat16 matrix products are native only with AVX-512-BF16 or AMX; elsewhere (AVX2, or
AVX-512 without BF16) torch emulates them by converting to float32 and back, which ran a SmolLM2
prefill 6x slower than float32 on an AVX2 EPYC. float16 on a CPU is native only with AVX-512-FP16
or AMX-FP16. So `auto` resolves to bfloat16 on such devices and to float32 everywhere else; an
explicit dtype is honoured, with one warning when this CPU emulates it.

A target that is a quantized (packed) GGUF file runs in float32 under `auto` on any device: its
weights dequantize exactly into float32 (bfloat16 would round every one), and where transformers
keeps them packed its kernels compute in float32, casting a bfloat16 model's every matmul input and
output (transformers says so when loading). A directory `eyas materialise` wrote follows the rule above.

The resolved choice and its reason are printed once per process (the demo runs several stages in
one process) and recorded in each stage's resolved config and manifest or report (`Precision.record`).
torch is imported on first use: the configs import this module, and `eyas audit` needs no torch.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

DtypeChoice = Literal["auto", "bfloat16", "float16", "float32"]
AUTO = "auto"
_CPUINFO = Path("/proc/cpuinfo")
_said: set[str] = set()


@dataclass(frozen=True)
class CpuFeatures:
    """What torch dispatches to on this CPU (`capability`, as torch reports it) and the instruction sets
    that make half-precision matrix products native."""

    capability: str
    avx512_bf16: bool
    amx_bf16: bool
    avx512_fp16: bool
    amx_fp16: bool

    @property
    def avx512_kernels(self) -> bool:
        """Whether torch runs its AVX-512 kernels (ATEN_CPU_CAPABILITY=default or avx2 lowers them, and torch's
        bfloat16 paths then cannot use the CPU's BF16/AMX instructions: they fail in `pack_vnni2`)."""
        return self.capability.startswith("AVX512")

    @property
    def native_bfloat16(self) -> bool:
        return (self.avx512_bf16 or self.amx_bf16) and self.avx512_kernels

    @property
    def native_float16(self) -> bool:
        return (self.avx512_fp16 or self.amx_fp16) and self.avx512_kernels


@cache
def cpu_features() -> CpuFeatures:
    """Return this CPU's features: torch's kernel capability (which `ATEN_CPU_CAPABILITY` may lower)
    and the half-precision instruction sets from /proc/cpuinfo (all False where it cannot be read)."""
    import torch

    flags: set[str] = set()
    if _CPUINFO.is_file():
        for line in _CPUINFO.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("flags"):
                flags = set(line.partition(":")[2].split())
                break
    return CpuFeatures(capability=torch.backends.cpu.get_cpu_capability(), avx512_bf16="avx512_bf16" in flags,
                       amx_bf16="amx_bf16" in flags, avx512_fp16="avx512_fp16" in flags, amx_fp16="amx_fp16" in flags)


def machine_record() -> dict[str, object]:
    """Return the facts that decide CPU figures, for bench lines and reports: torch's CPU capability,
    its intra-op thread count and whether bfloat16 is native here."""
    import torch

    features = cpu_features()
    return {"cpu_capability": features.capability, "torch_threads": torch.get_num_threads(),
            "bf16_native_cpu": features.native_bfloat16}


@dataclass(frozen=True)
class Precision:
    """A stage's dtype: what was asked (`auto` or a dtype), what it runs in, and why."""

    requested: str
    dtype: Literal["bfloat16", "float16", "float32"]
    reason: str
    emulated: bool

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.dtype)

    def record(self) -> dict[str, object]:
        """Return the JSON record written into manifests and reports."""
        return {"requested": self.requested, "dtype": self.dtype, "reason": self.reason, "emulated": self.emulated}

    def announce(self, what: str) -> None:
        """State the choice for `what` (e.g. "extract dtype") on stderr, once per process: `auto`'s
        choice and reason, or a warning for an explicit dtype this device emulates (a native explicit
        dtype is not stated). Stages call it once their inputs are accepted, so a refusal stays one line."""
        if self.emulated:
            line = f"warning: {what} {self.requested} is slow here: {self.reason} (dtype auto would pick float32)"
        elif self.requested == AUTO:
            line = self.note(what)
        else:
            return
        if line not in _said:
            _said.add(line)
            print(f"eyas: {line}", file=sys.stderr)

    def note(self, what: str) -> str:
        """Return the one line that states the choice for `what` (e.g. "extract dtype")."""
        verb = "->" if self.requested == AUTO else "="
        return f"{what} {self.requested} {verb} {self.dtype}: {self.reason}"


def _device_kind(device: str | None) -> str:
    import torch

    if device in (None, AUTO):
        return "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device).type


def _native(dtype: str, device: str) -> tuple[bool, str]:
    """Return whether `device` computes `dtype` natively, and the reason in words."""
    import torch

    if dtype == "float32":
        return True, "float32 is native everywhere"
    if device == "cuda":
        if dtype == "float16":
            return True, "CUDA computes float16 natively"
        supported = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
        return supported, f"{name} {'has' if supported else 'lacks'} native bfloat16"
    if device != "cpu":
        return False, f"eyas does not know whether {device} computes {dtype} natively"
    features = cpu_features()
    if dtype == "bfloat16":
        found = [name for name, has in (("AVX-512-BF16", features.avx512_bf16), ("AMX-BF16", features.amx_bf16)) if has]
        if found and not features.avx512_kernels:
            return False, (f"this CPU has {' and '.join(found)} but torch runs {features.capability} kernels "
                           "(ATEN_CPU_CAPABILITY), which cannot use them")
        if found:
            return True, f"this CPU has {' and '.join(found)} (torch capability {features.capability})"
        return False, f"this CPU (torch capability {features.capability}) has no AVX-512-BF16 or AMX: bfloat16 is emulated"
    found = [name for name, has in (("AVX-512-FP16", features.avx512_fp16), ("AMX-FP16", features.amx_fp16)) if has]
    if found and not features.avx512_kernels:
        return False, (f"this CPU has {' and '.join(found)} but torch runs {features.capability} kernels "
                       "(ATEN_CPU_CAPABILITY), which cannot use them")
    if found:
        return True, f"this CPU has {' and '.join(found)} (torch capability {features.capability})"
    return False, f"this CPU (torch capability {features.capability}) has no AVX-512-FP16 or AMX-FP16: float16 is emulated"


def _packed_gguf(target: Path | None) -> bool:
    """Return whether `target` is a GGUF file holding quantized (block) tensors; refuses an unreadable GGUF."""
    from eyas.models.fingerprint import is_gguf

    if target is None or not is_gguf(target) or not target.is_file():
        return False
    from eyas.models.gguf_file import read_gguf_metadata

    return read_gguf_metadata(target).packed


def choose_dtype(requested: str, device: str | None, target: Path | None = None) -> Precision:
    """Return the dtype a stage asked for `requested` runs in on `device` (None: cuda if present, else cpu)
    for the model `target` (where the stage runs a target).

    `auto` gives float32 for a quantized GGUF target, else bfloat16 where the device computes it natively
    and float32 otherwise; an explicit dtype is kept (`emulated` when this device does not compute it
    natively). Refuses only an unreadable GGUF target: any dtype runs, emulated ones slowly. Says nothing:
    `Precision.announce` does, once the stage starts.
    """
    kind = _device_kind(device)
    if requested == AUTO and _packed_gguf(target):
        return Precision(AUTO, "float32", f"{target.name} is a quantized GGUF: its weights dequantize exactly into "  # type: ignore[union-attr]
                         "float32, and transformers computes packed GGUF weights in float32", emulated=False)
    if requested == AUTO:
        native, why = _native("bfloat16", kind)
        return Precision(AUTO, "bfloat16" if native else "float32", why, emulated=False)
    native, why = _native(requested, kind)
    return Precision(requested, requested, why if not native else "as configured", emulated=not native)  # type: ignore[arg-type]
