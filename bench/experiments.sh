#!/usr/bin/env bash
# The asynchronous-SGD experiment of docs/experiments.md: the MLP on
# Fashion-MNIST, 5 epochs, lr 0.05 cosine, batch 64, seed 1, for N = 4, 8, 16
# workers and one heterogeneous run (8 workers, speeds 1x to 4x), each
# algorithm plus DDC-ASGD's ablation. One JSON Lines file per run under
# bench/results/exp/, then a table (bench/results/experiments.md) and
# accuracy-vs-epoch curves (docs/img/*.png, gnuplot).
#   bench/experiments.sh [build-dir]
set -euo pipefail
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
out=$here/results/exp
mkdir -p "$out" "$here/../docs/img"
common=(--model mlp --epochs 5 --lr 0.05 --lr-schedule cosine --batch-size 64 --seed 1 --progress none)

# name:algorithm:extra options
runs=(
  "ssgd:ssgd:" "asgd:asgd:" "sa-asgd:sa-asgd:" "hogwild:hogwild:" "dc-asgd-c:dc-asgd-c:" "dc-asgd-a:dc-asgd-a:"
  "ddc-asgd:ddc-asgd:" "ddc-rho-only:ddc-asgd:--ddc-mu0 0" "ddc-mu-only:ddc-asgd:--ddc-alpha 0"
)
settings=("n4:--workers 4" "n8:--workers 8" "n16:--workers 16" "hetero8:--workers 8 --worker-speeds 12,12,6,6,4,4,3,3")

for s in "${settings[@]}"; do
  sname=${s%%:*}; sopts=${s#*:}
  for r in "${runs[@]}"; do
    name=${r%%:*}; rest=${r#*:}; algo=${rest%%:*}; extra=${rest#*:}
    file=$out/${sname}_${name}.jsonl
    # shellcheck disable=SC2086
    "$build/troupe_trainer" "${common[@]}" --algorithm "$algo" $sopts $extra --metrics-out "$file" 2>"$out/${sname}_${name}.log" ||
      echo "FAILED: $sname $name (see $out/${sname}_${name}.log)"
    echo "$sname $name: $(tail -1 "$out/${sname}_${name}.log")"
  done
done
"$here/experiments_report.sh" "$out" > "$here/results/experiments.md"
cat "$here/results/experiments.md"
