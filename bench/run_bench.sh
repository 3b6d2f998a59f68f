#!/usr/bin/env bash
# troupe against libtorch on this machine, in one invocation:
#   * GEMM 1024^3 GFLOP/s: troupe's gemm vs OpenBLAS (and Eigen's product)
#   * training samples/s, MLP and CNN, Fashion-MNIST, batch 64, SGD lr 0.05
#     momentum 0.9, 2 threads, one epoch; runs interleaved, medians compared
#   * gpt (zoo::gpt on Debian's fortunes, the trainer's defaults: AdamW lr 0.001, weight decay 0.01,
#     batch 32, context 128, cosine schedule) for STEPS_GPT steps, the same windows on both sides;
#     samples (windows) and tokens per second
#   * peak RSS of each run
# Usage: bench/run_bench.sh [BUILD_DIR] (default build/). Env: REPS_MLP (5), REPS_CNN (3), THREADS (2),
# MODELS ("mlp cnn"; resnet and gpt too), STEPS_RESNET (300: resnet runs that many steps, not an epoch; 0: an epoch),
# REPS_RESNET (3), STEPS_GPT (100, at most an epoch's 128), REPS_GPT (5), GEMM (1: the GEMM line; 0: skip it),
# BEFORE (a directory holding an earlier troupe_trainer and its libtroupe.so.0: run interleaved too, as
# "before", for a before/after in the same invocation).
# Needs the libtorch baseline: scripts/setup.sh --bench, then rebuild.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
reps_mlp=${REPS_MLP:-5}
reps_cnn=${REPS_CNN:-3}
reps_resnet=${REPS_RESNET:-3}
steps_resnet=${STEPS_RESNET:-300}
reps_gpt=${REPS_GPT:-5}
steps_gpt=${STEPS_GPT:-100}
run_gemm=${GEMM:-1}
before=${BEFORE:-}
threads=${THREADS:-2}
models=${MODELS:-mlp cnn}
trainer=$build/troupe_trainer
torch=$build/bench/troupe_torch_baseline
gemm=$build/bench/troupe_gemm_bench
for b in "$trainer" "$gemm"; do
  [ -x "$b" ] || { echo "run_bench: $b not built (cmake --build $build)" >&2; exit 1; }
done
if [ -n "$before" ] && [ ! -x "$before/troupe_trainer" ]; then
  echo "run_bench: BEFORE=$before holds no troupe_trainer" >&2
  exit 1
fi
if [ ! -x "$torch" ]; then
  echo "run_bench: $torch not built: install libtorch with scripts/setup.sh --bench, then rebuild" >&2
  exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
field() { sed -n "s/.*\"$1\":\([-0-9.e+]*\).*/\1/p" "$2" | tail -n 1; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

cpu_steal() { awk '/^cpu /{print $9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }
read -r steal0 total0 < <(cpu_steal)
echo "machine: $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -n 1)"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo
if [ "$run_gemm" = 1 ]; then
  "$gemm" --size 1024 --threads "$threads" --reps 10 | tee "$tmp/gemm.json"
  echo
fi

for model in $models; do
  reps=$reps_mlp
  [ "$model" = cnn ] && reps=$reps_cnn
  # Each framework's own defaults for the model: the image models take SGD's, gpt its own (see above).
  limit=(--batch-size 64 --lr 0.05 --momentum 0.9)
  if [ "$model" = resnet ]; then reps=$reps_resnet; limit+=(--max-steps "$steps_resnet"); fi
  if [ "$model" = gpt ]; then reps=$reps_gpt; limit=(--max-steps "$steps_gpt"); fi
  : > "$tmp/$model.troupe"; : > "$tmp/$model.torch"; : > "$tmp/$model.before"; : > "$tmp/$model.rss_troupe"; : > "$tmp/$model.rss_torch"
  for r in $(seq "$reps"); do
    "$trainer" --model "$model" --epochs 1 "${limit[@]}" --threads "$threads" \
      --progress none --metrics-out "$tmp/t.jsonl" 2>/dev/null
    field samples_per_s "$tmp/t.jsonl" >> "$tmp/$model.troupe"
    field peak_rss_mb "$tmp/t.jsonl" >> "$tmp/$model.rss_troupe"
    "$torch" --model "$model" --epochs 1 "${limit[@]}" --threads "$threads" \
      2>/dev/null > "$tmp/b.json"
    field samples_per_s "$tmp/b.json" >> "$tmp/$model.torch"
    field peak_rss_mb "$tmp/b.json" >> "$tmp/$model.rss_torch"
    line="$model run $r: troupe $(tail -n 1 "$tmp/$model.troupe") samples/s, libtorch $(tail -n 1 "$tmp/$model.torch") samples/s"
    if [ -n "$before" ]; then
      LD_LIBRARY_PATH="$before" "$before/troupe_trainer" --model "$model" --epochs 1 "${limit[@]}" --threads "$threads" \
        --progress none --metrics-out "$tmp/t.jsonl" 2>/dev/null
      field samples_per_s "$tmp/t.jsonl" >> "$tmp/$model.before"
      line+=", troupe before $(tail -n 1 "$tmp/$model.before") samples/s"
    fi
    echo "$line"
  done
done

echo
printf '| model | troupe samples/s (median) | libtorch samples/s (median) | ratio | troupe peak RSS MB | libtorch peak RSS MB |\n'
printf '|---|---|---|---|---|---|\n'
for model in $models; do
  t=$(median < "$tmp/$model.troupe"); b=$(median < "$tmp/$model.torch")
  rt=$(sort -g "$tmp/$model.rss_troupe" | tail -n 1); rb=$(sort -g "$tmp/$model.rss_torch" | tail -n 1)
  printf '| %s | %.0f | %.0f | %.2fx | %.0f | %.0f |\n' "$model" "$t" "$b" "$(awk -v a="$t" -v b="$b" 'BEGIN{print a/b}')" "$rt" "$rb"
done
if [ -n "$before" ]; then
  printf '\n| model | troupe before samples/s (median) | before / libtorch | after / before |\n|---|---|---|---|\n'
  for model in $models; do
    t=$(median < "$tmp/$model.troupe"); b=$(median < "$tmp/$model.torch"); o=$(median < "$tmp/$model.before")
    printf '| %s | %.0f | %.2fx | %.2fx |\n' "$model" "$o" "$(awk -v a="$o" -v b="$b" 'BEGIN{print a/b}')" \
      "$(awk -v a="$t" -v b="$o" 'BEGIN{print a/b}')"
  done
fi
if [[ " $models " == *" gpt "* ]]; then
  t=$(median < "$tmp/gpt.troupe"); b=$(median < "$tmp/gpt.torch")
  printf '\ngpt: %s steps of batch 32, context 128: troupe %.0f tokens/s, libtorch %.0f tokens/s (medians)\n' \
    "$steps_gpt" "$(awk -v a="$t" 'BEGIN{print a*128}')" "$(awk -v b="$b" 'BEGIN{print b*128}')"
fi
if [ "$run_gemm" = 1 ]; then
  gflops() { sed -n "s/.*\"candidate\":\"$1\",\"gflops\":\([0-9.]*\).*/\1/p" "$tmp/gemm.json"; }
  printf '\nGEMM 1024^3, %s threads, kernels %s: troupe (openblas backend) %s GFLOP/s, own %s, OpenBLAS %s (own/OpenBLAS %s), Eigen %s\n' \
    "$threads" "$(sed -n 's/.*"kernels":"\([^"]*\)".*/\1/p' "$tmp/gemm.json")" "$(gflops troupe_openblas)" \
    "$(gflops troupe_own)" "$(gflops openblas)" "$(field own_vs_openblas "$tmp/gemm.json")" "$(gflops eigen)"
fi
read -r steal1 total1 < <(cpu_steal)
# On a shared VM the hypervisor may take cores away ("steal"); runs are interleaved so both sides see it.
printf 'CPU steal during the run: %s%%\n' "$(awk -v s=$((steal1 - steal0)) -v t=$((total1 - total0)) 'BEGIN{printf "%.1f", t ? 100*s/t : 0}')"
