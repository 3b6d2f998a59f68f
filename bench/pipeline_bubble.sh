#!/usr/bin/env bash
# The pipeline bubble, measured from traces: K = 2 and 4 equal synthetic
# stages (10 ms forward and backward each), M = 4K micro-batches, GPipe (4
# mini-batches, a flush after each) and 1F1B (one mini-batch: the flush
# window the formula describes; then 4 mini-batches without a flush between
# them). Prints a markdown table.
# With MODEL=gpt the stages are the trainer's gpt (context 64, 4 blocks; K =
# 4 only: one block per stage, cut at layers 3, 4, 5), each on an emulated
# device of speed 1 (SPEEDS, default 1,1,1,1; --device-speeds: each action lasts a multiple of its time alone,
# so that 4 stages on 2 cores do not wait for the cores), a batch of 4 samples
# per micro-batch; LOCK (a file) is held by each run; PROFILE (a file) is the
# --profile-cache of every run, so that all of them hold their actions to the
# same measured layer costs (without it each run measures them again).
# BALANCE=1 (MODEL=gpt): the formula assumes K equal stages; the GPT's are not
# (the first holds the embeddings, the last the head and the loss), so each
# schedule's speeds are first made to even out the stages' predicted times
# (the trainer's placement table for SPEEDS, one step): a stage k predicted
# at t_k ms gets speed SPEEDS_k x t_k / max(t). PROFILE is then required, so
# that the runs hold their actions to the costs the speeds were computed from.
# KEEP_AWAKE=1: one busy loop per core at the lowest priority there is
# (SCHED_IDLE: it runs only when nothing else wants the core, and a waking
# thread preempts it at once), so that the cores never go idle while the
# emulated devices hold their actions. On a virtual machine an idle core is
# halted, and waking it again (a timer, a message) takes the hypervisor up to
# milliseconds, which lands on the pipeline's critical path
# (docs/experiments.md, "The GPT as a 4-stage pipeline").
#   bench/pipeline_bubble.sh [BUILD_DIR] [--wait spin]
set -euo pipefail
awake=()
if [ "${KEEP_AWAKE:-0}" = 1 ]; then
  for _ in $(seq "$(nproc)"); do chrt -i 0 sh -c 'while :; do :; done' & awake+=($!); done
fi
build=${1:-build}
shift || true
extra=("$@")
bin=$build/bench/troupe_pipeline_bubble
if [ "${MODEL:-}" = gpt ]; then
  lock=(); [ -n "${LOCK:-}" ] && lock=(flock "$LOCK")
  gpt_stages() {  # --stages K --micro-batches M --schedule S --steps N --trace FILE
    local K M S N T
    while [ $# -gt 0 ]; do
      case $1 in --stages) K=$2;; --micro-batches) M=$2;; --schedule) S=$2;; --steps) N=$2;; --trace) T=$2;; esac
      shift 2
    done
    local speeds=${SPEEDS:-1,1,1,1}
    [ "${BALANCE:-0}" = 1 ] && speeds=$(balanced_speeds "$K" "$M" "$S")
    echo "speeds $speeds" >&2
    gpt_run "$K" "$M" "$S" "$speeds" --max-steps "$N" --trace "$T"
  }
  gpt_run() {  # K M S SPEEDS, then more trainer options
    local K=$1 M=$2 S=$3 speeds=$4
    shift 4
    "${lock[@]}" "$build/troupe_trainer" --model gpt --context 64 --batch-size $((4 * M)) --pipeline-stages "$K" \
      --micro-batches "$M" --schedule "$S" --placement manual --pipeline-cuts 3,4,5 --stage-devices 0,1,2,3 \
      --device-speeds "$speeds" ${PROFILE:+--profile-cache "$PROFILE"} --epochs 1 --evaluate false --progress none "$@"
  }
  balanced_speeds() {  # K M S: SPEEDS evened out by the placement table of one step
    [ -n "${PROFILE:-}" ] || { echo "pipeline_bubble.sh: BALANCE=1 needs PROFILE" >&2; exit 1; }
    gpt_run "$1" "$2" "$3" "${SPEEDS:-1,1,1,1}" --max-steps 1 2>&1 | python3 -c '
import re, sys
speeds = [float(v) for v in sys.argv[1].split(",")]
times = [float(m.group(1)) for m in (re.match(r"\| \d+[^|]*\|[^|]*\|[^|]*\|[^|]*\|[^|]*\|[^|]*\| ([0-9.]+) \|", l) for l in sys.stdin) if m]
if len(times) != len(speeds): sys.exit("pipeline_bubble.sh: no placement table of %d stages" % len(speeds))
print(",".join("%.5g" % (s * t / max(times)) for s, t in zip(speeds, times)))' "${SPEEDS:-1,1,1,1}"
  }
  bin=gpt_stages
  ks=(4)
else
  ks=(2 4)
fi
stats=$(dirname "$0")/trace_stats.py
[ "$bin" = gpt_stages ] || [ -x "$bin" ] || { echo "pipeline_bubble.sh: $bin not built (cmake --build $build)" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"; [ ${#awake[@]} -eq 0 ] || kill "${awake[@]}" 2>/dev/null || true' EXIT
echo "| K | M | schedule | mini-batches | ideal (K-1)/(N+K-1) | measured idle per stage (min-max) | window ms |"
echo "|---|---|---|---|---|---|---|"
for K in "${ks[@]}"; do
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
