#!/usr/bin/env bash
# The hybrid of data and model parallelism against its parts (issue 11):
# one model, the same epochs, in one invocation: the sequential loop, a
# K-stage GPipe pipeline, D data-parallel ASGD workers, and D replicas of the
# K-stage pipeline whose stages push to their shards (ASGD). Final test
# accuracy, training samples/s (mean over epochs) and mean staleness.
#   bench/hybrid_bench.sh [MODEL] [EPOCHS] [D] [K] [BUILD_DIR]
set -euo pipefail
model=${1:-mlp} epochs=${2:-3} d=${3:-2} k=${4:-2} build=${5:-build}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
common=(--model "$model" --epochs "$epochs" --progress none --micro-batches 4)
declare -A runs=(
  [sequential]=""
  [pipeline]="--pipeline-stages $k"
  [data-parallel]="--algorithm asgd --workers $d"
  [hybrid]="--algorithm asgd --workers $d --pipeline-stages $k")
echo "| $model, $epochs epochs | options | test accuracy % | samples/s (mean of epochs) | mean staleness |"
echo "|---|---|---|---|---|"
for name in sequential pipeline data-parallel hybrid; do
  # shellcheck disable=SC2086
  "$build/troupe_trainer" "${common[@]}" ${runs[$name]} --metrics-out "$tmp/$name.jsonl" > "$tmp/$name.log" 2>&1 ||
    { cat "$tmp/$name.log" >&2; exit 1; }
  python3 - "$tmp/$name.jsonl" "$name" "${runs[$name]:-(defaults)}" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"epoch"')]
sps = sum(r["samples_per_s"] for r in recs) / len(recs)
tau = sum(r["mean_staleness"] for r in recs) / len(recs)
print(f"| {sys.argv[2]} | `{sys.argv[3]}` | {100 * recs[-1]['test_accuracy']:.2f} | {sps:.0f} | {tau:.2f} |")
PY
done
