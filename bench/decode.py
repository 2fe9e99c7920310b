"""Benchmark speculative decoding: tau and speedup over target-only decoding and over prompt-lookup
decoding, for a sweep of chain lengths and tree shapes, all in one run.

Per prompt, in this order: the target alone (`eyas.decode.decoder.Decoder` without a draft: one
target forward per token with a KV cache), transformers' `generate(prompt_lookup_num_tokens=N)`,
then the speculative decoder once per shape. Every decoder first runs one untimed 8-token
generation. Greedy by default, so every speculative output must equal the target-alone output
(`same_as_baseline` counts the prompts where it does).

Inputs: `--target`, `--draft` and `--prompts` (as `eyas eval` takes them), or none of them: then
the tiny learned pair of `eyas.testing.learned` is built in a temporary directory (a tiny
LM-trained target and a draft trained on it, ~1 minute) and prompted with 12 chat prompts of its
corpus. On that tiny target a forward costs about as much as the Python around it, so its
speedups say little about real models; its tau does say the decoder accepts what the draft gets right.

Output: one JSON line per shape on stdout: `tau` (pooled: accepted + 1 per verification forward),
`per_position_acceptance`, `tokens_per_s`, `baseline_tokens_per_s` and `prompt_lookup_tokens_per_s`
(pooled: all tokens over all seconds), `baseline_overhead_ms_per_token` (the target alone's wall time
per token beyond its forwards), `speedup` (over the target alone), `prompt_lookup_speedup` and
`vs_prompt_lookup` (speculative over prompt lookup). Every ratio is paired (`eyas.decode.paired`): the
median over prompts of the per-prompt ratio, with `<ratio>_quartiles`, `<ratio>_range`,
`<ratio>_pooled` (the old all-tokens-over-all-seconds ratio), `<ratio>_outliers` (prompts with a side
over 3x its median seconds per token) and `<ratio>_reliable` (false, with `<ratio>_unreliable_because`,
when stalls or a changing machine speed make the figure untrustworthy). Greedy: `same_as_baseline`,
and `divergences` says how many differing outputs a rounding near-tie explains and how many it does not
(`eyas.decode.divergence`; any unexplained one is a decoder bug). With the settings, and
`overhead_ms_per_round`: wall time per
verification round beyond the time spent inside target and draft forwards (the CPU loop: Python,
masks, cache trimming, verification). `auto:K,L` is the cost-aware shape (draft chains <= K, lookup
branches <= L; `auto:0,L` is eyas's prompt lookup without the draft), with the shapes it chose.
Torch runs `--threads` intra-op threads (default 1).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

from eyas.decode.decoder import Decoder
from eyas.decode.divergence import first_divergence
from eyas.decode.paired import paired_speedup
from eyas.decode.runners import DraftRunner, TargetRunner
from eyas.data.prompts import eos_ids
from eyas.decode.evaluate import prompt_lookup_generate
from eyas.decode.prompts import read_prompts
from eyas.decode.sampling import Sampling
from eyas.decode.shapes import AutoShape, TreeShape
from eyas.draft.model import load_draft
from eyas.precision import machine_record
from eyas.models.load import DTYPES, load_target
from eyas.models.tokenizer import load_tokenizer

SHAPES = "chain:1 chain:3 chain:5 tree:3,2,6 tree:4,3,10 tree:5,4,16 tree:6,8,40"


FORWARD_SECONDS = [0.0]  # inside TargetRunner.forward and DraftRunner.forward, all decoders


def time_forwards(runner: type) -> None:
    """Make `runner.forward` add its wall time to FORWARD_SECONDS."""
    forward = runner.forward

    def timed(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202 - the runner's own signature
        started = time.perf_counter()
        try:
            return forward(self, *args, **kwargs)
        finally:
            FORWARD_SECONDS[0] += time.perf_counter() - started

    runner.forward = timed


def parse_shape(text: str) -> TreeShape | AutoShape:
    kind, _, numbers = text.partition(":")
    values = [int(v) for v in numbers.split(",")]
    if kind == "auto":
        return AutoShape(*values)
    return TreeShape.chain_of(values[0]) if kind == "chain" else TreeShape(*values)


def tiny_inputs(root: Path) -> tuple[Path, Path, Path]:
    from eyas.testing.learned import build_learned_pair, corpus_conversations

    pair = build_learned_pair(root)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": c[0]["content"]}) + "\n"
                               for c in corpus_conversations(12, seed=2026)), encoding="utf-8")
    return pair["target"], pair["run"] / "final", prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path)
    parser.add_argument("--draft", type=Path)
    parser.add_argument("--prompts", type=Path)
    parser.add_argument("--shapes", default=SHAPES, help=f"space-separated chain:K / tree:D,K,T / auto:K,L (default {SHAPES!r})")
    parser.add_argument("--limit", type=int, default=None, help="first N prompts")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompt-lookup", type=int, default=10, help="prompt_lookup_num_tokens")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    time_forwards(TargetRunner)
    time_forwards(DraftRunner)

    with tempfile.TemporaryDirectory() as scratch:
        if args.target is None:
            print("building the tiny learned target and draft (about a minute)", file=sys.stderr)
            args.target, args.draft, args.prompts = tiny_inputs(Path(scratch))
        tokenizer = load_tokenizer(args.target)
        prompts = read_prompts(args.prompts, tokenizer, args.limit)
        dtype = DTYPES[args.dtype]
        parts = load_target(args.target, dtype, "cpu")
        draft = load_draft(args.draft, parts.embed.weight.detach()).to(dtype).eval()
        eos, sampling = eos_ids(parts.model, tokenizer), Sampling()
        shapes = [parse_shape(s) for s in args.shapes.split()]
        plain = Decoder(parts, None, None, sampling, eos)
        decoders = [Decoder(parts, draft, shape, sampling, eos) for shape in shapes]
        for decoder in [plain, *decoders]:
            decoder.generate(prompts[0], 8)
        prompt_lookup_generate(parts, prompts[0], 8, args.prompt_lookup, sampling, eos)

        hidden = parts.lm_head.weight.shape[1]
        base: list[tuple[int, float]] = []  # (new tokens, seconds) per prompt
        base_overhead = 0.0  # the target alone's seconds outside its forwards
        lookup: list[tuple[int, float]] = []
        spec = [{"timed": [], "rounds": [], "same": 0, "near_ties": 0, "unexplained": 0, "overhead": 0.0, "drafted": [],
                 "looked_up": [], "from_lookup": 0, "policy": None} for _ in shapes]
        for number, prompt in enumerate(prompts, 1):
            inside = FORWARD_SECONDS[0]
            reference = plain.generate(prompt, args.max_new_tokens)
            base_overhead += reference.seconds - (FORWARD_SECONDS[0] - inside)
            base.append((len(reference.tokens), reference.seconds))
            lookup.append(prompt_lookup_generate(parts, prompt, args.max_new_tokens, args.prompt_lookup, sampling, eos))
            for decoder, totals in zip(decoders, spec):
                inside = FORWARD_SECONDS[0]
                generated = decoder.generate(prompt, args.max_new_tokens)
                totals["overhead"] += generated.seconds - (FORWARD_SECONDS[0] - inside)
                totals["drafted"] += generated.drafted
                totals["looked_up"] += generated.looked_up
                totals["from_lookup"] += sum(generated.from_lookup)
                totals["policy"] = generated.policy
                totals["timed"].append((len(generated.tokens), generated.seconds))
                totals["rounds"] += generated.accepted
                totals["same"] += generated.tokens == reference.tokens
                divergence = first_divergence(reference, generated, dtype, hidden)
                if divergence is not None:
                    totals["near_ties" if divergence["near_tie"] else "unexplained"] += 1
            print(f"prompt {number}/{len(prompts)}", file=sys.stderr)

    base_rate = sum(t for t, _ in base) / sum(s for _, s in base)
    lookup_rate = sum(t for t, _ in lookup) / sum(s for _, s in lookup)
    for shape, totals in zip(shapes, spec):
        rounds = totals["rounds"]
        rate = sum(t for t, _ in totals["timed"]) / sum(s for _, s in totals["timed"])
        print(json.dumps({
            "bench": "decode", "decoding": shape.describe(), "target": args.target.name, "prompts": len(prompts),
            "max_new_tokens": args.max_new_tokens, "dtype": args.dtype, "threads": args.threads, **machine_record(),
            "tau": round(1 + sum(rounds) / len(rounds), 3),
            "per_position_acceptance": [round(sum(a > i for a in rounds) / len(rounds), 3) for i in range(shape.depth)],
            "tokens_per_s": round(rate, 2), "baseline_tokens_per_s": round(base_rate, 2),
            "baseline_overhead_ms_per_token": round(1000 * base_overhead / sum(t for t, _ in base), 3),
            **paired_speedup(base, totals["timed"]).fields("speedup"), "prompt_lookup_num_tokens": args.prompt_lookup,
            "prompt_lookup_tokens_per_s": round(lookup_rate, 2),
            **paired_speedup(base, lookup).fields("prompt_lookup_speedup"),
            **paired_speedup(lookup, totals["timed"], steady_baseline=False).fields("vs_prompt_lookup"),
            "same_as_baseline": totals["same"],
            "divergences": {"near_ties": totals["near_ties"], "unexplained": totals["unexplained"]},
            "overhead_ms_per_round": round(1000 * totals["overhead"] / len(rounds), 3),
            **({"draft_length_counts": dict(sorted(Counter(totals["drafted"]).items())),
                "lookup_length_counts": dict(sorted(Counter(totals["looked_up"]).items())),
                "accepted_from_lookup": totals["from_lookup"], "accepted": sum(rounds),
                "costs": totals["policy"].costs.record(), "cost_scale": [round(x, 3) for x in totals["policy"].scale]}
               if totals["policy"] is not None else {}),
        }), flush=True)


if __name__ == "__main__":
    main()
