"""Everything `eyas train` decides before touching weights: mode, target, vocabulary, draft config,
and the checks that a store, a dataset, a warm-start draft and the target belong together."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import load_file

from eyas.config import TrainConfig
from eyas.data import dataset as ds
from eyas.data.prepare import dataset_target_problem, recorded_template
from eyas.data.vocab import DraftVocab, cached_draft_vocab, check_draft_vocab_size, load_draft_vocab
from eyas.draft.config import DraftConfig, draft_config_for_target, read_draft_config, target_problems
from eyas.errors import EyasError
from eyas.features.store import MANIFEST, StoreManifest, open_store, read_store_manifest
from eyas.files import reading
from eyas.models.fingerprint import TargetFingerprint, target_fingerprint
from eyas.models.layers import check_layer_ids, default_aux_layers, to_input_convention
from eyas.models.load import load_config
from eyas.models.tokenizer import load_tokenizer, template_mismatch

DEFAULT_DRAFT_VOCAB = 32000


@dataclass(frozen=True)
class TrainSetup:
    """The resolved inputs of a training run."""

    online: bool
    target: Path
    dataset_dir: Path
    store: StoreManifest | None
    vocab: DraftVocab
    draft_config: DraftConfig


def check_store_matches(store_dir: Path, manifest: StoreManifest, draft: DraftConfig) -> None:
    """Refuse a feature store that was not extracted for `draft`: another target, hidden size,
    aux layers, layer convention or an argmax over another vocabulary size (each named, all at once)."""
    problems = []
    if draft.target is not None and manifest.target.id != draft.target.id:
        problems.append(f"target: extracted from {manifest.target_path} (fingerprint {manifest.target.id[:12]}), "
                        f"the draft is for fingerprint {draft.target.id[:12]}")
    if manifest.hidden_size != draft.target_hidden_size:
        problems.append(f"hidden_size: {manifest.hidden_size}, the draft reads {draft.target_hidden_size}")
    if manifest.layer_convention != draft.layer_convention:
        problems.append(f"layer_convention: {manifest.layer_convention}, the draft uses {draft.layer_convention}")
    if manifest.layer_ids != draft.aux_layer_ids:
        problems.append(f"layer_ids: {manifest.layer_ids}, the draft reads {draft.aux_layer_ids} "
                        f"({draft.layer_convention} convention)")
    if manifest.teacher_argmax is not None and manifest.teacher_argmax.vocab_size != draft.vocab_size:
        problems.append(f"teacher_argmax: ids of a {manifest.teacher_argmax.vocab_size}-token vocabulary, the draft's "
                        f"target has {draft.vocab_size}")
    if problems:
        raise EyasError(f"{store_dir / MANIFEST}: does not match the draft: " + "; ".join(problems))


def _dataset_vocab(dataset_dir: Path, manifest: ds.DatasetManifest, size: int | None) -> DraftVocab:
    """Return the dataset's own vocabulary, or one of `size` selected from its token counts (cached).

    Refuses a `size` that `eyas prepare` refuses (`check_draft_vocab_size`). Without a size and
    without a vocabulary of the dataset's own, the default is DEFAULT_DRAFT_VOCAB tokens, or the
    whole target vocabulary when that is smaller: a default must fit every target, a size asked
    for is never changed.
    """
    if manifest.vocab is not None and size in (None, manifest.vocab.size):
        return load_draft_vocab(dataset_dir / manifest.vocab.file, manifest.fingerprint)
    counts_path = dataset_dir / manifest.token_counts_file
    with reading(counts_path):
        counts = load_file(str(counts_path))["counts"]
    size = check_draft_vocab_size(size, len(counts)) if size is not None else min(DEFAULT_DRAFT_VOCAB, len(counts))
    return cached_draft_vocab(dataset_dir, manifest.fingerprint, counts, size)[0]


def _whole_vocab(size: int) -> DraftVocab:
    """Return the identity vocabulary of a `size`-token target: a DFlash draft reads through the target's LM head."""
    return DraftVocab(np.zeros(size, dtype=np.int64), np.ones(size, dtype=bool), 1.0)


def _warm_start_vocab(init: Path, dataset_dir: Path, manifest: ds.DatasetManifest) -> DraftVocab:
    """Return the vocabulary of the draft in `init`; refuses one that differs from the dataset's own."""
    from safetensors import safe_open

    from eyas.draft.config import WEIGHTS_FILE

    with reading(init / WEIGHTS_FILE), safe_open(str(init / WEIGHTS_FILE), framework="numpy") as handle:
        d2t, t2d = handle.get_tensor("d2t"), handle.get_tensor("t2d")
    if manifest.vocab is not None:
        mine = load_draft_vocab(dataset_dir / manifest.vocab.file, manifest.fingerprint)
        if len(mine.d2t) != len(d2t) or not np.array_equal(mine.d2t, d2t):
            differing = len(np.setdiff1d(np.arange(len(d2t)) + d2t, mine.token_ids))
            raise EyasError(
                f"{init / WEIGHTS_FILE}: d2t: the warm-start draft's vocabulary ({len(d2t)} tokens) differs from "
                f"{dataset_dir / manifest.vocab.file} ({len(mine.d2t)} tokens, {differing} differ); training would "
                "score the draft against the wrong tokens. Prepare the dataset without --draft-vocab-size "
                "(the draft's mapping is then used) or start from scratch"
            )
    return DraftVocab(d2t, t2d, float("nan"))


def _aux_ids(config: TrainConfig, store: StoreManifest | None, num_layers: int) -> list[int]:
    """Return the run's aux layer ids in the input convention: the store's, the configured ones, or
    EAGLE-3's defaults; refuses ids that `eyas.models.layers` refuses for this target."""
    if store is not None:
        return check_layer_ids(store.layer_ids, store.layer_convention, num_layers,
                               f"{config.features / MANIFEST}: layer_ids")  # type: ignore[operator]
    if config.layers is None:
        return default_aux_layers(num_layers)
    if config.layer_convention is None:
        raise EyasError("layer_convention: required with layers (input: vLLM/EAGLE, output: SGLang)")
    return to_input_convention(config.layers, config.layer_convention, num_layers, engine=True)  # as engines feed them


def _check_warm_start(init_dir: Path, init: DraftConfig, target_config: object, aux_ids: list[int]) -> None:
    """Refuse a warm-start draft that `target_problems` finds unfit for the target, or that reads other
    aux layers than this run. Its fingerprint is not compared: a warm start may adapt a draft to a
    changed target of the same shape (a fine-tune of the one it was trained for)."""
    problems = target_problems(init, None, target_config)
    if init.aux_layer_ids != aux_ids:
        problems.append(f"aux_layer_ids: {init.aux_layer_ids}, this run reads layers {aux_ids}")
    if problems:
        raise EyasError(f"{init_dir}: not a warm start for this run: " + "; ".join(problems))


FAMILY_OPTIONS = ("family", "fc_norm", "norm_output", "mask_token_id")


def _check_warm_start_family(config: TrainConfig, init: DraftConfig) -> None:
    """Refuse a warm start from a draft of another family or EAGLE-3.1 option than the run asks for: the
    weights would be read by layers they were not trained as."""
    differs = [f"{name}: --init is {getattr(init, name)}, this run asks for {getattr(config, name)}"
               for name in FAMILY_OPTIONS if getattr(config, name) is not None and getattr(config, name) != getattr(init, name)]
    if differs:
        raise EyasError(f"{config.init}: " + "; ".join(differs) + " (leave them out to keep the warm-start draft's)")


def resolve_train(config: TrainConfig) -> TrainSetup:
    """Return the run's setup; refuses, before any weight is read, inputs that do not belong together."""
    if config.features is None and config.data is None:
        raise EyasError("train: give --features STORE_DIR (offline) or --data DATASET_DIR (online)")
    store = None
    if config.features is not None:
        store = read_store_manifest(config.features)
        open_store(config.features, store)  # sizes, sample ids, checksums: before anything is claimed
    target = config.target or (Path(store.target_path) if store else None)
    if target is None:
        raise EyasError("target: required for online training (--target)")
    if not target.exists():
        raise EyasError(f"{target}: target not found (--target)")
    dataset_dir = config.data or Path(store.dataset_path)  # type: ignore[union-attr]
    manifest = ds.read_manifest(dataset_dir)
    if store is None and (empty := ds.no_samples_problem(dataset_dir, manifest)):
        raise EyasError(empty)
    if store is not None and manifest.fingerprint != store.dataset_fingerprint:
        raise EyasError(f"{dataset_dir / ds.MANIFEST}: fingerprint: not the dataset the store in {config.features} "
                        "was extracted from")
    fingerprint: TargetFingerprint = target_fingerprint(target, load_tokenizer(target, config.trust_remote_code,
                                                                               config.chat_template))
    if store is not None and store.target.id != fingerprint.id:
        mismatch = template_mismatch("the store", store.target, fingerprint, config.chat_template,
                                     recorded_template(config.features, "extract"))  # type: ignore[arg-type]
        raise EyasError(f"{config.features / MANIFEST}: target: extracted from {store.target_path}, not from {target} "
                        "(fingerprints differ)" + (f"; {mismatch}" if mismatch else ""))
    if problem := dataset_target_problem(dataset_dir, manifest, target, fingerprint, config.chat_template):
        raise EyasError(problem)
    target_config = load_config(target, config.trust_remote_code)
    text_config = getattr(target_config, "text_config", None) or target_config
    num_layers = int(text_config.num_hidden_layers)
    aux_ids = _aux_ids(config, store, num_layers)

    if config.init is not None and config.init_layer is not None:
        raise EyasError("init_layer: not with init (a warm start keeps the layers it was trained to)")
    if config.family == "dflash" and (given := [name for name in ("init_layer", "draft_vocab_size", "fc_norm", "norm_output")
                                             if getattr(config, name) not in (None, False)]):
        raise EyasError(f"family: dflash reads the target's whole vocabulary through its LM head, starts its layers "
                        f"afresh and has none of EAGLE-3.1's options; leave out {', '.join(given)}")
    if config.init is not None:
        init = read_draft_config(config.init)
        _check_warm_start_family(config, init)
        vocab = _whole_vocab(init.vocab_size) if init.family == "dflash" else \
            _warm_start_vocab(config.init, dataset_dir, manifest)
        _check_warm_start(config.init, init, target_config, aux_ids)
        draft_config = DraftConfig.model_validate({**init.model_dump(), "target": fingerprint})
    else:
        dflash = config.family == "dflash"
        vocab = _whole_vocab(int(text_config.vocab_size)) if dflash else \
            _dataset_vocab(dataset_dir, manifest, config.draft_vocab_size)
        draft_config = draft_config_for_target(
            target_config, aux_ids, len(vocab.d2t), fingerprint,
            {"num_hidden_layers": config.num_layers, "intermediate_size": config.intermediate_size,
             "block_size": config.ttt_steps + 1 if dflash else None,
             **{name: getattr(config, name) for name in FAMILY_OPTIONS}},
        )
    if draft_config.block_size is not None and config.ttt_steps != draft_config.block_size - 1:
        raise EyasError(f"ttt_steps: {config.ttt_steps}; the warm-start dflash draft's block of {draft_config.block_size} "
                        f"drafts {draft_config.block_size - 1} tokens, which is what it trains (give --ttt-steps "
                        f"{draft_config.block_size - 1})")
    if len(vocab.t2d) != draft_config.vocab_size:
        raise EyasError(f"vocab: t2d covers {len(vocab.t2d)} target tokens, the target has {draft_config.vocab_size}")
    if store is not None:
        check_store_matches(config.features, store, draft_config)  # type: ignore[arg-type]
    return TrainSetup(store is None, target, dataset_dir, store, vocab, draft_config)


def vocab_tensors(vocab: DraftVocab) -> tuple[torch.Tensor, torch.Tensor]:
    """Return `(d2t [N] int64, t2d [V] bool)` as tensors."""
    return torch.from_numpy(np.asarray(vocab.d2t, dtype=np.int64)), torch.from_numpy(np.asarray(vocab.t2d, dtype=bool))
