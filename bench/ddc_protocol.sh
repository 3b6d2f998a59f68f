#!/usr/bin/env bash
# The fair protocol of issue 14: ASGD, DC-ASGD-a and DDC-ASGD (v1 and v2),
# each at its own best learning rate, chosen on a held-out validation set (the
# last 10 % of the training set, --validation-fraction 0.1), never on the test set.
#
#   bench/ddc_protocol.sh [BUILD_DIR] [OUT_DIR]
#
# MLP, 5 epochs, in five settings: N = 4, 8, 16 workers of equal speed; 8
# workers of speeds 1x-4x; 8 workers of which one is 8x slower. Every rule at
# lr 0.01, 0.02, 0.05 and 0.1 (cosine schedule) with seeds 1, 2 and 3; the lr
# of the highest mean final validation accuracy is chosen, and the table gives
# the test accuracy of the 3 seeds at that lr.
# The reference CNN, 5 epochs, N = 8 and the straggler, lr 0.005, 0.01, 0.02
# and 0.05 (CNN_LRS; at 0.05 and above it diverges or stalls on 8 workers):
# each lr with seed 1 (the sweep), then seeds 2 and 3 at the lr seed 1 chose
# (CNN_SWEEP_SEEDS and CNN_SEEDS change that); rules CNN_RULES (default
# without DDC-ASGD v1, whose MLP runs say enough, to save a third of the time). Runs that already have their metrics file are not
# run again, so an interrupted invocation continues where it stopped.
# About an hour on 2 cores. Writes OUT_DIR/report.md (tables; the run of
# docs/experiments.md is bench/results/ddc_protocol/report.md), OUT_DIR/curves_*.png (test accuracy per
# epoch, mean of the seeds at each rule's lr) and every run's log and metrics.
# Environment: EPOCHS (5), LRS, CNN_LRS, MLP_SETTINGS / CNN_SETTINGS (names below;
# empty: skip), RULES, REPORT_ONLY=1 (tables from OUT_DIR's runs only).
set -euo pipefail
build=${1:-build} out=${2:-$(mktemp -d)}
mkdir -p "$out"
epochs=${EPOCHS:-5}
lrs=(${LRS:-0.01 0.02 0.05 0.1})
declare -A setting_opts=(
  [n4]="--workers 4" [n8]="--workers 8" [n16]="--workers 16"
  [hetero8]="--workers 8 --worker-speeds 12,12,6,6,4,4,3,3" [straggler8]="--workers 8 --worker-speeds 8,8,8,8,8,8,8,1")
declare -A rule_opts=(
  [asgd]="--algorithm asgd" [dc-asgd-a]="--algorithm dc-asgd-a" [ddc-v1]="--algorithm ddc-asgd"
  [ddc-v2]="--algorithm ddc-asgd --ddc-version 2")
rules=(${RULES:-asgd dc-asgd-a ddc-v1 ddc-v2})
cnn_rules=(${CNN_RULES:-asgd dc-asgd-a ddc-v2})
cnn_lrs=(${CNN_LRS:-0.005 0.01 0.02 0.05})
mlp_settings=(${MLP_SETTINGS-n4 n8 n16 hetero8 straggler8})
cnn_settings=(${CNN_SETTINGS-n8 straggler8})

run() {  # model setting rule lr seed
  local f=$out/$1_$2_$3_$4_$5
  [ -s "$f.jsonl" ] && grep -q '"epoch":'"$epochs"',' "$f.jsonl" && return 0
  [ -f "$f.log" ] && grep -q "not finite\|NaN or Inf" "$f.log" && return 0  # diverged before: the same again
  # shellcheck disable=SC2086
  "$build/troupe_trainer" --model "$1" --epochs "$epochs" --lr-schedule cosine --batch-size 64 --progress none \
    --validation-fraction 0.1 ${rule_opts[$3]} ${setting_opts[$2]} --lr "$4" --seed "$5" --metrics-out "$f.jsonl" \
    2> "$f.log" || echo "run stopped (see $f.log): $1 $2 $3 lr $4 seed $5" >&2
}

# The lr of the best mean final validation accuracy over the given seeds' runs.
best_lr() {  # model setting rule seeds...
  python3 - "$out" "$@" <<'PY'
import json, os, sys
out, model, setting, rule, *seeds = sys.argv[1:]
best = None
for lr in os.environ["LRS_LIST"].split():
    accs = []
    for s in seeds:
        f = os.path.join(out, f"{model}_{setting}_{rule}_{lr}_{s}.jsonl")
        recs = [json.loads(l) for l in open(f) if l.startswith('{"epoch"')] if os.path.exists(f) else []
        accs.append(recs[-1].get("validation_accuracy") or -1 if recs and recs[-1]["train_loss"] is not None else -1)
    m = sum(accs) / len(accs)
    if best is None or m > best[0]: best = (m, lr)
print(best[1])
PY
}
export LRS_LIST="${lrs[*]}"

if [ -z "${REPORT_ONLY:-}" ]; then
  for s in "${mlp_settings[@]}"; do
    for r in "${rules[@]}"; do for lr in "${lrs[@]}"; do for seed in 1 2 3; do run mlp "$s" "$r" "$lr" "$seed"; done; done; done
    echo "mlp $s done $(date +%T)" >&2
  done
  for s in "${cnn_settings[@]}"; do
    for r in "${cnn_rules[@]}"; do
      for lr in "${cnn_lrs[@]}"; do for seed in ${CNN_SWEEP_SEEDS:-1}; do run cnn "$s" "$r" "$lr" "$seed"; done; done
      lr=$(LRS_LIST="${cnn_lrs[*]}" best_lr cnn "$s" "$r" ${CNN_SWEEP_SEEDS:-1})
      for seed in ${CNN_SEEDS:-2 3}; do run cnn "$s" "$r" "$lr" "$seed"; done
    done
    echo "cnn $s done $(date +%T)" >&2
  done
fi

python3 "$(dirname "$0")/ddc_protocol_report.py" "$out" "$epochs" > "$out/report.md"
cat "$out/report.md"
