#!/usr/bin/env bash
# Training throughput of one job on 1 to 4 processes of this machine
# (scripts/local_cluster.sh, loopback) against the same job on actors in one
# process, in the same invocation: per repetition every process count once,
# in turn; medians of samples/s (an epoch's training samples / its seconds).
#   bench/cluster_bench.sh [MODEL] [STEPS] [REPS] [extra trainer options...]
#   bench/cluster_bench.sh mlp 600 5
#   bench/cluster_bench.sh cnn 150 3
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
model=${1:-mlp} steps=${2:-600} reps=${3:-5}
shift $(( $# < 3 ? $# : 3 ))
trainer=${TROUPE_TRAINER:-$here/../build/troupe_trainer}
export TROUPE_TRAINER=$trainer
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
job=(--model "$model" --algorithm asgd --workers 4 --shards 2 --epochs 1 --max-steps "$steps" --evaluate false
     --progress none "$@")
rate() { grep -o '"samples_per_s":[0-9.]*' "$1" | cut -d: -f2; }
for r in $(seq 1 "$reps"); do
  "$trainer" "${job[@]}" --metrics-out "$tmp/p1.jsonl" > /dev/null 2>&1
  line="1 $(rate "$tmp/p1.jsonl")"
  for p in 2 3 4; do
    "$here/../scripts/local_cluster.sh" "$p" "${job[@]}" --metrics-out "$tmp/p$p.jsonl" > /dev/null 2>&1
    line="$line $p $(rate "$tmp/p$p.jsonl")"
  done
  echo "rep $r: $line"
done | tee "$tmp/all.txt"
awk 'function median(v, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
                                   return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }
     { for (i = 3; i <= NF; i += 2) { c[$i]++; x[$i, c[$i]] = $(i + 1) } }
     END { for (p = 1; p <= 4; ++p) { for (k = 1; k <= c[p]; ++k) y[k] = x[p, k]; m[p] = median(y, c[p]) }
           for (p = 1; p <= 4; ++p) printf "%d process(es): median %.0f samples/s, %.2f x one process\n", p, m[p], m[p] / m[1] }' \
  "$tmp/all.txt"
