#!/usr/bin/env bash
# TTT depth at the scale of the small demo's continuations: continuation K (default 2) of the small demo
# (`make demo-continue`, in .venv-vllm: runs/demo-vllm) trained again with TTT_STEPS (default 5) instead of
# the demo's depth, from the same warm start on the same features for the same steps, then scored by
# `eyas eval --chain 4` on 8 prompts x 96 tokens of both held-out sets (float32). Prints one JSON line per
# set: the rerun's tau and acceptance, the continuation's own (replayed, equal to the decoder's), their
# ratio of (tau - 1), and both training times. Torch threads: eyas's default (both cores here).
set -euo pipefail
cd "$(dirname "$0")/.."
K=${K:-2}; TTT_STEPS=${TTT_STEPS:-5}; ROOT=${ROOT:-runs/demo-vllm}; OUT=${OUT:-runs/quality/ttt-at-scale}
BIN=${BIN:-.venv/bin}
$BIN/eyas train --config $ROOT/continue-$K/train/config.yaml --out $OUT/ttt$TTT_STEPS train.ttt_steps=$TTT_STEPS >&2
for set in eval-prompts chat-prompts; do
  $BIN/eyas eval --draft $OUT/ttt$TTT_STEPS/final --prompts $ROOT/prompts/$set.jsonl --out $OUT/eval-$set \
    --chain 4 --limit 8 --max-new-tokens 96 --dtype float32 >&2
done
$BIN/python - "$ROOT" "$K" "$OUT" "$TTT_STEPS" <<'PY'
import json, sys
from pathlib import Path
from eyas.demo.continuation import read_records
from eyas.train.plot import METRICS_FILE, read_metrics
root, k, out, depth = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
record = read_records(root)[k - 1]
run = out / f"ttt{depth}"
last = read_metrics(run / METRICS_FILE, run)["train"][-1]
for name, label in (("humaneval", "eval-prompts"), ("chat", "chat-prompts")):
    report = json.loads((out / f"eval-{label}" / "report.json").read_text())
    base = record["tau"][name]["tau"]
    print(json.dumps({"bench": "ttt_at_scale", "set": name, "continuation": k, "training_tokens_all": record["training_tokens_all"],
                      "ttt_steps": depth, "tau": round(report["tau"], 4), "acceptance": report["per_position_acceptance"],
                      "same_as_baseline": report["same_as_baseline"], "baseline_tau": base,
                      "vs_baseline": round((report["tau"] - 1) / (base - 1), 3),
                      "train_seconds": round(last["tokens"] / last["tokens_per_s"]), "baseline_train_seconds": record["seconds"]["train"],
                      **report["machine"]}))
PY
