#!/usr/bin/env bash
# Table and curves from bench/experiments.sh's JSON Lines files.
#   bench/experiments_report.sh bench/results/exp > table.md
set -euo pipefail
dir=$1
img=$(cd "$(dirname "$0")/.." && pwd)/docs/img
field() { sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p"; }
for setting in n4 n8 n16 hetero8; do
  echo "### $setting"
  echo
  echo "| algorithm | final test accuracy | epochs to 88% | mean staleness | max staleness | wall s |"
  echo "|---|---|---|---|---|---|"
  plot=()
  for f in "$dir/${setting}"_*.jsonl; do
    name=$(basename "$f" .jsonl); name=${name#${setting}_}
    if [ ! -s "$f" ]; then
      # A run that stopped: say why (e.g. "the model diverged") instead of dropping it.
      why=$(grep -o "loss is not finite\|NaN or Inf" "${f%.jsonl}.log" | head -1 || true)
      echo "| $name | diverged in epoch 1 (${why:-failed}) | — | — | — | — |"
      continue
    fi
    acc=$(field test_accuracy < "$f" | tail -1)
    reach=$(field test_accuracy < "$f" | awk '$1 >= 0.88 { print NR; exit }')
    tau=$(field mean_staleness < "$f" | awk '{ s += $1; n++ } END { if (n) printf "%.2f", s / n }')
    tmax=$(field max_staleness < "$f" | sort -n | tail -1)
    wall=$(field wall_s < "$f" | tail -1)
    printf "| %s | %.2f%% | %s | %s | %s | %.0f |\n" "$name" "$(awk "BEGIN{print 100*$acc}")" "${reach:-not reached}" "$tau" "$tmax" "$wall"
    field test_accuracy < "$f" | awk '{ print NR, 100 * $1 }' > "$dir/${setting}_${name}.dat"
    plot+=("'$dir/${setting}_${name}.dat' with linespoints title '$name'")
  done
  echo
  if command -v gnuplot > /dev/null && [ ${#plot[@]} -gt 0 ]; then
    gnuplot <<GP
set terminal pngcairo size 800,500
set output '$img/accuracy_${setting}.png'
set title 'MLP on Fashion-MNIST, $setting: test accuracy per epoch'
set xlabel 'epoch'
set ylabel 'test accuracy (%)'
set key bottom right
set grid
plot $(IFS=,; echo "${plot[*]}")
GP
  fi
done
