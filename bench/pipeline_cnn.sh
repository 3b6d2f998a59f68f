#!/usr/bin/env bash
# The CNN as a pipeline against the sequential loop, same seed, same epochs:
# K = 2 and 4 stages, GPipe and 1F1B (M = 4 micro-batches of a 64-sample
# mini-batch), each run traced; prints final test accuracy, epoch time and
# each stage's utilization (bench/trace_stats.py).
#   bench/pipeline_cnn.sh [EPOCHS] [OUT_DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
epochs=${1:-5} out=${2:-$(mktemp -d)}
trainer=${TROUPE_TRAINER:-$here/../build/troupe_trainer}
mkdir -p "$out"
job=(--model cnn --epochs "$epochs" --progress none)
acc() { python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1]) if '\"epoch\"' in l]; print(f\"{100*r[-1]['test_accuracy']:.2f} {sum(x['train_s'] for x in r)/len(r):.1f}\")" "$1"; }
echo "| run | test accuracy % | training s/epoch | stage utilization (trace) |"
echo "|---|---|---|---|"
"$trainer" "${job[@]}" --metrics-out "$out/seq.jsonl" > "$out/seq.log" 2>&1
read -r a s < <(acc "$out/seq.jsonl")
echo "| sequential | $a | $s | - |"
for K in 2 4; do
  for sch in gpipe 1f1b; do
    n=k${K}_$sch
    "$trainer" "${job[@]}" --pipeline-stages "$K" --micro-batches 4 --schedule "$sch" \
      --metrics-out "$out/$n.jsonl" --trace "$out/$n.trace.json" > "$out/$n.log" 2>&1
    read -r a s < <(acc "$out/$n.jsonl")
    python3 "$here/trace_stats.py" "$out/$n.trace.json" --only stage --json "$out/$n.stats.json" > "$out/$n.stats.txt"
    u=$(python3 -c "import json,sys; print(' / '.join(f\"{t['utilization']:.2f}\" for t in json.load(open(sys.argv[1]))['tracks']))" "$out/$n.stats.json")
    echo "| K=$K $sch | $a | $s | $u |"
  done
done
