#!/usr/bin/env bash
# The link cost a * bytes + b between two processes on this machine, fitted
# by least squares (model::fit_link, as Baechi fits its communication cost)
# to troupe_transfer_bench's measurements: the one-way time of a 152-byte frame
# (half the io-thread round trip) and the time per message of 1, 16 and 100 MiB
# transfers. Prints the points and the --link-cost value for the placer.
#   bench/fit_link.sh [BUILD_DIR] [HOST]     (default build/, 127.0.0.1: loopback)
set -euo pipefail
build=${1:-build} host=${2:-127.0.0.1}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$build/bench/troupe_transfer_bench" --reps "${REPS:-5}" --sizes 1M,16M,100M --pings "${PINGS:-2000}" --host "$host" \
  > "$tmp/out.txt"
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
