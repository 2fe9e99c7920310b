"""`eyas check-draft`: everything an engine would trip over in a draft directory, in one report,
before anyone starts a server."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from eyas.draft.config import target_problems
from eyas.errors import EyasError
from eyas.export.formats import CONVENTION_OF
from eyas.export.importer import checked_config, num_layers_of, target_facts
from eyas.export.reader import Published, read_published, resolve_ids, tensor_problems
from eyas.models.fingerprint import TargetFingerprint
from eyas.models.layers import Convention

Engine = Literal["vllm", "sglang"]


def trained_for(published: Published) -> tuple[TargetFingerprint | None, list[str]]:
    """Return the fingerprint of the target an eyas export records (None in drafts eyas did not export),
    and the problem of a recorded one that is no fingerprint."""
    provenance = published.config.get("eyas")
    recorded = provenance.get("target") if isinstance(provenance, dict) else None
    if recorded is None:
        return None, []
    try:
        return TargetFingerprint.model_validate(recorded), []
    except ValidationError:
        return None, ["eyas.models: not a target fingerprint (an eyas export records one)"]


def _ids_as_read(published: Published, convention: Convention, num_layers: int) -> tuple[list[int] | None, list[str]]:
    """Return the aux layer ids (input convention) as an engine counting in `convention` reads them from the files,
    and what is wrong with them for a `num_layers`-layer target (empty: nothing). Ids out of range for the target
    still come back, so that the rest of the draft is checked too; None when the ids cannot be read at all."""
    try:
        return resolve_ids(published, convention, num_layers), []
    except EyasError as error:
        problems = [str(error)]
    try:
        return resolve_ids(published, convention, None), problems
    except EyasError:
        return None, problems


def check_draft(path: Path, target: Path, engine: Engine, trust_remote_code: bool = False,
                chat_template: Path | None = None) -> list[str]:
    """Return every problem of the draft in `path` for serving with `target` on `engine` (empty: none).

    The layer ids are read in the engine's convention, as the engine will read them (EAGLE-3's
    defaults when the files give none), and checked as `eyas.models.layers` checks every id list;
    the draft is checked against the target as `eyas eval` checks it (`target_problems`). Refuses
    (raises) only a directory that holds no readable EAGLE-3 draft: config or weights missing or
    unreadable.
    """
    convention: Convention = CONVENTION_OF[engine]
    published = read_published(path)
    fingerprint, target_config = target_facts(target, trust_remote_code, chat_template)
    recorded, provenance_problems = trained_for(published)
    problems = [*published.problems, *provenance_problems]
    if engine == "sglang" and published.kind == "speculators":
        problems.append("format: SGLang loads the EAGLE-3 HF format (LlamaForCausalLMEagle3), not speculators "
                        "(eyas export --format sglang)")
    if published.convention is not None and published.convention != convention:
        problems.append(f"eagle_aux_hidden_state_layer_ids: written for the {published.convention} convention, {engine} "
                        f"reads the {convention} convention (one layer off; re-export with --format {engine})")
    ids, id_problems = _ids_as_read(replace(published, convention=None), convention, num_layers_of(target_config))
    problems += id_problems
    if ids is None or published.problems:  # no config to check the weights and the target against
        return problems
    try:
        config = checked_config(published, ids, recorded)
    except EyasError as error:
        return [*problems, str(error)]
    if engine == "sglang" and config.num_hidden_layers > 1:
        problems.append(f"num_hidden_layers: {config.num_hidden_layers}; SGLang's EAGLE-3 draft has one layer")
    if "draft_vocab_size" not in published.config:
        problems.append("draft_vocab_size: missing; engines then take the vocabulary as the target's")
    problems += tensor_problems(published, config)
    if engine == "sglang":
        problems = [p + " (SGLang skips unknown tensors silently)" if p.endswith("unexpected tensor") else p
                    for p in problems]
    return problems + target_problems(config, fingerprint, target_config, layer_ids=False)  # ids: checked above
