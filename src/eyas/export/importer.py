"""`eyas import`: a published EAGLE-3 draft (EAGLE-3 HF format or speculators) as an eyas draft directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from eyas.config import ImportConfig
from eyas.draft.config import CONFIG_FILE, WEIGHTS_FILE, DraftConfig, target_problems
from eyas.draft.model import write_draft
from eyas.errors import EyasError
from eyas.files import sha256_tree
from eyas.export.reader import Published, draft_config_of, read_published, resolve_ids, tensor_problems
from eyas.stage import Stage
from eyas.models.fingerprint import TargetFingerprint


def target_facts(target: Path, trust_remote_code: bool = False,
                 chat_template: Path | None = None) -> tuple[TargetFingerprint, Any]:
    """Return the fingerprint (with the chat template file `chat_template` in place of the target's own, when
    given) and transformers config of a target (no weights are read)."""
    from eyas.models.fingerprint import target_fingerprint
    from eyas.models.load import load_config
    from eyas.models.tokenizer import load_tokenizer

    return (target_fingerprint(target, load_tokenizer(target, trust_remote_code, chat_template)),
            load_config(target, trust_remote_code))


def num_layers_of(target_config: Any) -> int:
    return int((getattr(target_config, "text_config", None) or target_config).num_hidden_layers)


def checked_config(published: Published, aux_ids: list[int], fingerprint: TargetFingerprint | None) -> DraftConfig:
    """Return eyas's config of the published draft; refuses, in one line naming each field once, the draft's
    field problems (`eyas.export.reader.field_problems`) or else the values eyas cannot build a draft from
    (out of range: those the config gives, not the sizes derived from them)."""
    if published.problems:
        raise EyasError("; ".join(published.problems))
    try:
        return draft_config_of(published, aux_ids, fingerprint)
    except ValidationError as exc:
        given = {**published.config, **published.layer}
        errors = [error for error in exc.errors() if error["loc"][0] in given] or exc.errors()
        raise EyasError("; ".join(f"{published.path / CONFIG_FILE}: {'.'.join(map(str, error['loc']))}: {error['msg']}"
                                  for error in errors)) from None


def eyas_tensors(published: Published, config: DraftConfig) -> dict[str, torch.Tensor]:
    """Return the draft's tensors as eyas saves them, `d2t` (identity when absent) and `t2d` (from `d2t`) included."""
    tensors = {name: t for name, t in published.tensors.items() if name not in ("d2t", "t2d")}
    d2t = published.tensors.get("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.int64)).long()
    t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
    t2d[torch.arange(len(d2t)) + d2t] = True
    return {**tensors, "d2t": d2t, "t2d": t2d}


IMPORT = Stage("import", "an eyas draft", (CONFIG_FILE, WEIGHTS_FILE))


def import_draft(config: ImportConfig) -> DraftConfig:
    """Write the published draft in `config.source` as an eyas draft in `config.out`; return its config.

    Refuses, naming every problem at once, a draft with missing/unexpected/misshaped tensors or a
    broken vocabulary mapping, or (with `target`) one that does not fit the target; an output
    directory as every stage does (eyas.stage).
    """
    published = read_published(config.source)
    target = config.target
    fingerprint, target_config = target_facts(target, config.trust_remote_code, config.chat_template) if target is not None else (None, None)
    aux_ids = resolve_ids(published, config.layer_convention,
                          num_layers_of(target_config) if target_config is not None else None)
    draft_config = checked_config(published, aux_ids, fingerprint)
    problems = tensor_problems(published, draft_config)
    if target_config is not None:
        problems += target_problems(draft_config, None, target_config)  # the fingerprint is this very target's
    if problems:
        raise EyasError(f"{config.source}: " + "; ".join(problems))
    IMPORT.claim(config, {"source": sha256_tree(config.source), "target": fingerprint.id if fingerprint else None})
    write_draft(draft_config, eyas_tensors(published, draft_config), config.out)
    return draft_config
