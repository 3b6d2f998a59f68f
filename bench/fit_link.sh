#!/usr/bin/env bash
# The link cost a * bytes + b between two processes on this machine, fitted
# by least squares (model::fit_link, as Baechi fits its communication cost)
# to troupe_transfer_bench's measurements: the one-way time of a 152-byte frame
# (half the io-thread round trip) and the time per message of 1, 16 and 100 MiB
# transfers. Prints the points and the --link-cost value for the placer.
#   bench/fit_link.sh [BUILD_DIR] [HOST]        (default build/, 127.0.0.1: loopback)
#   bench/fit_link.sh [BUILD_DIR] veth [RATE]   (root: the receiver in a network namespace
#                                                behind a veth pair, each end limited by tbf
#                                                to RATE when given, e.g. 1gbit)
set -euo pipefail
build=${1:-build} host=${2:-127.0.0.1} rate=${3:-}
tmp=$(mktemp -d)
ns=trpfit$$
extra=()
veth=0; [ "$host" = veth ] && veth=1
cleanup() { rm -rf "$tmp"; [ "$veth" = 1 ] && ip netns del "$ns" 2>/dev/null; true; }
trap cleanup EXIT
if [ "$veth" = 1 ]; then
  # The sender stays here (10.213.0.1), the receiver joins $ns (10.213.0.2).
  ip netns add "$ns" && ip link add "${ns}a" type veth peer name "${ns}b" && ip link set "${ns}b" netns "$ns" &&
    ip addr add 10.213.0.1/24 dev "${ns}a" && ip link set "${ns}a" up &&
    ip -n "$ns" addr add 10.213.0.2/24 dev "${ns}b" && ip -n "$ns" link set "${ns}b" up && ip -n "$ns" link set lo up ||
    { echo "fit_link.sh: cannot make the network namespace (needs root and ip netns)" >&2; exit 77; }
  if [ -n "$rate" ]; then
    tc qdisc replace dev "${ns}a" root tbf rate "$rate" burst 256kb latency 50ms
    ip netns exec "$ns" tc qdisc replace dev "${ns}b" root tbf rate "$rate" burst 256kb latency 50ms
  fi
  extra=(--sender-host 10.213.0.1 --receiver-netns "$ns")
  host=10.213.0.2
fi
"$build/bench/troupe_transfer_bench" --reps "${REPS:-5}" --sizes 1M,16M,100M --pings "${PINGS:-2000}" --host "$host" \
  "${extra[@]}" > "$tmp/out.txt"
cat "$tmp/out.txt" >&2
awk '
  function bytes(n, u) { return n * (u == "KiB" ? 1024 : u == "MiB" ? 1048576 : 1) }
  /^[0-9]+ (KiB|MiB) / { b = bytes($1, $2); printf "%d %.9g\n", b, b / ($5 * 1073741824) }
  /troupe, io thread to io thread/ { printf "152 %.9g\n", $7 / 2 * 1e-6 }
' "$tmp/out.txt" > "$tmp/points.txt"
echo "points (bytes seconds):"; cat "$tmp/points.txt"
read -r a b < <("$build/bench/troupe_placement_study" --fit-link "$tmp/points.txt")
echo "fitted: a = $a s/byte ($(awk -v a="$a" 'BEGIN { printf "%.2f", 1 / a / 1073741824 }') GiB/s), b = $b s per message"
echo "--link-cost $a,$b"
