#!/usr/bin/env bash
# Synchronous data parallelism two ways, interleaved in one invocation: SSGD
# through S parameter shards, and allreduce (a ring among the workers, no
# shards); ASGD on the same shards for reference. N workers on N node
# processes (scripts/local_cluster.sh), on loopback and, as root, in network
# namespaces whose links tbf limits to RATE. Prints each run's samples/s and
# the medians per configuration.
#   bench/allreduce_vs_shards.sh [MODEL] [N] [STEPS] [REPS] [RATE]
#   bench/allreduce_vs_shards.sh mlp 3 200 3 200mbit
# Environment: CONFIGS (the algorithm options of each configuration, separated
# by ';'; default "ssgd --shards N;allreduce;asgd --shards N"), LINKS
# ("loopback netns" by default; netns only as root).
# For the netns runs it then prints model/scaling.hpp's prediction of each
# configuration (bench/troupe_scaling_table --row): from the compute measured
# alone, and from the compute the run's workers measured as they ran (the
# median over the rounds of their mean compute_ms_per_step).
set -euo pipefail
model=${1:-mlp} n=${2:-3} steps=${3:-200} reps=${4:-3} rate=${5:-200mbit}
here=$(cd "$(dirname "$0")" && pwd)
export TROUPE_TRAINER=${TROUPE_TRAINER:-$here/../build/troupe_trainer}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
configs=("ssgd --shards $n" "allreduce" "asgd --shards $n")
[ -n "${CONFIGS:-}" ] && IFS=';' read -r -a configs <<< "$CONFIGS"
run() {  # link (loopback | netns), algorithm options -> samples/s; "link|options|the workers' compute ms" to $tmp/computes
  local env=()
  [ "$1" = netns ] && env=(TROUPE_NETNS=1 TROUPE_NETNS_RATE="$rate")
  rm -f "$tmp/m.jsonl"
  env "${env[@]}" "$here/../scripts/local_cluster.sh" "$n" --model "$model" --epochs 1 --max-steps $((steps * n)) \
    --workers "$n" --algorithm $2 --progress none --metrics-out "$tmp/m.jsonl" > /dev/null 2>&1 || { echo 0; return; }
  echo "$1|$2|$(python3 -c '
import json, sys
ms = [w["compute_ms_per_step"] for l in open(sys.argv[1]) if "workers_summary" in l
      for w in json.loads(l)["workers_summary"] if "compute_ms_per_step" in w]
print(sum(ms) / len(ms) if ms else 0)' "$tmp/m.jsonl")" >> "$tmp/computes"
  grep -o '"samples_per_s":[0-9.]*' "$tmp/m.jsonl" | head -1 | cut -d: -f2
}
links=()
for l in ${LINKS:-loopback netns}; do
  if [ "$l" = netns ]; then [ "$(id -u)" = 0 ] && command -v ip > /dev/null && links+=(netns); else links+=("$l"); fi
done
echo "model $model, $n workers on $n node processes, $steps global steps, $(nproc) cores; netns links: tbf $rate"
for link in "${links[@]}"; do
  for i in $(seq 1 "$reps"); do
    line="$link"
    for c in "${configs[@]}"; do line="$line|$c|$(run "$link" "$c")"; done
    echo "$line"
  done
done | tee "$tmp/runs" | awk -F'|' '{ printf "%s:", $1; for (i = 2; i < NF; i += 2) printf " %s %.0f", $i, $(i + 1); printf "\n" }'
awk -F'|' '
  function median(v, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
                                     return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }
  { for (i = 2; i < NF; i += 2) { k = $1 " " $i; c[k]++; v[k, c[k]] = $(i + 1); keys[k] = 1 } }
  END { for (k in keys) { n = c[k]; delete x; for (j = 1; j <= n; j++) x[j] = v[k, j]; printf "median %s: %.0f samples/s\n", k, median(x, n) } }
' "$tmp/runs" | sort
[[ " ${links[*]} " == *" netns "* ]] || exit 0
mbit=$(echo "$rate" | awk '/gbit$/ { print $0 * 1000; next } { print $0 + 0 }')
echo "predicted for the netns runs (bench/troupe_scaling_table --row $model $n $mbit MS ...):"
for c in "${configs[@]}"; do
  ms=$(awk -F'|' -v c="$c" '$1 == "netns" && $2 == c { print $3 }' "$tmp/computes" | sort -g |
       awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
  echo "$c: run's compute $ms ms a step; $("$here/../build/bench/troupe_scaling_table" --row "$model" "$n" "$mbit" "$ms" $c)"
done
