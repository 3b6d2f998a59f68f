#!/usr/bin/env bash
# The scaling model (model/scaling.hpp) against measured runs: the three default configurations
# (allreduce, and SSGD and ASGD with the default cut) on N node processes in network namespaces
# with tbf links, the MLP at N = 2, 3, 4 and the CNN at N = 2, 3, on 200 Mbit/s and 1 Gbit/s
# (bench/allreduce_vs_shards.sh per row: the configurations take turns, ROUNDS rounds, medians),
# then one line per configuration: predicted from the compute measured alone / measured (error;
# error from the run's own compute), and how many are within 15 %. As root (the namespaces).
#   bench/scaling_validation.sh [ROUNDS]        (default 3; docs/experiments.md, "Scaling data parallelism")
# Environment: ROWS (default all ten, e.g. ROWS="cnn 2 1gbit;cnn 3 1gbit"), STEPS (global steps a run, 100).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${STEPS:-100}
rows=${ROWS:-"mlp 2 200mbit;mlp 3 200mbit;mlp 4 200mbit;mlp 2 1gbit;mlp 3 1gbit;mlp 4 1gbit;cnn 2 200mbit;cnn 3 200mbit;cnn 2 1gbit;cnn 3 1gbit"}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p') (family $(lscpu | sed -n 's/^CPU family: *//p') model $(lscpu | sed -n 's/^Model: *//p')); $(date -u); commit $(git rev-parse --short HEAD 2>/dev/null || echo -)"
IFS=';' read -ra list <<< "$rows"
for row in "${list[@]}"; do
  read -r model n rate <<< "$row"
  echo "=== $model $n $rate"
  CONFIGS="allreduce;ssgd --shards $n;asgd --shards $n" LINKS=netns bench/allreduce_vs_shards.sh "$model" "$n" "$steps" "$rounds" "$rate"
done | tee "$log"
echo
python3 bench/scaling_validation_summary.py "$log"
