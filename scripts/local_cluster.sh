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

# Free ports: a random start, skipping ports something listens on.
in_use() { ss -Htln 2>/dev/null | awk '{print $4}' | grep -q ":$1\$"; }
ports=()
p=$(( 20000 + RANDOM % 20000 ))
while [ ${#ports[@]} -lt "$n" ]; do
  in_use "$p" || ports+=("$p")
  p=$(( p + 1 ))
done

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
  for i in $(seq 0 $(( n - 1 ))); do
    echo "  { name = \"node$i\", host = \"127.0.0.1\", port = ${ports[$i]}, threads = $threads },"
  done
  echo "]"
} > "$dir/cluster.toml"

extra=()
[ -n "${TROUPE_CHECKPOINT_EVERY:-}" ] && extra+=(--checkpoint-every-steps "$TROUPE_CHECKPOINT_EVERY")
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap cleanup INT TERM
for i in $(seq 1 $(( n - 1 ))); do
  "$trainer" --config "$dir/cluster.toml" --node "node$i" "$@" "${extra[@]}" >> "$dir/node$i.log" 2>&1 &
  pids+=($!)
  echo $! > "$dir/node$i.pid"
done
set +e
"$trainer" --config "$dir/cluster.toml" --node node0 "$@" "${extra[@]}" > >(tee -a "$dir/node0.log") 2>&1 &
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
if [ "$keep" = 1 ]; then echo "local_cluster.sh: the nodes' logs are in $dir" >&2; else rm -rf "$dir"; fi
exit "$status"
