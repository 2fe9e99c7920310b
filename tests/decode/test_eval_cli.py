"""`eyas eval` from the command line: the report and its figures, resume after an interruption, and
the refusals that must come before any weight loads (a draft for another target, bad shapes, bad prompts)."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest
from conftest import write_jsonl
from test_divergence import accept_a_wrong_token

from eyas.decode import decoder
from eyas.draft.config import CONFIG_FILE
from eyas.testing.learned import corpus_conversations

REPORT_KEYS = {"tau", "speedup", "tokens_per_s", "baseline_tokens_per_s", "per_position_acceptance", "tau_definition",
               "target_forwards", "baseline_target_forwards", "accept_length_counts", "same_as_baseline", "prompt_lookup",
               "pooled_speedup", "paired", "timing", "divergences"}


@pytest.fixture(scope="module")
def prompts(learned: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    records = [{"prompt": c[0]["content"]} for c in corpus_conversations(3, seed=321)]
    records.append({"messages": [{"role": "user", "content": "Write a short poem about the sea."}]})
    records.append({"text": "The quick brown fox"})
    return write_jsonl(tmp_path_factory.mktemp("eval-prompts") / "prompts.jsonl", records)


def eval_args(learned: dict[str, Path], prompts: Path, out: Path, *extra: str) -> list[str | Path]:
    return ["eval", "--target", learned["target"], "--draft", learned["run"] / "final", "--prompts", prompts,
            "--out", out, "--max-new-tokens", "24", "--device", "cpu", "eval.dtype=float32", *extra]


def test_report_figures_png_and_resume(learned: dict[str, Path], prompts: Path, run_cli, tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = run_cli(*eval_args(learned, prompts, out, "--tree", "4,3,10", "--prompt-lookup", "3"))
    assert result.code == 0, result.err
    assert "tau (pooled" in result.out and "speedup" in result.out
    report = json.loads((out / "report.json").read_text())
    assert REPORT_KEYS <= report.keys()
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [line["prompt"] for line in lines] == [0, 1, 2, 3, 4]
    rounds = [a for line in lines for a in line["accepted"]]
    assert report["tau"] == pytest.approx(1 + sum(rounds) / len(rounds))
    assert report["per_position_acceptance"] == pytest.approx([sum(a > i for a in rounds) / len(rounds) for i in range(4)])
    assert report["tau"] > 1.8 and report["target_forwards"] < report["baseline_target_forwards"]
    assert report["same_as_baseline"] == 5  # greedy: the target's own output, prompt by prompt
    # float32: token for token the target's own, so no divergence to explain
    assert report["divergences"] == {"prompts": 5, "identical": 5, "near_ties": [], "unexplained": [], "unexamined": 0}
    assert all(line["divergence"] is None for line in lines)
    assert "outputs identical to the target alone" in result.out and "unexplained divergences" in result.out
    # the headline speedup is the median of per-prompt ratios; the pooled ratio is kept beside it
    ratios = [(line["new_tokens"] / line["seconds"]) / (line["baseline_new_tokens"] / line["baseline_seconds"])
              for line in lines]
    assert report["paired"]["ratios"] == pytest.approx(ratios)
    assert report["speedup"] == pytest.approx(statistics.median(ratios)) == report["paired"]["median"]
    assert report["paired"]["q1"] <= report["speedup"] <= report["paired"]["q3"]
    assert report["pooled_speedup"] == pytest.approx(report["tokens_per_s"] / report["baseline_tokens_per_s"])
    assert set(report["timing"]) == {"reliable", "unreliable_because"}
    assert report["timing"]["reliable"] == (report["timing"]["unreliable_because"] == [])
    assert "speedup (median of per-prompt ratios)" in result.out and "quartiles" in result.out
    lookup = report["prompt_lookup"]
    assert lookup["tokens_per_s"] > 0 and lookup["speedup"] == lookup["paired"]["median"]
    assert lookup["vs_lookup"]["ratios"] == pytest.approx([
        (line["new_tokens"] / line["seconds"]) / (line["lookup_new_tokens"] / line["lookup_seconds"]) for line in lines])
    assert (out / "acceptance.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # killed after two prompts, mid-line: the rerun keeps them and evaluates the other three
    kept = "".join(line + "\n" for line in (out / "results.jsonl").read_text().splitlines()[:2])
    (out / "results.jsonl").write_text(kept + '{"prompt": 2, "new_tok')
    (out / "report.json").unlink()
    again = run_cli(*eval_args(learned, prompts, out, "--tree", "4,3,10", "--prompt-lookup", "3"))
    assert again.code == 0, again.err
    resumed = (out / "results.jsonl").read_text()
    assert resumed.startswith(kept) and [json.loads(x)["prompt"] for x in resumed.splitlines()] == [0, 1, 2, 3, 4]
    assert json.loads((out / "report.json").read_text())["same_as_baseline"] == 5

    other = run_cli(*eval_args(learned, prompts, out, "--chain", "3"))
    assert other.code == 2 and "holds an eyas eval report made from other inputs or settings" in other.err


def test_auto_is_the_default_shape_and_reports_its_choices(learned: dict[str, Path], prompts: Path, run_cli,
                                                           tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = run_cli(*eval_args(learned, prompts, out))
    assert result.code == 0, result.err
    assert "plain rounds" in result.out and "draft lengths" in result.out and "lookup lengths" in result.out
    report = json.loads((out / "report.json").read_text())
    assert report["decoding"] == "auto (chain <= 8, lookup <= 10)" and report["same_as_baseline"] == 5
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    drafted = [k for line in lines for k in line["drafted"]]
    looked_up = [n for line in lines for n in line["looked_up"]]
    rounds = [a for line in lines for a in line["accepted"]]
    assert len(drafted) == len(looked_up) == len(rounds) == report["target_forwards"] - 5  # a prefill per prompt
    auto = report["auto"]
    assert sum(auto["draft_length_counts"].values()) == len(rounds)
    assert auto["plain_rounds"] == sum(k + n == 0 for k, n in zip(drafted, looked_up))
    assert auto["accepted_tokens"] == sum(rounds) and auto["accepted_from_lookup"] <= sum(rounds)
    assert all(a <= max(k, n) for a, k, n in zip(rounds, drafted, looked_up))  # nothing accepted that was not verified
    assert set(auto["costs"]["verify_seconds"]) == {"1", "2", "3", "4", "6", "8", "12", "16"}
    assert auto["costs"]["draft_step"] > 0
    assert len(report["per_position_acceptance"]) == 10


def test_a_bfloat16_eval_explains_every_divergence_as_a_near_tie(learned: dict[str, Path], run_cli,
                                                                 tmp_path: Path) -> None:
    """In bfloat16 a verification forward rounds differently from a one-token forward and near-ties flip: the
    report lists each divergence with its margins, all within the rounding bound, none unexplained (1 of 20
    prompts diverges here; tests/decode/test_divergence.py decodes longer and finds more)."""
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": c[0]["content"]} for c in corpus_conversations(20, seed=7)])
    out = tmp_path / "report"
    args = ["eval.dtype=bfloat16" if str(arg) == "eval.dtype=float32" else arg
            for arg in eval_args(learned, prompts, out, "--max-new-tokens", "64", "--tree", "5,4,16")]
    result = run_cli(*args)
    assert result.code == 0, result.err
    summary = json.loads((out / "report.json").read_text())["divergences"]
    assert summary["unexplained"] == [], summary
    assert summary["identical"] + len(summary["near_ties"]) == summary["prompts"] == 20
    assert all(d["margin_alone"] + d["margin_speculative"] <= d["bound"] and d["verified_top1"] for d in summary["near_ties"])
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {line["prompt"] for line in lines if line["divergence"]} == {d["prompt"] for d in summary["near_ties"]}
    assert "near-tie divergences (rounding)" in result.out and "unexplained divergences" in result.out


def test_a_wrong_verifier_is_reported_as_an_unexplained_divergence(learned: dict[str, Path], prompts: Path, run_cli,
                                                                  tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decoder, "accept_greedy", accept_a_wrong_token)
    out = tmp_path / "report"
    result = run_cli(*eval_args(learned, prompts, out, "--chain", "3"))
    assert result.code == 0, result.err
    summary = json.loads((out / "report.json").read_text())["divergences"]
    assert summary["unexplained"] and summary["near_ties"] == []
    assert all(not d["verified_top1"] for d in summary["unexplained"])
    assert "UNEXPLAINED divergences" in result.out and "a decoder bug" in result.out


def one_line_error(result) -> str:  # noqa: ANN001 - conftest's CliResult
    assert result.code == 2, (result.code, result.err)
    assert result.err.count("\n") == 1 and "Traceback" not in result.err, result.err
    return result.err


def edited_draft(learned: dict[str, Path], tmp_path: Path, **changes: object) -> Path:
    draft = tmp_path / "draft"
    shutil.copytree(learned["run"] / "final", draft)
    config = json.loads((draft / CONFIG_FILE).read_text())
    config.update(changes)
    (draft / CONFIG_FILE).write_text(json.dumps(config))
    return draft


@pytest.mark.parametrize(("changes", "message"), [
    ({"target_hidden_size": 48}, "target_hidden_size: 48, the target's hidden size is"),
    ({"vocab_size": 1000}, "vocab_size: 1000, the target's vocabulary has"),
    ({"aux_layer_ids": [1, 2, 40]}, "aux_layer_ids: [1, 2, 40], the target has"),
])
def test_a_draft_that_does_not_fit_the_target_is_refused_before_loading(
        learned: dict[str, Path], prompts: Path, run_cli, tmp_path: Path, changes: dict, message: str) -> None:
    draft = edited_draft(learned, tmp_path, **changes)
    out = tmp_path / "report"
    args = eval_args(learned, prompts, out)
    args[args.index("--draft") + 1] = draft
    err = one_line_error(run_cli(*args))
    assert f"{draft}: not a draft for {learned['target']}: " in err and message in err
    assert not out.exists()


def test_a_draft_for_another_target_is_refused(learned: dict[str, Path], prompts: Path, weighted_target, run_cli,
                                               tmp_path: Path) -> None:
    """Same sizes and vocabulary, another model: the fingerprint tells them apart."""
    other = weighted_target("llama")
    args = eval_args(learned, prompts, tmp_path / "report")
    args[args.index("--target") + 1] = other
    err = one_line_error(run_cli(*args))
    assert "not a draft for" in err and "trained for fingerprint" in err and "weights" in err
    assert not (tmp_path / "report").exists()


@pytest.mark.parametrize(("extra", "message"), [
    (["--tree", "5,4"], "tree: '5,4': expected DEPTH,TOPK,TOTAL"),
    (["--tree", "5,0,16"], "tree: '5,0,16': expected DEPTH,TOPK,TOTAL"),
    (["--chain", "3", "--tree", "5,4,16"], "give one decoding shape, not --chain and --tree"),
    (["--shape", "auto", "--chain", "3"], "give one decoding shape, not --shape auto and --chain"),
    (["--max-chain", "0", "--lookup", "0"], "--shape auto with --max-chain 0 and --lookup 0 has nothing to draft"),
])
def test_bad_shapes_are_refused(learned: dict[str, Path], prompts: Path, run_cli, tmp_path: Path, extra: list[str],
                                message: str) -> None:
    assert message in one_line_error(run_cli(*eval_args(learned, prompts, tmp_path / "report", *extra)))


@pytest.mark.parametrize(("line", "message"), [
    ("{not json", ":2: not JSON"),
    ('["a list"]', ":2: expected a JSON object"),
    ('{"question": "hi"}', ":2: expected exactly one of the fields prompt, messages, text, found none"),
    ('{"prompt": "a", "text": "b"}', ":2: expected exactly one of the fields"),
    ('{"messages": [{"role": "user"}]}', ":2: messages[0]: expected"),
    ('{"prompt": 3}', ":2: prompt: expected a string"),
])
def test_bad_prompt_lines_are_refused_with_file_and_line(learned: dict[str, Path], run_cli, tmp_path: Path, line: str,
                                                         message: str) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "fine"}\n' + line + "\n")
    err = one_line_error(run_cli(*eval_args(learned, path, tmp_path / "report")))
    assert f"{path}{message}" in err
