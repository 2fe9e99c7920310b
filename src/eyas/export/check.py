"""`eyas check-draft`: everything an engine would trip over in a draft directory, in one report,
before anyone starts a server."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from eyas.errors import EyasError
from eyas.export.formats import CONVENTION_OF, Convention, from_convention
from eyas.export.importer import checked_config, num_layers_of, target_facts
from eyas.export.reader import default_ids, read_published, target_fit_problems, tensor_problems

Engine = Literal["vllm", "sglang"]


def check_draft(path: Path, target: Path, engine: Engine, trust_remote_code: bool = False) -> list[str]:
    """Return every problem of the draft in `path` for serving with `target` on `engine` (empty: none).

    The layer ids are read in the engine's convention, as the engine will read them.
    """
    convention: Convention = CONVENTION_OF[engine]
    published = read_published(path)
    fingerprint, target_config = target_facts(target, trust_remote_code)
    problems = list(published.problems)
    if engine == "sglang" and published.kind == "speculators":
        problems.append("format: SGLang loads the EAGLE-3 HF format (LlamaForCausalLMEagle3), not speculators "
                        "(eyas export --format sglang)")
    if published.convention is not None and published.convention != convention:
        problems.append(f"eagle_aux_hidden_state_layer_ids: written for the {published.convention} convention, {engine} "
                        f"reads the {convention} convention (one layer off; re-export with --format {engine})")
    ids = from_convention(published.ids, convention) if published.ids else default_ids(num_layers_of(target_config))
    try:
        config = checked_config(published, ids, None)
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
    problems += target_fit_problems(config, target_config, convention)
    provenance = published.config.get("eyas") if isinstance(published.config.get("eyas"), dict) else {}
    trained_for = (provenance.get("target") or {}).get("id")
    if trained_for and trained_for != fingerprint.id:
        problems.append(f"target: exported for fingerprint {trained_for[:12]}, this target is {fingerprint.id[:12]}")
    return problems
