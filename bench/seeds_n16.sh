#!/usr/bin/env bash
# Run-to-run spread at N = 16: ASGD, DC-ASGD-a and DDC-ASGD with seeds 2 and 3
# (seed 1 is in bench/experiments.sh), same settings otherwise.
#   bench/seeds_n16.sh [build-dir] > bench/results/seeds_n16.txt
set -uo pipefail
build=${1:-build}
for seed in 2 3; do
  for algo in asgd dc-asgd-a ddc-asgd; do
    line=$("$build/troupe_trainer" --model mlp --epochs 5 --lr 0.05 --lr-schedule cosine --batch-size 64 \
             --seed "$seed" --progress none --algorithm "$algo" --workers 16 2>&1 | tail -1)
    echo "seed=$seed $algo: $line"
  done
done
