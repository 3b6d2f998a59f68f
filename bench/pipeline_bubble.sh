#!/usr/bin/env bash
# The pipeline bubble, measured from traces: K = 2 and 4 equal synthetic
# stages (10 ms forward and backward each), M = 4K micro-batches, GPipe (4
# mini-batches, a flush after each) and 1F1B (one mini-batch: the flush
# window the formula describes; then 4 mini-batches without a flush between
# them). Prints a markdown table.
#   bench/pipeline_bubble.sh [BUILD_DIR] [--wait spin]
set -euo pipefail
build=${1:-build}
shift || true
extra=("$@")
bin=$build/bench/troupe_pipeline_bubble
stats=$(dirname "$0")/trace_stats.py
[ -x "$bin" ] || { echo "pipeline_bubble.sh: $bin not built (cmake --build $build)" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
echo "| K | M | schedule | mini-batches | ideal (K-1)/(N+K-1) | measured idle per stage (min-max) | window ms |"
echo "|---|---|---|---|---|---|---|"
for K in 2 4; do
  M=$((4 * K))
  for run in "gpipe 4" "1f1b 1" "1f1b 4"; do
    read -r s steps <<<"$run"
    t=$dir/${K}_${s}_${steps}.json
    "$bin" --stages "$K" --micro-batches "$M" --schedule "$s" --steps "$steps" --trace "$t" "${extra[@]}" >/dev/null 2>"$t.log" ||
      { cat "$t.log" >&2; exit 1; }
    # GPipe: per mini-batch (N = M); 1F1B: over the run (N = every micro-batch)
    if [ "$s" = gpipe ]; then python3 "$stats" "$t" --only stage --stages "$K" --micro-batches "$M" --json "$t.stats" >/dev/null
    else python3 "$stats" "$t" --only stage --stages "$K" --json "$t.stats" >/dev/null; fi
    python3 - "$t.stats" "$K" "$M" "$s" "$steps" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); K, M, s, steps = sys.argv[2:]
key = "idle_per_mini_batch" if s == "gpipe" else "idle"
ideal = d["ideal_idle_mini_batch"] if s == "gpipe" else d["ideal_idle_run"]
idle = [t[key] for t in d["tracks"]]
print(f"| {K} | {M} | {s} | {steps} | {ideal:.3f} | {min(idle):.3f}-{max(idle):.3f} | {d['window_ms']:.0f} |")
PY
  done
done
