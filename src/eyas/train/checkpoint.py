"""Training checkpoints: draft weights, optimizer and scheduler state, RNG and data position.

`RUN_DIR/checkpoints/step-SSSSSSSS/` holds `draft/` (an eyas draft directory), `optimizer.safetensors`
(AdamW moments by parameter name), `rng.safetensors` and `trainer.json` (step, data position,
tokens seen, best score, the metric sums not yet logged; the learning rate is a function of the step). Each checkpoint is
written to a hidden temporary directory and renamed into place, so a kill leaves either the
previous set or the new complete one. Only safetensors and JSON are read back (no pickle).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from pydantic import BaseModel
from safetensors.torch import save_file

from eyas.draft.config import DraftConfig
from eyas.draft.model import Eagle3Draft, load_draft, write_draft
from eyas.errors import EyasError
from eyas.files import read_json_object, read_tensors, write_atomic, write_json_atomic, writing
from eyas.train.sharding import full_tensor, like

CHECKPOINTS = "checkpoints"


class TrainerState(BaseModel):
    """`trainer.json`: where the run stands."""

    run_key: str
    step: int
    epoch: int
    step_in_epoch: int
    tokens: int
    best_step: int | None = None
    best_tau: float | None = None
    window: list[list[float]] = []
    window_loss_tokens: float = 0.0
    last_train: dict[str, float] = {}
    last_eval: dict[str, float] | None = None


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / CHECKPOINTS / f"step-{step:08d}"


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Return the finished checkpoint directories of a run, oldest first."""
    root = run_dir / CHECKPOINTS
    return sorted(p for p in root.glob("step-*") if (p / "trainer.json").is_file()) if root.is_dir() else []


def optimizer_tensors(draft: Eagle3Draft, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Return the AdamW state as whole CPU tensors named `PARAM/SLOT` (a collective under FSDP)."""
    names = {id(p): name for name, p in draft.named_parameters()}
    tensors = {}
    for param, state in optimizer.state.items():
        for key, value in state.items():
            tensors[f"{names[id(param)]}/{key}"] = full_tensor(torch.as_tensor(value)).detach().to("cpu").contiguous()
    return tensors


def save_checkpoint(run_dir: Path, config: DraftConfig, weights: dict[str, torch.Tensor],
                    optimizer: dict[str, torch.Tensor], state: TrainerState) -> Path:
    """Write the checkpoint of `state.step` atomically from whole tensors; return its directory.

    On any failure (a full disk raises `DiskFull` naming the checkpoint directory, SIGTERM) the
    temporary directory is removed and the previous checkpoints are untouched.
    """
    final = checkpoint_dir(run_dir, state.step)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with writing(final):
            tmp.mkdir(parents=True)
            write_draft(config, weights, tmp / "draft")
            write_atomic(tmp / "optimizer.safetensors", lambda path: save_file(optimizer, str(path)))
            rng = {"cpu": torch.get_rng_state()}
            if torch.cuda.is_available():
                rng.update({f"cuda{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
            write_atomic(tmp / "rng.safetensors", lambda path: save_file(rng, str(path)))
            write_json_atomic(tmp / "trainer.json", state.model_dump(mode="json"))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def load_checkpoint(path: Path, draft: Eagle3Draft, optimizer: torch.optim.Optimizer) -> TrainerState:
    """Restore draft weights, optimizer moments and RNG from `path`; return its state.

    Sharded (FSDP) parameters get this rank's shard, so a checkpoint resumes with or without FSDP.
    """
    state = TrainerState.model_validate(read_json_object(path / "trainer.json"))
    saved = load_draft(path / "draft").trainable_state()
    with torch.no_grad():
        for name, tensor in draft.state_dict(keep_vars=True).items():
            if name in saved:
                tensor.copy_(like(tensor, saved[name]))
    tensors = read_tensors(path / "optimizer.safetensors")
    by_name = dict(draft.named_parameters())
    for key, value in tensors.items():
        name, _, slot = key.rpartition("/")
        if name not in by_name:
            raise EyasError(f"{path / 'optimizer.safetensors'}: {key}: no such draft parameter")
        param = by_name[name]
        optimizer.state[param][slot] = like(param, value) if slot != "step" else value
    rng = read_tensors(path / "rng.safetensors")
    torch.set_rng_state(rng["cpu"])
    if torch.cuda.is_available():
        torch.cuda.set_rng_state_all([rng[k] for k in sorted(rng) if k.startswith("cuda")])
    return state


def prune_checkpoints(run_dir: Path, keep_last: int, best_step: int | None) -> None:
    """Delete all but the newest `keep_last` checkpoints and the best one."""
    finished = list_checkpoints(run_dir)
    keep = {p.name for p in finished[-keep_last:]}
    if best_step is not None:
        keep.add(checkpoint_dir(run_dir, best_step).name)
    for path in finished:
        if path.name not in keep:
            shutil.rmtree(path)
    for stale in (run_dir / CHECKPOINTS).glob(".step-*.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
