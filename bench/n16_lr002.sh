#!/usr/bin/env bash
# N = 16 at lr 0.02 (at 0.05 ASGD and DC-ASGD diverge there): ASGD, DC-ASGD-a, DDC-ASGD.
#   bench/n16_lr002.sh [build-dir] > bench/results/n16_lr002.txt
set -uo pipefail
build=${1:-build}
for algo in asgd dc-asgd-a ddc-asgd; do
  line=$("$build/troupe_trainer" --model mlp --epochs 5 --lr 0.02 --lr-schedule cosine --batch-size 64 \
           --seed 1 --progress none --algorithm "$algo" --workers 16 2>&1 | grep -E "epoch 5/5|error" | tail -1)
  echo "$algo: $line"
done
