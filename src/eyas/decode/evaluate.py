"""The `eyas eval` stage: every prompt decoded by the target alone and speculatively, timed in turn.

Everything that can be refused is refused before a weight loads: the decoding shape, the
prompts file, a bad `--chat-template` file or `--stop-ids`/`--stop-tokens`, and a draft made for
another target (fingerprint, hidden size, vocabulary, layers; a draft trained on data of another
chat template is told which `--chat-template` this run used). Both decoders and vLLM stop at the
target's EOS ids plus the extra stop ids.
Each prompt's results are appended to `REPORT_DIR/results.jsonl` as soon as it is done, so an
interrupted evaluation continues where it stopped; the report is computed from those lines. A line holds
both timings of its prompt (the report pairs them, eyas.decode.paired) and, greedy, where its outputs
first differ and why (eyas.decode.divergence).
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch

from eyas.config import DEFAULT_TREE, EvalConfig
from eyas.data.prompts import eos_ids, extra_stop_ids, generate_kwargs, target_eos_ids
from eyas.decode.decoder import Decoder, Generation, shape_problem
from eyas.decode.divergence import first_divergence
from eyas.decode.prompts import read_prompts
from eyas.decode.report import REPORT, EvalReport, summarize, write_report
from eyas.decode.sampling import Sampling
from eyas.decode.served import VllmFigures, serve_in_vllm, serving_problems
from eyas.decode.shapes import AutoShape, TreeShape
from eyas.decode.visibility import attention_layout
from eyas.draft.config import WEIGHTS_FILE, read_draft_config, target_problems
from eyas.draft.model import load_draft, set_embedding
from eyas.errors import CannotRun, EyasError
from eyas.files import read_json_object, sha256_file, write_json_atomic
from eyas.precision import choose_dtype
from eyas.progress import stage_progress
from eyas.stage import Stage
from eyas.models.fingerprint import target_fingerprint
from eyas.models.load import load_config, load_target, resolve_device
from eyas.models.parts import TargetParts
from eyas.models.tokenizer import load_tokenizer, template_mismatch

RESULTS = "results.jsonl"
PROGRESS = "progress.json"
SERVED = "vllm.json"  # vLLM's figures, once measured (eval --engine vllm)
EVAL = Stage("eval", "an eyas eval report", (RESULTS, PROGRESS, REPORT, "acceptance.png", SERVED), keyed=(PROGRESS,))
WARMUP_TOKENS = 8


def decoding_shape(config: EvalConfig) -> TreeShape | AutoShape:
    """Return the auto shape, chain or tree of `config` (auto unless a chain or tree is given); refuses two
    shapes at once, a malformed `--tree`, and an auto shape with nothing to verify."""
    given = [flag for flag, value in (("--shape auto", config.shape), ("--chain", config.chain), ("--tree", config.tree))
             if value is not None]
    if len(given) > 1:
        raise EyasError(f"eval: give one decoding shape, not {' and '.join(given)}")
    if config.chain is not None:
        return TreeShape.chain_of(config.chain)
    if config.tree is None:
        if config.max_chain == 0 and config.lookup == 0:
            raise EyasError("eval: --shape auto with --max-chain 0 and --lookup 0 has nothing to draft")
        return AutoShape(config.max_chain, config.lookup)
    parts = config.tree.split(",")
    if len(parts) != 3 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise EyasError(f"tree: {config.tree!r}: expected DEPTH,TOPK,TOTAL, three positive integers (e.g. {DEFAULT_TREE})")
    depth, top_k, total = map(int, parts)
    return TreeShape(depth, top_k, total)


def prompt_lookup_generate(parts: TargetParts, prompt: list[int], max_new_tokens: int, num_tokens: int,
                           sampling: Sampling, eos: set[int]) -> tuple[int, float]:
    """Return (new tokens, seconds) of transformers' `generate` with prompt-lookup decoding of `num_tokens`."""
    ids = torch.tensor([prompt], device=parts.lm_head.weight.device)
    keywords = generate_kwargs(eos, sampling.temperature, sampling.top_p, sampling.top_k)
    started = time.perf_counter()
    with torch.inference_mode():
        out = parts.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                   prompt_lookup_num_tokens=num_tokens, **keywords)
    return out.shape[1] - len(prompt), time.perf_counter() - started


def _result_line(index: int, base: Generation, spec: Generation, lookup: tuple[int, float] | None,
                 parts: TargetParts) -> dict[str, Any]:
    line: dict[str, Any] = {
        "prompt": index, "new_tokens": len(spec.tokens), "accepted": spec.accepted, "seconds": spec.seconds,
        "target_forwards": spec.target_forwards, "draft_forwards": spec.draft_forwards,
        "baseline_new_tokens": len(base.tokens), "baseline_seconds": base.seconds,
        "baseline_target_forwards": base.target_forwards, "same_tokens": spec.tokens == base.tokens,
    }
    if base.choices is not None:  # greedy
        line["divergence"] = first_divergence(base, spec, parts.lm_head.weight.dtype, parts.lm_head.weight.shape[1])
    if spec.policy is not None:  # the auto shape: what it chose per round, and the costs it chose from
        line.update(drafted=spec.drafted, looked_up=spec.looked_up, from_lookup=spec.from_lookup,
                    costs=spec.policy.costs.record())
    if lookup is not None:
        line["lookup_new_tokens"], line["lookup_seconds"] = lookup
    return line


def run_eval(config: EvalConfig) -> EvalReport:
    """Evaluate (or finish evaluating) the draft on the prompts; return the report written to `config.out`."""
    precision = choose_dtype(config.dtype, config.device, config.target)
    config = config.model_copy(update={"dtype": precision.dtype})
    shape = decoding_shape(config)
    if config.engine == "vllm" and (problems := serving_problems(config)):
        raise CannotRun("; ".join(problems))
    sampling = Sampling(config.temperature, config.top_p, config.top_k)
    draft_config = read_draft_config(config.draft)
    if shape is not None and (problem := shape_problem(draft_config, shape)):
        raise EyasError(f"{config.draft}: {problem}")
    tokenizer = load_tokenizer(config.target, config.trust_remote_code, config.chat_template)
    fingerprint = target_fingerprint(config.target, tokenizer)
    target_config = load_config(config.target, config.trust_remote_code)
    attention_layout(target_config)  # a layout that cannot be verified exactly is refused before any weight loads
    problems = target_problems(draft_config, fingerprint, target_config)
    if problems and draft_config.target is not None and (
            mismatch := template_mismatch("the draft", draft_config.target, fingerprint, config.chat_template)):
        problems.append(mismatch)
    if problems:
        raise EyasError(f"{config.draft}: not a draft for {config.target}: " + "; ".join(problems))
    extra_stops = extra_stop_ids(config.target, tokenizer, config.stop_ids, config.stop_tokens)
    draft = load_draft(config.draft)  # refuses missing, unreadable, misshaped or non-finite weights before any claim
    prompts = read_prompts(config.prompts, tokenizer, config.limit, config.chat_template_kwargs)
    device = resolve_device(config.device)
    identities = {"target": fingerprint.id, "draft": sha256_file(config.draft / WEIGHTS_FILE),
                  "prompts": sha256_file(config.prompts)}
    run = EVAL.claim(config, identities, (precision.note("dtype"),))
    run.write_progress({"run_key": run.key, "prompts": len(prompts)})
    precision.announce("eval dtype")
    results = run.lines(RESULTS).read()
    done = {line["prompt"] for line in results}

    if len(done) < len(prompts):
        dtype = precision.torch_dtype
        parts = load_target(config.target, dtype, device, config.trust_remote_code)
        set_embedding(draft, parts.embed.weight.detach())
        draft = draft.to(device=device, dtype=dtype).eval()
        eos = eos_ids(parts.model, tokenizer) | extra_stops
        plain = Decoder(parts, None, None, sampling, eos, config.seed)
        speculative = Decoder(parts, draft, shape, sampling, eos, config.seed)
        for decoder in (plain, speculative):  # first calls allocate and dispatch: not timed
            decoder.generate(prompts[0], WARMUP_TOKENS)
        with run.lines(RESULTS).appender() as handle, stage_progress() as bar:
            task = bar.add_task("eval", total=len(prompts), completed=len(done), rate="")
            for index, prompt in enumerate(prompts):
                if index in done:
                    continue
                base, spec = plain.generate(prompt, config.max_new_tokens), speculative.generate(prompt, config.max_new_tokens)
                lookup = prompt_lookup_generate(parts, prompt, config.max_new_tokens, config.prompt_lookup, sampling,
                                                eos) if config.prompt_lookup else None
                line = _result_line(index, base, spec, lookup, parts)
                handle.append(json.dumps(line))
                results.append(line)
                rounds = [a for r in results for a in r["accepted"]]
                bar.update(task, advance=1, rate=f"tau {sum(rounds) / max(1, len(rounds)) + 1:.2f}")
    report = summarize(sorted(results, key=lambda r: r["prompt"]), shape, sampling, config, precision)
    if config.engine == "vllm":
        report.vllm = _served(config, prompts, tokenizer, extra_stops, report.tau)
    write_report(config.out, report)
    return report


def _served(config: EvalConfig, prompts: list[list[int]], tokenizer: Any, extra_stops: set[int],
            eyas_tau: float) -> VllmFigures:
    """Return vLLM's figures of this evaluation, stopping at the target's EOS ids and `extra_stops`: measured
    once, then read back from `out/vllm.json`."""
    path = config.out / SERVED
    if path.is_file():
        return VllmFigures.model_validate(read_json_object(path))
    stops = target_eos_ids(config.target, tokenizer, config.trust_remote_code) | extra_stops
    figures = serve_in_vllm(config, prompts, stops, eyas_tau)
    write_json_atomic(path, figures.model_dump(mode="json"))
    return figures
