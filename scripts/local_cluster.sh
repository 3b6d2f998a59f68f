#!/usr/bin/env bash
# Starts a troupe job as N node processes on this machine (loopback, free
# ports, a fresh shared secret), waits for them and returns the exit status
# of node 0, which runs the coordinator and writes the log, the metrics
# (--metrics-out, the same JSON Lines as one process) and checkpoints.
#   scripts/local_cluster.sh N [trainer options...]
#   scripts/local_cluster.sh 3 --model mlp --algorithm ddc-asgd --workers 6 --shards 2 --metrics-out run.jsonl
# Environment:
#   TROUPE_TRAINER     the trainer binary (default: build/troupe_trainer next to this script)
#   TROUPE_CLUSTER_DIR where the cluster file, the secret, the nodes' logs and pids go (default: a temporary
#                      directory, removed at the end unless a node failed). A directory that already holds a
#                      cluster.toml of N nodes is used as it is: the same command restarts the same cluster.
#   TROUPE_NODE_THREADS threads per node (default: the machine's cores / N, at least 1)
#   TROUPE_PEER_TIMEOUT seconds of silence after which a node is dead (default 3)
#   TROUPE_CHECKPOINT_EVERY  (optional) also checkpoint every this many steps
#   TROUPE_NODE_ROLES  what each node may host, one word per node: both (default), workers or shards;
#                      e.g. "shards workers": node 0 the parameter shards, node 1 the workers
#   TROUPE_NETNS=1      (root) each node in a network namespace of its own, all joined by veth pairs to a
#                      bridge, so that the traffic crosses a real network stack; TROUPE_NETNS_RATE (e.g. 1gbit)
#                      limits each node's link with tbf, both ways. The namespaces are removed at the end, also when
#                      the script is interrupted (INT, TERM). TROUPE_NETNS_TAG (a number < 10000, default
#                      from the pid) names them: trp<tag>n<i> and trp<tag>br.
# Node i's output goes to DIR/node<i>.log; node 0's is also printed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ $# -lt 1 ] || ! [[ "$1" =~ ^[0-9]+$ ]] || [ "$1" -lt 1 ]; then
  sed -n '2,15p' "$0" >&2
  exit 2
fi
n=$1; shift
trainer=${TROUPE_TRAINER:-$here/../build/troupe_trainer}
[ -x "$trainer" ] || { echo "local_cluster.sh: no trainer at $trainer (build first, or set TROUPE_TRAINER)" >&2; exit 2; }
cores=$(nproc)
threads=${TROUPE_NODE_THREADS:-$(( cores / n > 0 ? cores / n : 1 ))}
keep=0
if [ -n "${TROUPE_CLUSTER_DIR:-}" ]; then dir=$TROUPE_CLUSTER_DIR; mkdir -p "$dir"; keep=1; else dir=$(mktemp -d); fi

# With TROUPE_NETNS: namespaces trp<tag>n<i> at 10.77.<tag % 250>.<i + 1>, a bridge in trp<tag>br.
netns=${TROUPE_NETNS:-0}
tag=${TROUPE_NETNS_TAG:-$(( $$ % 10000 ))}
[[ "$tag" =~ ^[0-9]{1,4}$ ]] || { echo "local_cluster.sh: TROUPE_NETNS_TAG must be a number below 10000" >&2; exit 2; }
subnet=10.77.$(( tag % 250 ))
host_of() { if [ "$netns" = 1 ]; then echo "$subnet.$(( $1 + 1 ))"; else echo 127.0.0.1; fi; }
# Runs in a background subshell: exec, so that its pid is the node's.
run_on() { if [ "$netns" = 1 ]; then exec ip netns exec "trp${tag}n$1" "${@:2}"; else exec "${@:2}"; fi; }
# shellcheck source=scripts/netns.sh
source "$(dirname "$0")/netns.sh"
netns_down() { [ "$netns" = 1 ] || return 0; netns_remove "trp${tag}" "$n"; }
netns_up() { [ "$netns" = 1 ] || return 0; netns_create "trp${tag}" "$n" "$subnet" "${TROUPE_NETNS_RATE:-}"; }
# Whatever happens from here on, the nodes are stopped and the namespaces removed.
pids=()
node0=
cleanup() {
  for pid in "${pids[@]}" $node0; do kill "$pid" 2>/dev/null || true; done
  netns_down
}
interrupted() { echo "local_cluster.sh: interrupted; the nodes' logs are in $dir" >&2; exit "$1"; }
trap cleanup EXIT
trap 'interrupted 130' INT
trap 'interrupted 143' TERM
if [ "$netns" = 1 ]; then
  if ! netns_up; then
    netns_down
    echo "local_cluster.sh: cannot make network namespaces (needs root and ip netns)" >&2
    exit 77
  fi
fi

# Free ports: a random start, skipping ports something listens on.
read -r -a ports <<< "$(free_ports "$n")"

if [ -f "$dir/cluster.toml" ] && [ "$(grep -c 'name = "node' "$dir/cluster.toml")" = "$n" ]; then
  reuse=1
else
  reuse=0
  head -c 32 /dev/urandom > "$dir/secret"
  chmod 600 "$dir/secret"
fi
[ "$reuse" = 1 ] || {
  echo "# written by scripts/local_cluster.sh: $n nodes on loopback"
  echo "[cluster]"
  echo "secret-file = \"$dir/secret\""
  echo "peer-timeout = ${TROUPE_PEER_TIMEOUT:-3}"
  echo "heartbeat = $(awk -v t="${TROUPE_PEER_TIMEOUT:-3}" 'BEGIN { h = t / 6; print (h < 0.5 ? h : 0.5) }')"
  echo "nodes = ["
  read -r -a roles <<< "${TROUPE_NODE_ROLES:-}"
  for i in $(seq 0 $(( n - 1 ))); do
    case "${roles[$i]:-both}" in
      both) role="" ;;
      workers) role=", shards = false" ;;
      shards) role=", workers = false" ;;
      *) echo "local_cluster.sh: TROUPE_NODE_ROLES: '${roles[$i]}' is not both, workers or shards" >&2; exit 2 ;;
    esac
    echo "  { name = \"node$i\", host = \"$(host_of "$i")\", port = ${ports[$i]}, threads = $threads$role },"
  done
  echo "]"
} > "$dir/cluster.toml"

extra=()
[ -n "${TROUPE_CHECKPOINT_EVERY:-}" ] && extra+=(--checkpoint-every-steps "$TROUPE_CHECKPOINT_EVERY")
for i in $(seq 1 $(( n - 1 ))); do
  run_on "$i" "$trainer" --config "$dir/cluster.toml" --node "node$i" "$@" "${extra[@]}" >> "$dir/node$i.log" 2>&1 &
  pids+=($!)
  echo $! > "$dir/node$i.pid"
done
set +e
run_on 0 "$trainer" --config "$dir/cluster.toml" --node node0 "$@" "${extra[@]}" > >(tee -a "$dir/node0.log") 2>&1 &
node0=$!
echo $node0 > "$dir/node0.pid"
wait $node0
status=$?
# The other nodes stop when node 0 has stopped them; a node that does not, within 30 s, is killed.
for pid in "${pids[@]}"; do
  for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then echo "local_cluster.sh: node (pid $pid) did not stop; killed" >&2; kill -9 "$pid"; fi
  wait "$pid"
  s=$?
  [ "$s" -ne 0 ] && [ "$status" -eq 0 ] && { echo "local_cluster.sh: a node ended with status $s (see $dir)" >&2; keep=1; }
done
[ "$status" -ne 0 ] && keep=1
netns_down
if [ "$keep" = 1 ]; then echo "local_cluster.sh: the nodes' logs are in $dir" >&2; else rm -rf "$dir"; fi
exit "$status"
