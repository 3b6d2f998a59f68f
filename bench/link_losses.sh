#!/usr/bin/env bash
# troupe's ring allreduce and Gloo's, two processes in network namespaces whose
# links tbf limits to RATE (both ways, as scripts/netns.sh makes them), one after
# the other on the same links; after each, the TCP segments each process sent and
# retransmitted (nstat) and the packets each link's tbf dropped (tc -s): whether
# either side loses time to drops. Root only.
#   bench/link_losses.sh [BUILD_DIR] [RATE] [SIZE]
#   bench/link_losses.sh build 1gbit 64M
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build} rate=${2:-200mbit} size=${3:-64M}
bench=$build/bench/troupe_collective_bench
[ "$(id -u)" = 0 ] || { echo "link_losses.sh: network namespaces need root" >&2; exit 2; }
[ -x "$bench" ] || { echo "link_losses.sh: $bench not built" >&2; exit 2; }
# shellcheck source=scripts/netns.sh
source scripts/netns.sh
tag=$(( $$ % 10000 )) p=ll$(( $$ % 10000 )) subnet=10.79.$(( $$ % 250 ))
work=$(mktemp -d)
netns_create "$p" 2 "$subnet" "$rate" || { echo "link_losses.sh: cannot make network namespaces" >&2; exit 1; }
trap 'netns_remove "$p" 2; rm -rf "$work"' EXIT
head -c 32 /dev/urandom > "$work/secret"
chmod 600 "$work/secret"
fresh() {  # zero the counters: the namespaces' TCP statistics, the links' qdiscs
  for i in 0 1; do
    ip netns exec "${p}n$i" nstat -n > /dev/null
    ip netns exec "${p}n$i" tc qdisc replace dev "${p}v$i" root tbf rate "$rate" burst 256kb latency 50ms
    ip netns exec "${p}br" tc qdisc replace dev "${p}b$i" root tbf rate "$rate" burst 256kb latency 50ms
  done
}
counters() {  # LABEL
  for i in 0 1; do
    echo "$1, process $i: $(ip netns exec "${p}n$i" nstat -az TcpOutSegs TcpRetransSegs | awk 'NR > 1 { printf "%s %s, ", $1, $2 }')" \
         "its link's tbf $(ip netns exec "${p}n$i" tc -s qdisc show dev "${p}v$i" | grep -o 'dropped [0-9]*'), the way in" \
         "$(ip netns exec "${p}br" tc -s qdisc show dev "${p}b$i" | grep -o 'dropped [0-9]*')"
  done
}
nodes=$subnet.1:29500,$subnet.2:29500 gnodes=$subnet.1:29600,$subnet.2:29600
echo "RATE $rate, SIZE $size, N = 2; rows: link | N | operation | piece | size | iterations | median ms | min | max | algbw MB/s | busbw MB/s"
fresh
opts=(--sizes "$size" --algorithms ring --target-s 2 --min-iters 3 --max-iters 10 --warmup 1)
ip netns exec "${p}n1" "$bench" --rank 1 --nodes "$nodes" --secret-file "$work/secret" "${opts[@]}" > "$work/t1.log" 2>&1 &
ip netns exec "${p}n0" "$bench" --rank 0 --nodes "$nodes" --secret-file "$work/secret" --label "$rate" "${opts[@]}" 2> "$work/t0.log" | grep ring
wait
counters troupe
fresh
gopts=(--sizes "$size" --target-s 2 --min-iters 3 --max-iters 10 --warmup 1 --label "$rate")
ip netns exec "${p}n1" env GLOO_SOCKET_IFNAME="${p}v1" MALLOC_MMAP_THRESHOLD_=1000000000 MALLOC_TRIM_THRESHOLD_=1000000000 \
  /usr/bin/python3 bench/gloo_bench.py --rank 1 --nodes "$gnodes" "${gopts[@]}" > "$work/g1.log" 2>&1 &
ip netns exec "${p}n0" env GLOO_SOCKET_IFNAME="${p}v0" MALLOC_MMAP_THRESHOLD_=1000000000 MALLOC_TRIM_THRESHOLD_=1000000000 \
  /usr/bin/python3 bench/gloo_bench.py --rank 0 --nodes "$gnodes" "${gopts[@]}" 2> "$work/g0.log" | grep gloo
wait
counters gloo
