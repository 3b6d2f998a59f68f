#!/usr/bin/env bash
# Multi-process tests of a cluster on this machine (scripts/local_cluster.sh,
# loopback, Fashion-MNIST). One scenario per call:
#   cluster.sh BUILD_DIR three_nodes | pipeline | hybrid | faults | kill_worker | sigstop_worker | kill_shard | rejoin | netns | other_job
set -euo pipefail
build=$1 scenario=$2
here=$(cd "$(dirname "$0")" && pwd)
cluster=$here/../../scripts/local_cluster.sh
export TROUPE_TRAINER=$build/troupe_trainer
tmp=$(mktemp -d); trap 'kill $(cat "$tmp"/c/node*.pid 2>/dev/null) 2>/dev/null || true; rm -rf "$tmp"' EXIT
mlp=(--model mlp --progress none)

accuracy() { grep -o '"test_accuracy":[0-9.]*' "$1" | tail -1 | cut -d: -f2; }
fail() { echo "FAILED: $*"; for f in "$tmp"/c/node*.log; do [ -f "$f" ] && { echo "== $f"; tail -n 20 "$f"; }; done; exit 1; }
# Waits (at most $2 s) until file $1 holds $3.
wait_for() { for _ in $(seq 1 $(( $2 * 10 ))); do grep -q "$3" "$1" 2>/dev/null && return 0; sleep 0.1; done; return 1; }
# Runs "${job[@]}" in one process and on $1 nodes (metrics in $tmp/one.jsonl and $tmp/nodes.jsonl); fails
# unless their final accuracies are within $2; sets `one` and `nodes` to them.
one_and_nodes() {
  "$build/troupe_trainer" "${job[@]}" --metrics-out "$tmp/one.jsonl" 2> "$tmp/one.log" || fail "one process"
  TROUPE_CLUSTER_DIR=$tmp/c "$cluster" "$1" "${job[@]}" --metrics-out "$tmp/nodes.jsonl" || fail "$1 nodes"
  one=$(accuracy "$tmp/one.jsonl"); nodes=$(accuracy "$tmp/nodes.jsonl")
  echo "accuracy: one process $one, $1 nodes $nodes"
  close "$one" "$nodes" "$2" || fail "accuracies differ by more than $2"
}
close() { awk -v a="$1" -v b="$2" -v d="$3" 'BEGIN { x = a - b; if (x < 0) x = -x; exit !(x <= d) }'; }

case "$scenario" in
three_nodes)
  # The same job in one process and on three: the same accuracy band.
  job=("${mlp[@]}" --algorithm asgd --workers 3 --shards 2 --epochs 1)
  one_and_nodes 3 0.015
  close "$nodes" 0.83 0.02 || fail "three nodes: accuracy $nodes outside [0.81, 0.85]"
  grep -q '"workers":3' "$tmp/nodes.jsonl" || fail "the metrics record"
  ;;
pipeline)
  # Two pipeline stages on two nodes: activations and gradients cross the link; GPipe gives the one-process
  # pipeline's accuracy (the same arithmetic), and the snapshot gathers both stages' parameters.
  job=("${mlp[@]}" --pipeline-stages 2 --micro-batches 4 --epochs 1 --max-steps 300)
  one_and_nodes 2 0.003
  grep -q "stage 0 on node 0" "$tmp/c/node0.log" && grep -q "stage 1 on node 1" "$tmp/c/node0.log" ||
    fail "the stages are not on two nodes"
  grep -q '"pipeline_stages":2' "$tmp/nodes.jsonl" || fail "the metrics record"
  ;;
hybrid)
  # Two replicas of a 2-stage pipeline, stage k of each on node k with shard k: pushes, parameters,
  # activations and gradients cross the link; the accuracy band of the same job in one process.
  # 600 steps: at 300 the accuracy still climbs fast and two runs on a loaded machine differed by 1.5 points.
  job=("${mlp[@]}" --algorithm asgd --workers 2 --pipeline-stages 2 --micro-batches 4 --epochs 1 --max-steps 600)
  one_and_nodes 2 0.02
  grep -q "2 replica(s) of a pipeline (asgd on 2 shard(s)" "$tmp/c/node0.log" || fail "not a hybrid"
  grep -q "stage 2 on node 0" "$tmp/c/node0.log" && grep -q "stage 3 on node 1" "$tmp/c/node0.log" ||
    fail "the second replica's stages are not on the two nodes"
  grep -q '"workers_summary":\[{"worker":0,.*{"worker":1,' "$tmp/nodes.jsonl" || fail "the replicas' summary"
  ;;
faults)
  # Lost, delayed, duplicated frames and dropped links at 2 % each: the job still trains.
  TROUPE_FAULT_DROP=0.02 TROUPE_FAULT_DELAY=0.02 TROUPE_FAULT_DUPLICATE=0.02 TROUPE_FAULT_DISCONNECT=0.005 \
    TROUPE_CLUSTER_DIR=$tmp/c "$cluster" 3 "${mlp[@]}" --algorithm asgd --workers 3 --shards 2 --epochs 1 \
    --metrics-out "$tmp/m.jsonl" || fail "the job with faults"
  acc=$(accuracy "$tmp/m.jsonl"); echo "accuracy with faults: $acc"
  close "$acc" 0.83 0.02 || fail "accuracy $acc outside [0.81, 0.85]"
  ;;
kill_worker)
  # A worker node killed mid-run: the job finishes without it, within a point of the run without the fault.
  job=("${mlp[@]}" --algorithm asgd --workers 3 --shards 1 --epochs 6)
  TROUPE_PEER_TIMEOUT=1.5 TROUPE_CLUSTER_DIR=$tmp/ref "$cluster" 3 "${job[@]}" --metrics-out "$tmp/ref.jsonl" > /dev/null ||
    fail "the run without the fault"
  TROUPE_PEER_TIMEOUT=1.5 TROUPE_CLUSTER_DIR=$tmp/c "$cluster" 3 "${job[@]}" --metrics-out "$tmp/m.jsonl" &
  runner=$!
  wait_for "$tmp/c/node0.log" 60 "epoch 1/6" || fail "no first epoch"
  kill -9 "$(cat "$tmp/c/node2.pid")"
  wait $runner || fail "the job did not finish after node2 was killed"
  grep -q "node node2 was lost" "$tmp/c/node0.log" || fail "the coordinator did not record the loss"
  grep -q '"lost_workers":1' "$tmp/m.jsonl" || fail "the metrics do not record the lost worker"
  ref=$(accuracy "$tmp/ref.jsonl"); got=$(accuracy "$tmp/m.jsonl")
  echo "accuracy: no fault $ref, a worker node killed $got"
  close "$ref" "$got" 0.01 || fail "more than a point from the run without the fault"
  ;;
sigstop_worker)
  # A frozen worker node is declared dead within the peer timeout + 1 s.
  TROUPE_PEER_TIMEOUT=1.5 TROUPE_CLUSTER_DIR=$tmp/c "$cluster" 3 "${mlp[@]}" --algorithm asgd --workers 3 --shards 1 \
    --epochs 8 --metrics-out "$tmp/m.jsonl" > /dev/null &
  runner=$!
  wait_for "$tmp/c/node2.log" 60 "joined the run" || fail "node2 did not join"
  sleep 0.5
  victim=$(cat "$tmp/c/node2.pid")
  kill -STOP "$victim"
  t0=$(date +%s.%N)
  wait_for "$tmp/c/node0.log" 10 "node node2 was lost" || fail "the frozen node was not declared dead within 10 s"
  t1=$(date +%s.%N)
  kill -9 "$victim"
  wait $runner || fail "the job did not finish"
  took=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
  echo "frozen node declared dead after $took s (peer timeout 1.5 s)"
  awk -v t="$took" 'BEGIN { exit !(t <= 2.5) }' || fail "declared dead after $took s, more than the timeout + 1 s"
  ;;
kill_shard)
  # A shard's node killed: a clear error naming it and the checkpoint; the same
  # command resumes, every shard's version and rule state restored bit for bit.
  job=("${mlp[@]}" --algorithm ddc-asgd --workers 3 --shards 2 --epochs 6 --checkpoint "$tmp/run.ckpt"
       --checkpoint-every-steps 40 --metrics-out "$tmp/m.jsonl")
  TROUPE_PEER_TIMEOUT=1.5 TROUPE_CLUSTER_DIR=$tmp/c "$cluster" 3 "${job[@]}" > /dev/null 2>&1 &
  runner=$!
  wait_for "$tmp/c/node1.log" 60 "joined the run" || fail "node1 did not join"
  for _ in $(seq 1 100); do [ -f "$tmp/run.ckpt" ] && break; sleep 0.1; done
  [ -f "$tmp/run.ckpt" ] || fail "no checkpoint within 10 s"
  sleep 0.5
  kill -9 "$(cat "$tmp/c/node1.pid")"
  if wait $runner; then fail "the job went on without a shard"; fi
  grep -q "node node1 was lost.*parameter shard(s) 1.*resume from the last checkpoint, $tmp/run.ckpt" "$tmp/c/node0.log" ||
    fail "the error does not name the node, its shard and the checkpoint"
  "$build/troupe_checkpoint" "$tmp/run.ckpt" > "$tmp/before.txt" || fail "the checkpoint cannot be read"
  cat "$tmp/before.txt"
  rm -f "$tmp"/c/node*.pid
  TROUPE_PEER_TIMEOUT=1.5 TROUPE_CLUSTER_DIR=$tmp/c "$cluster" 3 "${job[@]}" > /dev/null 2>&1 || fail "the resumed job failed"
  for s in 0 1; do
    want=$(grep "^shard $s:" "$tmp/before.txt" | sed 's/^shard [0-9]*: version /version /')
    grep -q "shard $s: resumed at $want" "$tmp"/c/node*.log || fail "shard $s was not restored to '$want'"
    echo "shard $s resumed at $want"
  done
  grep -q '"epoch":6' "$tmp/m.jsonl" || fail "the resumed job did not finish"
  ;;
netns)
  # The three-node job with each node in a network namespace of its own, joined by veth pairs through a
  # bridge (1 Gbit/s each, tbf): the traffic crosses a real network stack. Skipped where ip netns is not allowed.
  if ! { [ "$(id -u)" = 0 ] && ip netns add "trp_probe$$" 2>/dev/null && ip netns del "trp_probe$$"; }; then
    echo "skipped: network namespaces need root and ip netns (iproute2)"; exit 77
  fi
  TROUPE_NETNS=1 TROUPE_NETNS_RATE=1gbit TROUPE_CLUSTER_DIR=$tmp/c "$cluster" 3 "${mlp[@]}" --algorithm asgd \
    --workers 3 --shards 2 --epochs 1 --metrics-out "$tmp/m.jsonl" || fail "the job across namespaces"
  grep -q 'host = "10.77.' "$tmp/c/cluster.toml" || fail "the nodes were not in namespaces"
  acc=$(accuracy "$tmp/m.jsonl"); echo "accuracy across namespaces: $acc"
  close "$acc" 0.83 0.02 || fail "accuracy $acc outside [0.81, 0.85]"
  ;;
other_job)
  # Two nodes of different jobs (another epoch count) refuse each other; the coordinator's node names
  # the node that did not join when the join timeout ends.
  head -c 32 /dev/urandom > "$tmp/secret"; chmod 600 "$tmp/secret"
  p=$(( 30000 + RANDOM % 20000 ))
  printf '[cluster]\nsecret-file = "%s"\njoin-timeout = 4\nnodes = [{ name = "a", port = %d }, { name = "b", port = %d }]\n' \
    "$tmp/secret" "$p" $(( p + 1 )) > "$tmp/cluster.toml"
  job=("${mlp[@]}" --algorithm asgd --workers 2 --max-steps 50)
  "$TROUPE_TRAINER" --config "$tmp/cluster.toml" --node b "${job[@]}" --epochs 2 > "$tmp/b.log" 2>&1 &
  other=$!
  if "$TROUPE_TRAINER" --config "$tmp/cluster.toml" --node a "${job[@]}" --epochs 1 > "$tmp/a.log" 2>&1; then
    fail "nodes of two jobs trained together"
  fi
  wait $other && fail "node b of the other job did not fail"
  cat "$tmp/a.log"
  grep -q "refused" "$tmp/a.log" "$tmp/b.log" || fail "no refusal logged"
  grep -qi "another job\|job" "$tmp/a.log" "$tmp/b.log" || fail "the refusal does not say the jobs differ"
  grep -q "node(s) b did not join within" "$tmp/a.log" || fail "the error does not name the missing node"
  ;;
rejoin)
  # A killed worker node started again with the same command joins the running job.
  TROUPE_PEER_TIMEOUT=1 TROUPE_CLUSTER_DIR=$tmp/c "$cluster" 3 "${mlp[@]}" --algorithm asgd --workers 3 --shards 1 \
    --epochs 10 --metrics-out "$tmp/m.jsonl" > /dev/null 2>&1 &
  runner=$!
  wait_for "$tmp/c/node0.log" 60 "epoch 1/10" || fail "no first epoch"
  kill -9 "$(cat "$tmp/c/node2.pid")"
  wait_for "$tmp/c/node0.log" 10 "node node2 was lost" || fail "the loss was not seen"
  "$TROUPE_TRAINER" --config "$tmp/c/cluster.toml" --node node2 "${mlp[@]}" --algorithm asgd --workers 3 --shards 1 \
    --epochs 10 --metrics-out "$tmp/m.jsonl" >> "$tmp/c/node2.log" 2>&1 &
  again=$!
  wait_for "$tmp/c/node0.log" 30 "node node2 joined again" || fail "node2 did not join again"
  wait $runner || true  # local_cluster.sh reports the killed first node2
  wait $again || fail "the restarted node2 did not end cleanly"
  grep -q '"epoch":10' "$tmp/m.jsonl" || fail "the job did not finish"
  grep '"epoch":' "$tmp/m.jsonl" | tail -n 1 | grep -q '"lost_workers":0' || fail "the last epoch still counts node2's worker as lost"
  ;;
*) echo "unknown scenario $scenario"; exit 2 ;;
esac
echo "ok: $scenario"
