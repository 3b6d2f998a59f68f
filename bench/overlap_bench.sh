#!/usr/bin/env bash
# Pipelined data-parallel execution against linear execution (--overlap
# false), same job, same slowed links, in the same invocation. Pipelined in
# two forms: the sending side only (--overlap true --overlap-receive false:
# each parameter shard's gradients go out while backward goes on) and both
# sides (--overlap true, P3: also the next forward pass runs each shard's
# layers as soon as its weights arrive, the first layers' messages first):
# two nodes in network namespaces (scripts/local_cluster.sh, TROUPE_NETNS=1),
# node 0 the parameter shards, node 1 the worker, each node's link limited by
# tbf to RATE. Per repetition each mode once, in turn; medians of samples/s and
# of the worker's compute utilization (forward + backward over the run's
# window, from its trace: bench/trace_stats.py).
# SHARD_NODES=2: each of the 2 shards on a node of its own (3 nodes): the
# shards' replies then come over separate links.
#   bench/overlap_bench.sh [MODEL] [STEPS] [REPS] [RATES...]     (root)
#   bench/overlap_bench.sh cnn 150 3 1gbit 400mbit 200mbit
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
model=${1:-cnn} steps=${2:-150} reps=${3:-3}
shift $(( $# < 3 ? $# : 3 ))
rates=("$@")
[ ${#rates[@]} -gt 0 ] || rates=(1gbit 400mbit 200mbit)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
shard_nodes=${SHARD_NODES:-1}
case $shard_nodes in
  1) roles="shards workers" ;;
  2) roles="shards shards workers" ;;
  *) echo "overlap_bench.sh: SHARD_NODES must be 1 or 2" >&2; exit 2 ;;
esac
nodes=$(( shard_nodes + 1 ))
export TROUPE_NETNS=1 TROUPE_NODE_ROLES="$roles" TROUPE_NODE_THREADS=${TROUPE_NODE_THREADS:-2}
job=(--model "$model" --algorithm asgd --workers 1 --shards 2 --epochs 1 --max-steps "$steps" --evaluate false
     --progress none)
rate_of() { grep -o '"samples_per_s":[0-9.]*' "$1" | cut -d: -f2; }
util_of() {
  python3 "$here/trace_stats.py" "$1" --only worker --json "$1.stats" > /dev/null
  python3 - "$1" "$1.stats" <<'PY'
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X"]
names = {}
busy = sum(e["dur"] for e in ev if e["name"] in ("forward", "backward"))
st = json.load(open(sys.argv[2]))
print(f"{busy / 1000 / st['window_ms']:.3f}")
PY
}
echo "| rate | mode | samples/s (median of $reps) | worker compute utilization | runs (samples/s) |"
echo "|---|---|---|---|---|"
declare -A flags=([full]="--overlap true --overlap-receive true" [push]="--overlap true --overlap-receive false"
                  [linear]="--overlap false")
modes=(full push linear)
for rate in "${rates[@]}"; do
  declare -A sps=() util=()
  for r in $(seq 1 "$reps"); do
    for mode in "${modes[@]}"; do
      t=$tmp/$rate.$mode.$r
      # shellcheck disable=SC2086
      TROUPE_NETNS_RATE=$rate "$here/../scripts/local_cluster.sh" "$nodes" "${job[@]}" ${flags[$mode]} \
        --metrics-out "$t.jsonl" --trace "$t.trace" > "$t.log" 2>&1 || { cat "$t.log" >&2; exit 1; }
      sps[$mode]+="$(rate_of "$t.jsonl") "
      util[$mode]+="$(util_of "$t.trace.node$shard_nodes") "
    done
  done
  for mode in "${modes[@]}"; do
    python3 - "$rate" "$mode" "${sps[$mode]}" "${util[$mode]}" <<'PY'
import statistics, sys
rate, mode, s, u = sys.argv[1], sys.argv[2], [float(x) for x in sys.argv[3].split()], [float(x) for x in sys.argv[4].split()]
name = {"full": "pipelined, both sides (--overlap true)",
        "push": "pipelined, sending side (--overlap-receive false)",
        "linear": "linear (--overlap false)"}[mode]
print(f"| {rate} | {name} | {statistics.median(s):.0f} | {statistics.median(u):.2f} | {' '.join(f'{x:.0f}' for x in s)} |")
PY
  done
done
