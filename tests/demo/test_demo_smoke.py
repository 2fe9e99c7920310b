"""The demo pipeline end to end on the embedded SmolLM2 target at smoke size (slow: a few minutes):
every stage runs from one YAML file, the reports of every evaluation pass (the auto shape on HumanEval
and on the held-out chat set, the draft alone on the chat set, the chain on both, the tree) and the
goals land in OUT/report with the exported draft, and a second run reuses every finished stage and
gives the same report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from eyas.demo.continuation import read_records, run_continuation, seconds_per_prompt
from eyas.demo.run import run_demo

SMOKE = Path(__file__).resolve().parents[2] / "examples" / "demo" / "smoke.yaml"


def rooted(value: object, root: Path) -> object:
    """The smoke config with its `runs/demo-smoke` paths moved under `root`."""
    if isinstance(value, dict):
        return {k: rooted(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [rooted(v, root) for v in value]
    if isinstance(value, str) and value.startswith("runs/demo-smoke"):
        return str(root / value.removeprefix("runs/demo-smoke/").removeprefix("runs/demo-smoke"))
    return value


@pytest.mark.slow
def test_smoke_demo_runs_every_stage_and_reuses_them(tmp_path: Path) -> None:
    config = tmp_path / "demo.yaml"
    doc = rooted(yaml.safe_load(SMOKE.read_text()), tmp_path / "run")
    # Greedy equality with the target alone is a float32 fact; `auto` is bfloat16 on AVX-512-BF16 CPUs.
    doc["eval"]["dtype"] = "float32"
    config.write_text(yaml.safe_dump(doc))
    report = run_demo(config)
    assert report == tmp_path / "run" / "report"
    first = json.loads((report / "report.json").read_text())
    assert first["prompts"] == 2 and first["decoding"].startswith("auto") and first["prompt_lookup"] is not None
    assert first["same_as_baseline"] == 2  # greedy: the target's own output
    assert first["divergences"]["identical"] == 2 and first["divergences"]["unexplained"] == []
    # speedups are medians of per-prompt ratios; two prompts are too few to trust, and the report says so
    assert first["speedup"] == first["paired"]["median"] and len(first["paired"]["ratios"]) == 2
    assert not first["timing"]["reliable"] and "2 prompts: too few" in first["timing"]["unreliable_because"][0]
    assert first["prompt_lookup"]["vs_lookup"]["median"] > 0
    passes = {label: json.loads((report / label / "report.json").read_text())
              for label in ("chat", "chat-draft", "chain", "chat-chain")}
    assert {label: p["decoding"] for label, p in passes.items()} == {
        "chat": first["decoding"], "chat-draft": "auto (chain <= 8, lookup <= 0)", "chain": "chain 3", "chat-chain": "chain 3"}
    assert all(p["prompts"] == 2 and p["same_as_baseline"] == 2 and p["divergences"]["unexplained"] == []
               for p in passes.values())
    assert "chat-prompts.jsonl" in (tmp_path / "run" / "eval-chat" / "config.yaml").read_text()
    goals = json.loads((report / "goals.json").read_text())
    assert goals["chain tau >= 2.0 (chat)"] == {"decoding": "chain 3", "value": round(passes["chat-chain"]["tau"], 3),
                                                "met": passes["chat-chain"]["tau"] >= 2.0}
    assert goals["never slower than the target (chat)"]["value"] == round(passes["chat"]["speedup"], 3)
    assert (report / "acceptance.png").is_file()
    assert first["precision"]["dtype"] == "float32" and first["machine"]["cpu_capability"]
    stages = json.loads((report / "stages.json").read_text())
    assert set(stages["seconds"]) >= {"regenerate", "prepare", "extract", "train", "eval", "export"}
    assert stages["cpu_capability"] == first["machine"]["cpu_capability"] and stages["torch_threads"] >= 1
    tree = json.loads((report / "tree" / "report.json").read_text())
    assert tree["decoding"].startswith("tree") and tree["same_as_baseline"] == 2 and tree["prompt_lookup"] is None
    assert (report / "tree" / "acceptance.png").is_file()
    assert sorted(p.name for p in (report / "training").glob("*.png")) == ["acceptance.png", "accuracy.png", "loss.png"]
    exported = json.loads((report / "draft-vllm" / "config.json").read_text())
    assert exported["architectures"] == ["LlamaForCausalLMEagle3"]
    results = (tmp_path / "run" / "eval" / "results.jsonl").read_text()
    run_demo(config)  # everything finished: reused
    assert (tmp_path / "run" / "eval" / "results.jsonl").read_text() == results
    assert json.loads((report / "report.json").read_text())["tau"] == first["tau"]

    # continuations: sized by the seconds per prompt every run of the demo recorded, on new prompts, from the
    # previous draft, scored against the previous draft on the same held-out continuations
    root = tmp_path / "run"
    seconds = json.loads((root / "stage-seconds.json").read_text())
    again = json.loads((report / "stages.json").read_text())  # the second run's: every run's seconds summed
    assert {"regenerate", "prepare", "extract", "train"} <= set(seconds) and seconds == again["seconds_all_runs"]
    assert seconds["train"] == pytest.approx(stages["seconds"]["train"] + again["seconds"]["train"])
    rate = seconds_per_prompt(root, 24)
    first_record = run_continuation(config, rate * 3.5 / 60)  # minutes for 3.5 prompts: 3
    assert first_record["continuation"] == 1 and first_record["prompts"] == 3 and first_record["measured_in"] == str(root)
    base_prompts = {json.loads(line)["prompt"] for line in (root / "prompts" / "train-prompts.jsonl").read_text().splitlines()}
    new_prompts = [json.loads(line)["prompt"] for line in (root / "continue-1" / "prompts.jsonl").read_text().splitlines()]
    assert len(new_prompts) == 3 and not set(new_prompts) & base_prompts
    base_tokens = [json.loads(line) for line in (root / "train" / "metrics.jsonl").read_text().splitlines()
                   if json.loads(line)["split"] == "train"][-1]["tokens"]
    assert first_record["training_tokens_all"] == base_tokens + first_record["training_tokens"] > base_tokens
    init = yaml.safe_load((root / "continue-1" / "train" / "config.yaml").read_text())["train"]["init"]
    assert Path(init) == root / "train" / "final"
    # the previous draft replayed is the demo's own chain pass, round for round
    assert first_record["tau_previous_draft"]["humaneval"]["tau"] == pytest.approx(passes["chain"]["tau"], abs=1e-3)
    later_rate = seconds_per_prompt(root / "continue-1", 3)
    second_record = run_continuation(config, later_rate * 2.5 / 60)
    assert second_record["continuation"] == 2 and second_record["measured_in"] == str(root / "continue-1")
    assert second_record["prompts"] == 2 and second_record["seconds_per_prompt"] == round(later_rate, 3)
    assert second_record["tau_previous_draft"] == first_record["tau"]
    later = [json.loads(line)["prompt"] for line in (root / "continue-2" / "prompts.jsonl").read_text().splitlines()]
    assert not set(later) & (base_prompts | set(new_prompts))
    assert [r["continuation"] for r in read_records(root)] == [1, 2]
