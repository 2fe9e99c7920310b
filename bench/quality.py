"""Quality per training token: held-out chain tau of drafts trained on more and more tokens, and
ablations of the recipe at equal training tokens, all scored against the same held-out continuations.

Inputs: a demo YAML (default `examples/demo/small.yaml`) whose stages up to `extract` have finished
(`make demo`; in `.venv-vllm` the demo's `OUT-vllm`, as `make demo` runs it there): its train section is
the recipe, its features the data. Every run trains with that
section into `--out/<name>` (`eyas train`'s `run_train`: a finished run is reused, an interrupted one
resumes), changing only what the run's name says:
- the curve: `max_steps` = each of `--steps` (fewer steps than an epoch train on a prefix of the
  shuffled data; more repeat it), plus the demo's own finished training run as a point when it exists;
- the ablations: one change each to the recipe at `--ablation-steps` steps (a `token_budget` change
  scales the steps so the training tokens stay equal; `--mixes` changes the data instead: the same demo
  with `demo.general_share` set, its stages up to extract run under `--out`), against the recipe itself
  at the same steps
  (`vs_recipe`: the ratio of (tau - 1), the tokens a round gains, to the recipe's). Equal training
  tokens, not equal compute: `train_seconds` says what each cost (TTT depth multiplies it).

Held-out tau: greedy chain-`--chain` decoding replayed (`eyas.decode.replay`, equal to eyas's decoder
round for round) on the first `--limit` prompts x `--max-new-tokens` of both held-out sets: the demo's
HumanEval prompts and its chat set. The target's continuations are computed once per run of this
script and shared by every draft. `implied_tau`: the training run's last eval line (held-out samples of
the training distribution, from teacher-forced per-step accuracies, docs/plot.md).

With `--vllm` (in `.venv-vllm`), each curve draft is also served in vLLM (`eyas.decode.served.served_draft_tau`:
a chain of `--chain` on the same prompt ids, greedy, float32) and vLLM's own tau and per-position acceptance
are recorded beside eyas's replayed ones (`vllm_tau`, `vllm_acceptance` per set).

Output: one JSON line per run (stdout), `--out/quality.jsonl` (the same lines), `--out/quality-table.md`
(a markdown table of them), and `--out/quality.png`: one panel per held-out set, tau against training
tokens (log scale), vLLM's and implied tau beside it, the ablations as labelled markers. `--replot DIR ...`
trains nothing: it gathers earlier runs (the first DIR's curve, the others' lines as markers named after
their DIR) into one table and plot, so a curve and ablations run apart share the same axes. The table ends
with a power law per set through the curve's points, `tau - 1 = a * tokens^b`, and the training tokens at
which it reaches tau 2.0 (also a `fit` JSON line): what the goals need, from the curve, not a guess.
`--continuations FILE` adds a demo's continuations (warm-started, so markers, not curve points).
Torch runs `--threads` intra-op threads (default 2); training runs with the YAML's settings, changed by
`--change` (space-separated `field=value`, for every run: another draft family, say, so that two families'
curves trained on the same tokens can be drawn together with `--replot`; the demo's own run is then not a
point). Each set also records `draft_ms_per_round` (the replay's wall time per round: what drafting a round
costs) and each run `train_tokens_per_s`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from eyas.config import EvalConfig, TrainConfig
from eyas.data.prompts import eos_ids
from eyas.decode.prompts import read_prompts
from eyas.decode.recorded import Continuation
from eyas.decode.replay import greedy_continuations, pooled_figures, replayed
from eyas.decode.served import served_draft_tau
from eyas.demo.prompts import CHAT_PROMPTS, chat_prompts
from eyas.demo.run import demo_root, run_demo, stage_sections
from eyas.draft.model import load_draft
from eyas.files import write_text_atomic
from eyas.models.load import load_target
from eyas.models.tokenizer import load_tokenizer
from eyas.precision import machine_record
from eyas.train.loop import run_train
from eyas.train.plot import METRICS_FILE, read_metrics, trained_figures

ABLATIONS = ("ttt_steps=1 ttt_steps=3 ttt_growth=0.5 lr=0.001 lr=0.004 token_budget=1024 draft_vocab_size=2048 "
             "init_layer=-1 init_layer=15")


def parse_change(text: str) -> tuple[str, Any]:
    """Return (train field, value) of `field=value` (int, float or text), refusing an unknown field."""
    name, _, raw = text.partition("=")
    if name not in TrainConfig.model_fields:
        raise SystemExit(f"--ablations: {text!r}: {name!r} is not a train setting")
    for kind in (int, float):
        try:
            return name, kind(raw)
        except ValueError:
            continue
    return name, raw


def mixed_data(config_file: Path, share: float, out: Path) -> TrainConfig:
    """Return the recipe (the train section of `config_file`) on the data of the same demo with
    `demo.general_share` = `share`, run up to extract under `out` from `out.yaml` (under `out-vllm`
    where the demo runs vLLM, as the recipe's own data: the same backend regenerates both)."""
    doc = yaml.safe_load(config_file.read_text(encoding="utf-8"))
    old_root = Path(doc["demo"]["out"])

    def moved(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: moved(item) for key, item in value.items()}
        if isinstance(value, list):
            return [moved(item) for item in value]
        if isinstance(value, str) and Path(value).is_relative_to(old_root):
            return str(out / Path(value).relative_to(old_root))
        return value

    doc = moved(doc)
    doc["demo"]["general_share"] = share
    config = out.with_name(out.name + ".yaml")  # beside the demo's directory, which holds only the demo's own files
    write_text_atomic(config, yaml.safe_dump(doc, sort_keys=False))
    run_demo(config, until="extract")
    return demo_sections(config)[0]


def demo_sections(config_file: Path) -> tuple[TrainConfig, EvalConfig]:
    """Return the train and eval sections of the demo `config_file` under the demo's root (`OUT-vllm` where
    it runs vLLM), the demo's section read once."""
    demo, root, evaluation = demo_root(config_file)
    return stage_sections(config_file, demo, root)["train"], evaluation  # type: ignore[return-value]


def held_out_tau(run_dir: Path, parts: Any, sets: dict[str, list[Continuation]], chain: int, eos: set[int]) -> dict[str, Any]:
    """Return, per held-out set, the pooled tau and first-position acceptance of the run's final draft, and
    `draft_ms_per_round`: the replay's wall time per round (the draft's forwards and the round loop; the recorded
    target's answers cost next to nothing), what drafting a round costs, comparable between drafts."""
    draft = load_draft(run_dir / "final", parts.embed.weight.detach()).to(parts.lm_head.weight.dtype).eval()
    figures = {}
    for name, continuations in sets.items():
        generations = [replayed(draft, continuation, chain, eos) for continuation in continuations]
        pooled = pooled_figures(generations)
        figures[name] = {**pooled, "draft_ms_per_round": round(1000 * sum(g.seconds for g in generations) / pooled["rounds"], 3)}
    return figures


def training_rate(run_dir: Path) -> float:
    """Return the median training tokens/s of a run's train lines (its own record: a reused run took no time here)."""
    rates = [row["tokens_per_s"] for row in read_metrics(run_dir / METRICS_FILE, run_dir)["train"]]
    return round(statistics.median(rates), 1)


def table(lines: list[dict[str, Any]]) -> str:
    """Return the runs as a markdown table (curve by tokens, then the ablations)."""
    served = any("vllm_tau" in line["humaneval"] for line in lines)
    rows = ["| run | training tokens | train s | train tok/s | draft ms/round (HE) | tau HumanEval (first acc.) | "
            "tau chat (first acc.) | implied tau | vs recipe (HE, chat) |" + (" vLLM tau (HE, chat) |" if served else ""),
            "|---|---|---|---|---|---|---|---|---|" + ("---|" if served else "")]
    ordered = sorted((line for line in lines if line["kind"] == "curve"), key=lambda line: line["tokens"])
    for line in ordered + [line for line in lines if line["kind"] == "ablation"]:
        ratio = line.get("vs_recipe")
        implied = "-" if line["implied_tau"] is None else f"{line['implied_tau']:.3f}"
        rate, drafting = line.get("train_tokens_per_s"), line["humaneval"].get("draft_ms_per_round")
        rows.append(f"| {line['name']} | {line['tokens']:,} | {line['train_seconds']:.0f} | "
                    f"{'-' if rate is None else f'{rate:,.0f}'} | {'-' if drafting is None else f'{drafting:.1f}'} | "
                    f"{line['humaneval']['tau']:.3f} ({line['humaneval']['first_acceptance']:.3f}) | "
                    f"{line['chat']['tau']:.3f} ({line['chat']['first_acceptance']:.3f}) | {implied} | "
                    + (f"{ratio['humaneval']:.2f}, {ratio['chat']:.2f} |" if ratio else "- |")
                    + (f" {_vllm_cell(line)} |" if served else ""))
    return "\n".join(rows) + "\n"


def power_law(lines: list[dict[str, Any]], goal: float = 2.0) -> dict[str, dict[str, float]]:
    """Return, per held-out set, the least-squares fit of `log(tau - 1) = log(a) + b * log(tokens)` through
    the curve's points, and the training tokens at which it reaches tau `goal` (`tokens_for_tau`); empty
    with fewer than two curve points above tau 1."""
    import numpy as np

    fits: dict[str, dict[str, float]] = {}
    curve = [line for line in lines if line["kind"] == "curve"]
    for name in ("humaneval", "chat"):
        points = [(line["tokens"], line[name]["tau"] - 1) for line in curve if line[name]["tau"] > 1]
        if len(points) < 2:
            continue
        slope, intercept = np.polyfit(np.log([t for t, _ in points]), np.log([g for _, g in points]), 1)
        fits[name] = {"a": float(np.exp(intercept)), "b": round(float(slope), 3), "points": len(points),
                      f"tokens_for_tau_{goal:g}": round(float(np.exp((np.log(goal - 1) - intercept) / slope)))}
    return fits


def fit_lines(lines: list[dict[str, Any]]) -> str:
    """Return the power-law fits of the curve as markdown lines (empty without a fit)."""
    return "".join(f"\n{name}: tau - 1 = {fit['a']:.3g} * tokens^{fit['b']} through {fit['points']} points; "
                   f"tau 2.0 at {fit['tokens_for_tau_2']:,} training tokens\n" for name, fit in power_law(lines).items())


def _vllm_cell(line: dict[str, Any]) -> str:
    """Return a run's vLLM taus as a table cell ('-' for a run vLLM did not serve)."""
    taus = [line[name].get("vllm_tau") for name in ("humaneval", "chat")]
    return "-" if None in taus else f"{taus[0]:.3f}, {taus[1]:.3f}"


def plot(lines: list[dict[str, Any]], path: Path) -> None:
    """Write `path`: one panel per held-out set, tau against training tokens (log) for the curve, vLLM's
    tau, implied tau and the curve's power law beside it, each ablation a labelled marker (labels stacked
    beside the markers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = sorted((line for line in lines if line["kind"] == "curve"), key=lambda line: line["tokens"])
    ablations = [line for line in lines if line["kind"] == "ablation"]
    figure, axes = plt.subplots(1, 2, figsize=(13, 5.5), sharey=True)
    implied = [c for c in curve if c["implied_tau"] is not None]
    fits = power_law(lines)
    low, high = (min(line["tokens"] for line in lines), max(line["tokens"] for line in lines)) if lines else (1, 1)
    span = [low * (high / low) ** (k / 49) for k in range(50)]  # log-spaced: the law is curved on these axes
    for axis, (name, style) in zip(axes, (("humaneval", "o-"), ("chat", "s-"))):
        if name in fits:
            fit = fits[name]
            axis.plot(span, [1 + fit["a"] * tokens ** fit["b"] for tokens in span], "-", color="grey", lw=0.8,
                      label=f"power law through the curve (tau 2.0 at {fit['tokens_for_tau_2'] / 1e6:.1f}M tokens)")
        axis.plot([c["tokens"] for c in curve], [c[name]["tau"] for c in curve], style, label="held-out tau (eyas)")
        served = [c for c in curve if "vllm_tau" in c[name]]
        if served:
            axis.plot([c["tokens"] for c in served], [c[name]["vllm_tau"] for c in served], style[0] + ":",
                      fillstyle="none", label="held-out tau (vLLM)")
        axis.plot([c["tokens"] for c in implied], [c["implied_tau"] for c in implied], "^--", alpha=0.6,
                  label="implied tau (training eval)")
        ranked = sorted(ablations, key=lambda line: line[name]["tau"])
        for rank, line in enumerate(ranked):
            axis.plot(line["tokens"], line[name]["tau"], "x", markersize=8)
            axis.annotate(line["name"], (line["tokens"], line[name]["tau"]), fontsize=7, va="center",
                          xytext=(1.0, (rank + 0.5) / max(len(ranked), 1)), textcoords=("axes fraction", "axes fraction"),
                          ha="right", arrowprops={"arrowstyle": "-", "lw": 0.4, "alpha": 0.5})
        axis.set_xscale("log")
        axis.set_xlabel("training tokens (log)")
        axis.set_title(f"held-out {name}")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(loc="upper left", fontsize=8)
    axes[0].set_ylabel(f"tau, greedy chain {lines[0]['chain'] if lines else ''}")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def replot(directories: list[Path]) -> list[dict[str, Any]]:
    """Return the lines of earlier runs of this script for one table and plot: the first directory's as
    they are, every other's as ablations named after their directory (its curve lines included), so
    runs of another recipe or data never join the first's curve. Refuses (SystemExit, naming file and
    line) a run name listed twice in one quality.jsonl: which of the two is meant cannot be told."""
    lines: list[dict[str, Any]] = []
    for number, directory in enumerate(directories):
        path = directory / "quality.jsonl"
        seen: set[str] = set()
        for lineno, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            line = json.loads(text)
            if line["name"] in seen:
                raise SystemExit(f"quality: {path}:{lineno}: name: {line['name']!r} listed twice; keep one of the two lines")
            seen.add(line["name"])
            lines.append({**line, "kind": "ablation", "name": f"{directory.name}: {line['name']}"} if number else line)
    return lines


def refuse_repeats(args: argparse.Namespace) -> None:
    """Return nothing; refuses (SystemExit) a value given twice in `--steps`, `--ablations` or `--mixes`,
    which would train one run and score and list it twice."""
    for option in ("steps", "ablations", "mixes"):
        values = getattr(args, option).split()
        twice = sorted({value for value in values if values.count(value) > 1})
        if twice:
            raise SystemExit(f"quality: --{option}: {', '.join(twice)} given twice")


def continuation_lines(records: Path) -> list[dict[str, Any]]:
    """Return a demo's continuations (`report/continuations.jsonl`, eyas.demo.continuation) as markers at
    their cumulative training tokens: warm-started runs, never points of the curve."""
    lines = []
    for text in records.read_text(encoding="utf-8").splitlines():
        record = json.loads(text)
        lines.append({"kind": "ablation", "name": f"continuation {record['continuation']} (from the previous draft)",
                      "tokens": record["training_tokens_all"], "train_seconds": record["seconds"]["train"],
                      "implied_tau": None, "chain": record["chain"], **record["tau"]})
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=Path("examples/demo/small.yaml"))
    parser.add_argument("--out", type=Path, default=Path("runs/quality"))
    parser.add_argument("--steps", default="2 4 8 15", help="space-separated max_steps of the curve's runs")
    parser.add_argument("--ablation-steps", type=int, default=15)
    parser.add_argument("--ablations", default=ABLATIONS, help=f"space-separated field=value (default {ABLATIONS!r}; '' for none)")
    parser.add_argument("--mixes", default="0.5", help="demo.general_share values of the data-mix ablation (default "
                        "'0.5'; '' for none): each regenerates its own data under --out/data-general-SHARE")
    parser.add_argument("--change", default="", help="space-separated field=value applied to the recipe of every run "
                        "(e.g. 'family=peagle ttt_steps=4')")
    parser.add_argument("--chain", type=int, default=4)
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--vllm", action="store_true", help="also serve each curve draft in vLLM (chain --chain, the "
                        "same prompt ids) and record vLLM's tau beside eyas's: run in .venv-vllm (make setup-vllm)")
    parser.add_argument("--replot", type=Path, nargs="+", metavar="DIR", help="train nothing: gather earlier runs' "
                        "quality.jsonl (the first DIR's curve; every other DIR's lines as labelled markers) into --out's "
                        "table and plot")
    parser.add_argument("--continuations", type=Path, nargs="*", default=[], metavar="FILE",
                        help="with --replot: a demo's report/continuations.jsonl, each continuation a marker")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.replot:
        gathered = replot(args.replot) + [line for path in args.continuations for line in continuation_lines(path)]
        args.out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.out / "quality-table.md", table(gathered) + fit_lines(gathered))
        plot(gathered, args.out / "quality.png")
        print(f"quality: {args.out / 'quality.png'}", file=sys.stderr)
        return

    refuse_repeats(args)
    recipe, evaluation = demo_sections(args.config)
    changed = dict(parse_change(text) for text in args.change.split())
    recipe = TrainConfig.model_validate({**recipe.model_dump(), **changed})
    prompts_dir = evaluation.prompts.parent
    chat_file = prompts_dir / CHAT_PROMPTS
    if not chat_file.is_file():  # a demo run from before the chat set: the set is a pure function of eyas
        write_text_atomic(chat_file, "".join(json.dumps(p) + "\n" for p in chat_prompts()))
    runs: list[tuple[str, str, TrainConfig]] = []
    for steps in args.steps.split():
        runs.append(("curve", f"steps-{steps}", recipe.model_copy(update={"max_steps": int(steps), "out": args.out / f"steps-{steps}"})))
    changes = [parse_change(text) for text in args.ablations.split()]
    if changes:
        base = f"steps-{args.ablation_steps}"
        if base not in {name for _, name, _ in runs}:
            runs.append(("curve", base, recipe.model_copy(update={"max_steps": args.ablation_steps, "out": args.out / base})))
        for field, value in changes:
            name = f"{field}={value}"
            steps = args.ablation_steps  # a smaller batch takes more steps: the training tokens stay equal
            if field == "token_budget":
                steps = max(1, round(args.ablation_steps * recipe.token_budget / int(value)))
            runs.append(("ablation", name, TrainConfig.model_validate({
                **recipe.model_dump(), field: value, "max_steps": steps, "out": args.out / name})))

    for share in args.mixes.split():
        name = f"general_share={share}"
        data = mixed_data(args.config, float(share), args.out / f"data-general-{share}")
        runs.append(("ablation", name, data.model_copy(update={"max_steps": args.ablation_steps, "out": args.out / name})))

    target = recipe.target or evaluation.target
    tokenizer = load_tokenizer(target)
    parts = load_target(target, torch.float32, "cpu")
    eos = eos_ids(parts.model, tokenizer)
    aux_ids: list[int] | None = None
    sets: dict[str, list[Continuation]] = {}
    prompt_sets = {name: read_prompts(path, tokenizer, args.limit) for name, path in (("humaneval", evaluation.prompts),
                                                                                     ("chat", chat_file))}
    lines: list[dict[str, Any]] = []
    args.out.mkdir(parents=True, exist_ok=True)
    demo_run = recipe.out if (recipe.out / "final").is_dir() and not changed else None
    todo = [*runs, *([("curve", "demo", recipe)] if demo_run else [])]
    for kind, name, config in todo:
        started = time.perf_counter()
        if name != "demo":
            print(f"quality: training {name}", file=sys.stderr)
            run_train(config)
        seconds = time.perf_counter() - started
        if aux_ids is None:  # the continuations need the draft's layers: read them from the first run
            aux_ids = load_draft(config.out / "final", parts.embed.weight.detach()).config.aux_layer_ids
            for set_name, prompts in prompt_sets.items():
                print(f"quality: continuations of {set_name}", file=sys.stderr)
                sets[set_name] = greedy_continuations(parts, prompts, args.max_new_tokens, aux_ids)
        tokens, implied = trained_figures(config.out)
        line = {"bench": "quality", "kind": kind, "name": name, "run": str(config.out), "tokens": tokens,
                "max_steps": config.max_steps, "train_seconds": round(seconds, 1), "implied_tau": implied,
                "train_tokens_per_s": training_rate(config.out), "change": args.change,
                "chain": args.chain, "prompts_per_set": args.limit, "max_new_tokens": args.max_new_tokens,
                "threads": args.threads, **machine_record(),
                **held_out_tau(config.out, parts, sets, args.chain, eos)}
        if args.vllm and kind == "curve":
            served = served_draft_tau(EvalConfig(target=target, draft=config.out / "final", prompts=evaluation.prompts,
                                                 out=config.out / "vllm", chain=args.chain, max_new_tokens=args.max_new_tokens,
                                                 dtype="float32", engine="vllm"), prompt_sets, eos)
            for set_name, figures in served.items():
                line[set_name]["vllm_tau"] = round(figures.tau, 4)
                line[set_name]["vllm_acceptance"] = figures.per_position_acceptance
        lines.append(line)
        print(json.dumps(line), flush=True)
    recipe_line = next((line for line in lines if line["name"] == f"steps-{args.ablation_steps}"), None)
    for line in lines:
        if line["kind"] == "ablation" and recipe_line is not None:
            line["vs_recipe"] = {name: round((line[name]["tau"] - 1) / max(recipe_line[name]["tau"] - 1, 1e-9), 3)
                                 for name in sets}
            print(json.dumps({"bench": "quality", "kind": "ablation-ratio", "name": line["name"], "vs_recipe": line["vs_recipe"]}),
                  flush=True)
    write_text_atomic(args.out / "quality.jsonl", "".join(json.dumps(line) + "\n" for line in lines))
    print(json.dumps({"bench": "quality", "kind": "fit", "fits": power_law(lines)}), flush=True)
    write_text_atomic(args.out / "quality-table.md", table(lines) + fit_lines(lines))
    plot(lines, args.out / "quality.png")
    print(f"quality: {args.out / 'quality.png'}", file=sys.stderr)


if __name__ == "__main__":
    main()
