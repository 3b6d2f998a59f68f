#!/usr/bin/env bash
# Two builds of troupe_collective_bench taking turns on loopback (a before/after
# comparison of one change): ROUNDS rounds, each running the ring allreduce of
# N ranks at SIZES with binary A, then with binary B; prints one line per
# round, binary and size: "round binary size busbw_MB/s" (rank 0's).
#   bench/collective_ab.sh A B [N] [SIZES]
#   ROUNDS=5 bench/collective_ab.sh /tmp/before/troupe_collective_bench build/bench/troupe_collective_bench 2 1M,16M,64M
# Environment: ROUNDS (3), TARGET_S (1: the timed iterations of a point take
# about this long), MIN_ITERS (5).
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,9p' "$0" >&2; exit 2; }
a=$1 b=$2 n=${3:-2} sizes=${4:-1M,16M,64M}
for bin in "$a" "$b"; do [ -x "$bin" ] || { echo "collective_ab.sh: $bin is not an executable" >&2; exit 2; }; done
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/secret"; chmod 600 "$work/secret"
for r in $(seq 1 "${ROUNDS:-3}"); do
  for bin in "$a" "$b"; do
    p0=$((20000 + RANDOM % 20000)) nodes=""
    for i in $(seq 0 $((n - 1))); do nodes+="${nodes:+,}127.0.0.1:$((p0 + i))"; done
    opts=(--nodes "$nodes" --secret-file "$work/secret" --sizes "$sizes" --algorithms ring
          --target-s "${TARGET_S:-1}" --min-iters "${MIN_ITERS:-5}")
    for i in $(seq $((n - 1)) -1 1); do "$bin" --rank "$i" "${opts[@]}" > /dev/null 2>&1 & done
    "$bin" --rank 0 "${opts[@]}" 2> /dev/null | grep "allreduce ring" |
      awk -F'|' -v b="$bin" -v r="$r" '{ gsub(/ /, "", $6); gsub(/ /, "", $12); print r, b, $6, $12 }'
    wait
  done
done
