#!/usr/bin/env bash
# Generation's time with each attention's keys and values kept (troupe_generate's
# default, model::decode) against the window's forward pass for every token
# (--cache false), in the same invocation: the trainer's default gpt (0.84 M
# parameters, context 128) after a few training steps (the time does not depend
# on the weights), one thread, runs of both interleaved, medians. Cases: 127
# tokens (the whole context), and 1 000 tokens with the window moving on by 1
# (each token reads the last 128), 64 or 128 tokens past the context; 0 tokens
# gives the time to load the checkpoint. Each pair's texts are compared.
#   bench/generate_bench.sh [BUILD_DIR] [ROUNDS]
# Environment: LOCK (/tmp/troupe-build.lock).
set -euo pipefail
build=${1:-build} rounds=${2:-5} lock=${LOCK:-/tmp/troupe-build.lock}
gen=$build/troupe_generate
[ -x "$gen" ] && [ -x "$build/troupe_trainer" ] || { echo "generate_bench.sh: build $build first" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
flock "$lock" "$build/troupe_trainer" --model gpt --max-steps 20 --epochs 1 --evaluate false --progress none \
  --checkpoint "$dir/gpt.ckpt" > /dev/null 2>&1
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, commit $(git rev-parse --short HEAD 2>/dev/null || echo ?), $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "# $gen --checkpoint gpt.ckpt --seed 7 --threads 1 --tokens T --window-shift S --cache C; $rounds rounds, medians"
# Seconds of one run (its text in $dir/out_$3).
run() {
  local t0 t1
  t0=$(date +%s.%N)
  flock "$lock" "$gen" --checkpoint "$dir/gpt.ckpt" --seed 7 --threads 1 --tokens "$1" --window-shift "$2" \
    --cache "$3" > "$dir/out_$3"
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l
}
printf '| tokens | window shift | kept keys and values (s) | forward per token (s) | ratio | ms a token, kept / forward | same text |\n|---|---|---|---|---|---|---|\n'
load=0
for c in "0 1" "127 1" "1000 1" "1000 64" "1000 128"; do
  set -- $c
  kept=() whole=() same=yes
  for r in $(seq "$rounds"); do
    if [ $((r % 2)) -eq 1 ]; then kept+=("$(run "$1" "$2" true)"); whole+=("$(run "$1" "$2" false)")
    else whole+=("$(run "$1" "$2" false)"); kept+=("$(run "$1" "$2" true)"); fi
    cmp -s "$dir/out_true" "$dir/out_false" || same=no
  done
  row=$(python3 - "$1" "$2" "$same" "$load" "${kept[*]}" "${whole[*]}" <<'PY'
import statistics, sys
tokens, shift, same, load = int(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
k = statistics.median(map(float, sys.argv[5].split()))
w = statistics.median(map(float, sys.argv[6].split()))
# Less the time to load (the 0-token row's), per token.
per = f"{(k - load) * 1e3 / tokens:.2f} / {(w - load) * 1e3 / tokens:.2f}" if tokens else "(load)"
print(f"| {tokens} | {shift} | {k:.3f} | {w:.3f} | {w / k:.1f}x | {per} | {same} | {min(k, w):.4f}")
PY
)
  [ "$1" = 0 ] && load=${row##*| }
  echo "${row% | *} |"
done
