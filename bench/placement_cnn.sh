#!/usr/bin/env bash
# Placement measured, not predicted: the CNN (or MODEL) as a 4-stage 1F1B pipeline on
# emulated devices of speeds 1, 1, 2 and 4 (--device-speeds: 4 stages share
# 2 cores, so a stage alone here plays a device of speed 8, and a stage on a
# device of speed v holds each action's output until it has lasted 8 / v x
# its layers' time measured alone), placed by the greedy and optimal placers
# and by random placements (seeds 1..R), interleaved per repetition. The
# layers are measured once (--profile-cache) and every run places on those
# costs; each run's plan (the cost model's table in its log) gives the
# predicted step time, the run's samples/s the measured one.
#   bench/placement_cnn.sh [STEPS] [REPS] [RANDOM_SEEDS]     (defaults 150 3 5)
# Environment: MODEL (cnn; gpt: the language model, 4 stages of its
# layers), BATCH (64), EXTRA (more trainer options, e.g. "--context 64"),
# LOCK (a file: each run holds it, so that other work does not run beside it).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
steps=${1:-150} reps=${2:-3} seeds=${3:-5}
model=${MODEL:-cnn} batch=${BATCH:-64}
trainer=${TROUPE_TRAINER:-$here/../build/troupe_trainer}
lock=(); [ -n "${LOCK:-}" ] && lock=(flock "$LOCK")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# shellcheck disable=SC2206
job=(--model "$model" --batch-size "$batch" --pipeline-stages 4 --micro-batches 4 --schedule 1f1b
     --device-speeds 1,1,2,4 --epochs 1 --max-steps "$steps" --evaluate false --progress none --threads 2
     --profile-cache "$tmp/profile.txt" ${EXTRA:-})
run() {  # name, options... -> "predicted_ms measured_ms placement"
  local name=$1; shift
  "${lock[@]}" "$trainer" "${job[@]}" "$@" --metrics-out "$tmp/$name.jsonl" > "$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log" >&2; exit 1; }
  local pred sps layers
  pred=$(sed -n 's/^predicted step time \([0-9.]*\) ms.*/\1/p' "$tmp/$name.log")
  sps=$(grep -o '"samples_per_s":[0-9.]*' "$tmp/$name.jsonl" | cut -d: -f2)
  layers=$(grep -o '^| [0-9][^|]*| \[[0-9]*, [0-9]*) | d[0-9]' "$tmp/$name.log" | sed 's/^| \([0-9]\)[^|]*| \[\([0-9]*\), \([0-9]*\)) | d\([0-9]\)/\2-\3@d\4/' | tr '\n' ' ')
  echo "$pred $(awk -v s="$sps" -v b="$batch" 'BEGIN{printf "%.3f", 1000 * b / s}') $layers"
}
for r in $(seq 1 "$reps"); do
  echo "rep $r greedy $(run g$r --placement greedy)"
  echo "rep $r optimal $(run o$r --placement optimal)"
  echo "rep $r even $(run e$r --placement even)"
  for s in $(seq 1 "$seeds"); do echo "rep $r random$s $(run r$r.$s --placement random --seed "$s")"; done
done | tee "$tmp/all.txt" >&2
python3 - "$tmp/all.txt" <<'PY'
import statistics, sys, collections
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    name, pred, meas = f[2], float(f[3]), float(f[4])
    runs[name].append((pred, meas, " ".join(f[5:])))
def med(name, i): return statistics.median(x[i] for x in runs[name])
print("| placement | stages (layers@device) | predicted step ms (median) | measured step ms (median) | measured / predicted |")
print("|---|---|---|---|---|")
for name in sorted(runs, key=lambda n: (n.startswith("random"), n)):
    p, m = med(name, 0), med(name, 1)
    print(f"| {name} | {runs[name][-1][2]} | {p:.2f} | {m:.2f} | {m / p:.2f} |")
rnd = [n for n in runs if n.startswith("random")]
if rnd:
    mean_r = statistics.mean(med(n, 1) for n in rnd)
    g, o = med("greedy", 1), med("optimal", 1)
    print(f"\nmeasured: greedy {g:.2f} ms, optimal {o:.2f} ms, mean of {len(rnd)} random placements {mean_r:.2f} ms; "
          f"greedy is {100 * (1 - g / mean_r):.0f} % below the random mean and {100 * (g / o - 1):+.0f} % from the optimal")
PY
