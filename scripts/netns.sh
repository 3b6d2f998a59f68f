# Network namespaces and ports for processes on one machine; sourced by
# scripts/local_cluster.sh, bench/collective_bench.sh and the cluster, wire
# and Slurm tests (not run alone).

# netns_create PREFIX N SUBNET [RATE]: namespaces PREFIXn0 .. PREFIXn(N-1),
# each joined by a veth pair (PREFIXv<i> inside, PREFIXb<i> on the bridge) to
# a bridge in namespace PREFIXbr, with address SUBNET.(i+1)/24; with RATE
# (tc's units, e.g. 1gbit) a tbf limit on each process's link, both ways as a
# full-duplex NIC's: on its veth's egress (what it sends) and on the bridge
# port's egress towards it (what it receives: N - 1 senders to one node share
# its rate, as on a switch). Returns 1 at the first step that fails (root and
# iproute2 are needed).
netns_create() {
  local p=$1 n=$2 subnet=$3 rate=${4:-} i ns
  ip netns add "${p}br" && ip -n "${p}br" link add br0 type bridge && ip -n "${p}br" link set br0 up || return 1
  for i in $(seq 0 $(( n - 1 ))); do
    ns=${p}n$i
    ip netns add "$ns" &&
      ip link add "${p}v$i" type veth peer name "${p}b$i" &&
      ip link set "${p}v$i" netns "$ns" && ip link set "${p}b$i" netns "${p}br" &&
      ip -n "${p}br" link set "${p}b$i" master br0 && ip -n "${p}br" link set "${p}b$i" up &&
      ip -n "$ns" addr add "$subnet.$(( i + 1 ))/24" dev "${p}v$i" && ip -n "$ns" link set "${p}v$i" up &&
      ip -n "$ns" link set lo up || return 1
    if [ -n "$rate" ]; then
      ip netns exec "$ns" tc qdisc replace dev "${p}v$i" root tbf rate "$rate" burst 256kb latency 50ms &&
        ip netns exec "${p}br" tc qdisc replace dev "${p}b$i" root tbf rate "$rate" burst 256kb latency 50ms || return 1
    fi
  done
}

# netns_remove PREFIX N: what netns_create made (the veth pairs go with their namespaces); never fails.
netns_remove() {
  local p=$1 n=$2 i
  for i in $(seq 0 $(( n - 1 ))); do ip netns del "${p}n$i" 2>/dev/null || true; done
  ip netns del "${p}br" 2>/dev/null || true
}

# Ports to listen on are drawn below the kernel's ephemeral range
# (ip_local_port_range), which outgoing connections take theirs from: a port
# drawn there could be taken by another process's connection before it is bound.
port_in_use() { ss -Htln 2>/dev/null | awk '{print $4}' | grep -q ":$1\$"; }
ephemeral_start() { awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768; }
# A random port from 20000 up that leaves room for N below the ephemeral range.
random_port() { local top; top=$(ephemeral_start); echo $(( 20000 + RANDOM % (top - 20000 - $1) )); }
# free_ports N: N TCP ports nothing listens on, from a random start.
free_ports() {
  local want=$1 p got=()
  p=$(random_port "$want")
  while [ ${#got[@]} -lt "$want" ]; do port_in_use "$p" || got+=("$p"); p=$(( p + 1 )); done
  echo "${got[@]}"
}
# free_port_run N: the first of N consecutive TCP ports nothing listens on.
free_port_run() {
  local want=$1 p i busy
  p=$(random_port "$want")
  while :; do
    busy=0
    for i in $(seq 0 $(( want - 1 ))); do if port_in_use $(( p + i )); then busy=1; break; fi; done
    [ "$busy" = 0 ] && { echo "$p"; return 0; }
    p=$(( p + want ))
    [ $(( p + want )) -lt "$(ephemeral_start)" ] || p=20000
  done
}
