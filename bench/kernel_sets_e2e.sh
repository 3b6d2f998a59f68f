#!/usr/bin/env bash
# A zoo model's training on each kernel set of one build (TROUPE_CPU_KERNELS)
# and, with BEFORE, on an earlier build, in one invocation: the runs take
# turns (every configuration once per round), and each configuration's median
# samples/s (the trainer's epoch line, evaluation off) is compared.
# Usage: bench/kernel_sets_e2e.sh [BUILD_DIR] (default build/). Env: MODELS ("gpt cnn"), REPS (7 rounds),
# SETS ("avx512 avx2+fma"), STEPS_<model> (steps per run: gpt 40, cnn 200, others 100), THREADS (2),
# BEFORE (a directory with an earlier troupe_trainer and its libtroupe.so.0, run as "before").
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
models=${MODELS:-gpt cnn}
reps=${REPS:-7}
sets=${SETS:-avx512 avx2+fma}
threads=${THREADS:-2}
before=${BEFORE:-}
[ -x "$build/troupe_trainer" ] || { echo "kernel_sets_e2e: $build/troupe_trainer not built" >&2; exit 1; }
if [ -n "$before" ] && [ ! -x "$before/troupe_trainer" ]; then
  echo "kernel_sets_e2e: BEFORE=$before holds no troupe_trainer" >&2
  exit 1
fi
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
echo "machine: $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -n 1)"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
configs="$sets${before:+ before}"
for model in $models; do
  steps_var=STEPS_$model
  case $model in gpt) steps=${!steps_var:-40} ;; cnn) steps=${!steps_var:-200} ;; *) steps=${!steps_var:-100} ;; esac
  args=(--model "$model" --epochs 1 --max-steps "$steps" --threads "$threads" --progress none --evaluate false)
  for r in $(seq 1 "$reps"); do
    for c in $configs; do
      if [ "$c" = before ]; then
        out=$(LD_LIBRARY_PATH=$before "$before/troupe_trainer" "${args[@]}" 2>&1)
      else
        out=$(TROUPE_CPU_KERNELS=$c "$build/troupe_trainer" "${args[@]}" 2>&1)
      fi
      sps=$(sed -n 's/.*, \([0-9.]*\) samples\/s.*/\1/p' <<<"$out" | tail -n 1)
      loss=$(sed -n 's/.*train loss \([0-9.]*\).*/\1/p' <<<"$out" | tail -n 1)
      echo "$model round $r $c: $sps samples/s, train loss $loss"
      echo "$sps" >>"$tmp/$model.$c"
    done
  done
  line="$model ($steps steps, $reps runs each, median samples/s):"
  for c in $configs; do line+=" $c $(median <"$tmp/$model.$c") [$(sort -g "$tmp/$model.$c" | head -n 1)-$(sort -g "$tmp/$model.$c" | tail -n 1)]"; done
  echo "$line"
done
