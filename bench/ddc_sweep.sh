#!/usr/bin/env bash
# DDC-ASGD's constants: a small grid on the MLP (3 epochs, lr 0.05 cosine,
# seed 1) with 4 and 16 workers. Prints one line per run: N alpha mu0 accuracy.
#   bench/ddc_sweep.sh [build-dir] > bench/results/ddc_sweep.txt
set -uo pipefail
build=${1:-build}
for n in 4 16; do
  for alpha in 0 0.05 0.2 0.5; do
    for mu0 in 0.5 0.9 0.95; do
      acc=$("$build/troupe_trainer" --model mlp --algorithm ddc-asgd --workers "$n" --epochs 3 --lr 0.05 \
              --ddc-alpha "$alpha" --ddc-mu0 "$mu0" --progress none 2>&1 |
            sed -n 's/.*test accuracy \([0-9.]*\)%.*/\1/p' | tail -1)
      echo "N=$n alpha=$alpha mu0=$mu0 accuracy=$acc"
    done
  done
done
