#!/usr/bin/env bash
# The gpt's training loss step by step, troupe against libtorch (issue 24):
# the trainer's defaults (2 epochs of 4 096 windows of 128 characters of
# fortunes, batch 32 = 256 steps, AdamW lr 0.001, cosine, weight decay 0.01),
# the same windows on both sides (troupe_torch_baseline draws them with
# troupe's sampler and seeds), each framework's own initialization, seeds 1-3.
# Writes each run's step losses, a table of the mean over the seeds in windows
# of EVERY steps and the final test losses, and a gnuplot PNG of both curves.
# Runs whose output exists are not run again.
#   bench/lm_curve.sh [BUILD_DIR] [OUT_DIR] [PNG]
# Environment: SEEDS ("1 2 3"), EVERY (8), LOCK (/tmp/troupe-build.lock).
set -euo pipefail
build=${1:-build} out=${2:-bench/results/lm_curve} png=${3:-docs/img/gpt_loss_troupe_libtorch.png}
seeds=${SEEDS:-1 2 3} every=${EVERY:-8} lock=${LOCK:-/tmp/troupe-build.lock}
for b in "$build/bench/troupe_step_losses" "$build/bench/troupe_torch_baseline"; do
  [ -x "$b" ] || { echo "lm_curve.sh: $b not built" >&2; exit 1; }
done
mkdir -p "$out"
for s in $seeds; do
  if [ ! -s "$out/troupe_$s.txt" ]; then
    flock "$lock" "$build/bench/troupe_step_losses" --model gpt --seed "$s" --progress none \
      --metrics-out "$out/troupe_$s.jsonl" > "$out/troupe_$s.txt" 2> "$out/troupe_$s.log"
  fi
  if [ ! -s "$out/libtorch_$s.txt" ]; then
    flock "$lock" "$build/bench/troupe_torch_baseline" --model gpt --epochs 2 --seed "$s" --log-every 1 \
      > "$out/libtorch_$s.json" 2> "$out/libtorch_$s.log"
    grep '^step ' "$out/libtorch_$s.log" | awk '{print $2, $4}' > "$out/libtorch_$s.txt"
  fi
done
python3 - "$out" "$every" $seeds <<'PY'
import json, statistics, sys
out, every, seeds = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def losses(impl, s):
    return [float(l.split()[1]) for l in open(f"{out}/{impl}_{s}.txt") if l.strip()]
def final(impl, s):
    if impl == "troupe":
        recs = [json.loads(l) for l in open(f"{out}/troupe_{s}.jsonl") if l.startswith('{"epoch"')]
        return recs[-1]["test_loss"]
    return json.loads(open(f"{out}/libtorch_{s}.json").read().strip().splitlines()[-1])["test_loss"]
runs = {impl: [losses(impl, s) for s in seeds] for impl in ("troupe", "libtorch")}
steps = min(len(r) for rs in runs.values() for r in rs)
with open(f"{out}/curve.dat", "w") as f:
    f.write("# step troupe libtorch: mean training loss over the seeds and the window of steps ending here\n")
    for end in range(every, steps + 1, every):
        row = [statistics.mean(x for r in runs[i] for x in r[end - every:end]) for i in ("troupe", "libtorch")]
        f.write(f"{end} {row[0]:.4f} {row[1]:.4f}\n")
t = [final("troupe", s) for s in seeds]
l = [final("libtorch", s) for s in seeds]
print(f"steps {steps}; final test loss, seeds {' '.join(seeds)}:")
print(f"  troupe   {' '.join(f'{x:.4f}' for x in t)}  mean {statistics.mean(t):.4f}")
print(f"  libtorch {' '.join(f'{x:.4f}' for x in l)}  mean {statistics.mean(l):.4f}")
print(f"  troupe - libtorch: {statistics.mean(t) - statistics.mean(l):+.4f} nats")
print(open(f"{out}/curve.dat").read())
PY
gnuplot <<GP
set terminal pngcairo size 800,480
set output "$png"
set title "gpt on fortunes, trainer defaults: training loss, mean of seeds $seeds over windows of $every steps"
set xlabel "step"
set ylabel "training loss (nats per character)"
set grid
plot "$out/curve.dat" using 1:2 with linespoints title "troupe", "$out/curve.dat" using 1:3 with linespoints title "libtorch 1.13"
GP
echo "lm_curve.sh: $png" >&2
