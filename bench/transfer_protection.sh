#!/usr/bin/env bash
# What frame protection costs: troupe_transfer_bench of an unprotected
# transport (built from commit BASE, before frames were sealed) against this
# tree's, authenticated and encrypted, interleaved in one invocation. Each
# binary also measures a raw Asio socket pair in the same repetitions, so the
# ratio troupe/raw of each side is the figure to compare on a machine whose
# speed drifts.
#   bench/transfer_protection.sh [BUILD_DIR]      (default build/)
# Environment: BASE (default ab52826, the commit before), ROUNDS (3), REPS (5), SIZES (1M,16M,100M),
#   RATE (e.g. 1gbit; root): the receiver in a network namespace behind a veth pair, each end limited by tbf
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
ns=trpprot$$
cleanup() {
  git worktree remove --force "$work/src" >/dev/null 2>&1 || true
  rm -rf "$work"
  [ -z "${RATE:-}" ] || ip netns del "$ns" 2>/dev/null || true
}
trap cleanup EXIT
git worktree add --detach "$work/src" "$base" >/dev/null 2>&1
cmake -S "$work/src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTROUPE_TESTS=OFF -DTROUPE_SAMPLES=OFF \
  > "$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" -j2 --target troupe_transfer_bench > "$work/build.log" 2>&1 || { tail -20 "$work/build.log"; exit 1; }
before=$work/build/bench/troupe_transfer_bench
where=()
if [ -n "${RATE:-}" ]; then
  ip netns add "$ns" && ip link add "${ns}a" type veth peer name "${ns}b" && ip link set "${ns}b" netns "$ns" &&
    ip addr add 10.214.0.1/24 dev "${ns}a" && ip link set "${ns}a" up &&
    ip -n "$ns" addr add 10.214.0.2/24 dev "${ns}b" && ip -n "$ns" link set "${ns}b" up && ip -n "$ns" link set lo up &&
    tc qdisc replace dev "${ns}a" root tbf rate "$RATE" burst 256kb latency 50ms &&
    ip netns exec "$ns" tc qdisc replace dev "${ns}b" root tbf rate "$RATE" burst 256kb latency 50ms ||
    { echo "transfer_protection: cannot make the network namespace (needs root and ip netns)" >&2; exit 77; }
  where=(--host 10.214.0.2 --sender-host 10.214.0.1 --receiver-netns "$ns")
  echo "link: veth pair, tbf $RATE each way"
fi
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name:\s*//p' | head -n 1), cpu family $(lscpu | sed -n 's/^CPU family:\s*//p')"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ), base $base, this tree $(git rev-parse --short HEAD)"
for r in $(seq 1 "$rounds"); do
  for side in unprotected authenticated encrypted; do
    case $side in
      unprotected) out=$("$before" --reps "$reps" --sizes "$sizes" --pings 200 "${where[@]}") ;;
      authenticated) out=$("$after" --reps "$reps" --sizes "$sizes" --pings 200 "${where[@]}") ;;
      encrypted) out=$("$after" --reps "$reps" --sizes "$sizes" --pings 200 --encrypt "${where[@]}") ;;
    esac
    echo "$out" | awk -v r="$r" -v s="$side" '/^[0-9]+ [MK]iB/ { printf "round %s %-13s %-7s %-4s raw %5s GiB/s troupe %5s GiB/s troupe/raw %s\n", r, s, $1, $2, $4, $5, $6 }'
  done
done
