#!/usr/bin/env bash
# What frame protection costs: troupe_transfer_bench of an unprotected
# transport (built from commit BASE, before frames were sealed) against this
# tree's, authenticated and encrypted, interleaved in one invocation. Each
# binary also measures a raw Asio socket pair in the same repetitions, so the
# ratio troupe/raw of each side is the figure to compare on a machine whose
# speed drifts.
#   bench/transfer_protection.sh [BUILD_DIR]      (default build/)
# Environment: BASE (default ab52826, the commit before), ROUNDS (3), REPS (5), SIZES (1M,16M,100M)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
base=${BASE:-ab52826}
rounds=${ROUNDS:-3}
reps=${REPS:-5}
sizes=${SIZES:-1M,16M,100M}
after=$build/bench/troupe_transfer_bench
[ -x "$after" ] || { echo "transfer_protection: $after not built (cmake --build $build)" >&2; exit 1; }
work=$(mktemp -d)
cleanup() { git worktree remove --force "$work/src" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
git worktree add --detach "$work/src" "$base" >/dev/null 2>&1
cmake -S "$work/src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTROUPE_TESTS=OFF -DTROUPE_SAMPLES=OFF \
  > "$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" -j2 --target troupe_transfer_bench > "$work/build.log" 2>&1 || { tail -20 "$work/build.log"; exit 1; }
before=$work/build/bench/troupe_transfer_bench
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name:\s*//p' | head -n 1), cpu family $(lscpu | sed -n 's/^CPU family:\s*//p')"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ), base $base, this tree $(git rev-parse --short HEAD)"
for r in $(seq 1 "$rounds"); do
  for side in unprotected authenticated encrypted; do
    case $side in
      unprotected) out=$("$before" --reps "$reps" --sizes "$sizes" --pings 200) ;;
      authenticated) out=$("$after" --reps "$reps" --sizes "$sizes" --pings 200) ;;
      encrypted) out=$("$after" --reps "$reps" --sizes "$sizes" --pings 200 --encrypt) ;;
    esac
    echo "$out" | awk -v r="$r" -v s="$side" '/^[0-9]+ [MK]iB/ { printf "round %s %-13s %-7s %-4s raw %5s GiB/s troupe %5s GiB/s troupe/raw %s\n", r, s, $1, $2, $4, $5, $6 }'
  done
done
