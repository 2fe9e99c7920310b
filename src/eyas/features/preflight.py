"""Weightless preflight of `eyas extract`: every check that needs no weights, all reported at once.

The target is built from its config on the meta device (no weights read, any size in seconds)
and the whole capture path runs on a meta batch, so shapes and dtypes of everything that will be
stored are known before a single weight is loaded; then files, dataset provenance, device,
quantization support, free disk and the output directory are checked.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eyas.audit.contract import engine_api_problems
from eyas.config import ExtractConfig
from eyas.data.dataset import DatasetManifest, no_samples_problem, read_manifest
from eyas.data.prepare import dataset_target_problem
from eyas.errors import EyasError
from eyas.features.store import bytes_per_token
from eyas.models.capture import FeatureCapture, teacher_logits
from eyas.models.fingerprint import TargetFingerprint, is_gguf, target_fingerprint
from eyas.models.layers import default_aux_layers, to_input_convention
from eyas.models.load import build_meta_target, load_config, meta_execution, quantization_problems, resolve_device, weight_problems
from eyas.models.tokenizer import load_tokenizer

_META_BATCH, _META_TOKENS = 2, 16


@dataclass
class ExtractPlan:
    """What preflight resolved, for the extraction to use: nothing here holds weights."""

    hf_config: Any = None
    target: TargetFingerprint | None = None
    dataset: DatasetManifest | None = None
    aux_ids: list[int] = field(default_factory=list)
    num_layers: int = 0
    hidden_size: int = 0
    device: str = "cpu"
    problems: list[str] = field(default_factory=list)
    facts: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


def _writable(out: Path) -> str | None:
    existing = _nearest_existing(out)
    if not existing.is_dir():
        return f"{out}: not writable ({existing} is not a directory)"
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".eyas-write-test-"):
            pass
    except OSError as exc:
        return f"{out}: not writable ({exc.strerror})"
    return None


def _dry_run(plan: ExtractPlan) -> None:
    """Build the target on meta, run capture and the teacher on a meta batch, check every shape and dtype.

    The meta model runs in bfloat16 whatever the extraction dtype: some meta kernels (grouped_mm,
    used by MoE experts) exist only for bf16, and shapes do not depend on the dtype. The check
    that captured features keep the model's dtype holds for any dtype.
    """
    dtype = torch.bfloat16
    started = time.perf_counter()
    try:
        parts = build_meta_target(plan.hf_config, dtype)
    except EyasError as error:
        plan.problems.append(str(error))
        return
    except Exception as exc:  # transformers cannot build this architecture
        plan.problems.append(f"{type(exc).__name__} building the target on the meta device: {exc}")
        return
    ids = torch.zeros(_META_BATCH, _META_TOKENS, dtype=torch.long, device="meta")
    # a ready 4-D causal mask: transformers' 2-D mask preprocessing inspects values, which meta has none of
    mask = torch.ones(_META_BATCH, 1, _META_TOKENS, _META_TOKENS, dtype=torch.bool, device="meta").tril()
    try:
        with meta_execution(), FeatureCapture(parts, plan.aux_ids) as capture:
            captured = capture.run(ids, mask)
            logits = teacher_logits(parts, captured.last)
    except Exception as exc:  # the capture path itself broke: exactly what preflight is for
        plan.problems.append(f"capture dry run on {type(parts.model).__name__}: {type(exc).__name__}: {exc}")
        return
    hidden, width = plan.hidden_size, len(plan.aux_ids) * plan.hidden_size
    vocab = plan.target.vocab_size if plan.target else logits.shape[-1]
    for name, tensor, shape in (("aux", captured.aux, (_META_BATCH, _META_TOKENS, width)),
                                ("last", captured.last, (_META_BATCH, _META_TOKENS, hidden)),
                                ("teacher logits", logits, (_META_BATCH, _META_TOKENS, vocab))):
        if tuple(tensor.shape) != shape:
            plan.problems.append(f"capture dry run: {name} has shape {tuple(tensor.shape)}, expected {shape}")
        if tensor.dtype != dtype:
            plan.problems.append(f"capture dry run: {name} has dtype {tensor.dtype}, expected {dtype}")
    plan.facts["model class"] = type(parts.model).__name__
    plan.facts["capture dry run"] = f"ok on meta in {time.perf_counter() - started:.1f}s (aux {width}, last {hidden})"


def _vllm_checks(config: ExtractConfig, plan: ExtractPlan) -> None:
    """Add the vLLM backend's problems: vLLM missing, unsupported or not matching eyas's contract, a CUDA
    build without a GPU, a GGUF target, torchrun, a device other than the build's (vLLM places the target
    itself)."""
    from eyas.distributed import current_ranks
    from eyas.backends.vllm.contract import installed_vllm, vllm_problems
    from eyas.backends.vllm.extractor import NO_GPU

    problems, facts = vllm_problems()
    plan.problems += problems
    plan.facts.update(facts)
    installed = installed_vllm()
    build = "cuda" if installed is None else installed.device
    if installed is not None and build == "cuda" and not torch.cuda.is_available():
        plan.problems.append(NO_GPU)
    if is_gguf(config.target):
        plan.problems.append(f"{config.target}: --backend vllm takes a Hugging Face model directory, not a GGUF file")
    if current_ranks().world > 1:
        plan.problems.append("--backend vllm: run one process, not torchrun (vLLM shards the target: --tensor-parallel-size)")
    if config.device not in (None, build):
        plan.problems.append(f"--device {config.device}: the hf backend's option; vLLM places the target itself "
                             f"(the installed build runs on {build})")


def preflight_extract(config: ExtractConfig, checks: bool = True) -> ExtractPlan:
    """Return the plan of an extraction with every problem found before loading weights (none: ok).

    With `checks=False` (`--no-preflight`) only what the extraction needs is resolved (dataset,
    target fingerprint, layer ids): no engine API audit, backend checks, meta dry run or disk check.
    """
    plan = ExtractPlan()
    plan.device = resolve_device(config.device)  # a bad name (exit 2) or a device this machine lacks (exit 3) ends it
    if checks:
        engine_problems, engine_facts = engine_api_problems()
        plan.problems += engine_problems
        plan.facts.update(engine_facts)
        if config.backend == "vllm":
            _vllm_checks(config, plan)
    try:
        plan.dataset = read_manifest(config.data)
    except EyasError as error:
        plan.problems.append(str(error))
    try:
        plan.hf_config = load_config(config.target, config.trust_remote_code)
        tokenizer = load_tokenizer(config.target, config.trust_remote_code, config.chat_template)
        plan.target = target_fingerprint(config.target, tokenizer)
    except EyasError as error:
        plan.problems.append(str(error))
    if plan.dataset and plan.target and (
            mismatch := dataset_target_problem(config.data, plan.dataset, config.target, plan.target, config.chat_template)):
        plan.problems.append(mismatch)
    if plan.dataset and (empty := no_samples_problem(config.data, plan.dataset)):
        plan.problems.append(empty)
    if plan.hf_config is not None:
        plan.num_layers = int(plan.hf_config.num_hidden_layers)
        plan.hidden_size = int(plan.hf_config.hidden_size)
        try:
            if config.layers is None:
                plan.aux_ids = default_aux_layers(plan.num_layers)
            elif config.layer_convention is None:
                raise EyasError("layer_convention: required with --layers (input: EAGLE/vLLM ids, output: SGLang ids)")
            else:
                plan.aux_ids = to_input_convention(config.layers, config.layer_convention, plan.num_layers,
                                                   engine=True)  # a draft the engines will feed in ascending order
        except EyasError as error:
            plan.problems.append(str(error))
        if checks:
            plan.problems += weight_problems(config.target) + quantization_problems(plan.hf_config, plan.device)
            if plan.aux_ids:
                sglang = f"{[i - 1 for i in plan.aux_ids]} as outputs (SGLang ids)" if 0 not in plan.aux_ids \
                    else "SGLang cannot name input 0 (the embeddings)"
                plan.facts["aux layers"] = f"{plan.aux_ids} as inputs of layers (vLLM ids); {sglang}"
                _dry_run(plan)
    if not checks:
        return plan
    if plan.dataset and plan.hidden_size and plan.aux_ids:
        per_token = bytes_per_token(plan.hidden_size, len(plan.aux_ids), config.storage_dtype)
        needed = plan.dataset.counts.get("tokens", 0) * per_token
        free = shutil.disk_usage(_nearest_existing(config.out)).free
        plan.facts["store size"] = f"{needed / 2**30:.2f} GiB estimated ({per_token:,} B/token), {free / 2**30:.1f} GiB free"
        if needed > free:
            plan.problems.append(f"{config.out}: needs about {needed / 2**30:.2f} GiB, only {free / 2**30:.2f} GiB free")
    if (problem := _writable(config.out)) is not None:
        plan.problems.append(problem)
    return plan
