#!/usr/bin/env bash
# Two nodes on loopback with encrypted frames (`encrypt = true`), while a
# stranger connects to node a and writes junk: the job trains, node a's log
# names the refused connection, and the metrics count it by reason.
#   wire.sh BUILD_DIR
set -euo pipefail
build=$1
trainer=$build/troupe_trainer
# shellcheck source=scripts/netns.sh
source "$(cd "$(dirname "$0")" && pwd)/../../scripts/netns.sh"  # free_port_run
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAILED: $*"; for f in "$tmp"/*.log; do echo "== $f"; tail -n 20 "$f"; done; exit 1; }

head -c 32 /dev/urandom > "$tmp/secret"; chmod 600 "$tmp/secret"
p=$(free_port_run 2)
printf '[cluster]\nsecret-file = "%s"\njoin-timeout = 30\nencrypt = true\nnodes = [{ name = "a", port = %d }, { name = "b", port = %d }]\n' \
  "$tmp/secret" "$p" $(( p + 1 )) > "$tmp/cluster.toml"
job=(--model mlp --progress none --algorithm asgd --workers 2 --epochs 1 --max-steps 300 --metrics-out "$tmp/m.jsonl")
timeout 150 "$trainer" --config "$tmp/cluster.toml" --node b "${job[@]}" > "$tmp/b.log" 2>&1 &
pids+=($!)
timeout 150 "$trainer" --config "$tmp/cluster.toml" --node a "${job[@]}" > "$tmp/a.log" 2>&1 &
a=$!
pids+=($a)
# The stranger: once node a listens, a connection that writes 64 bytes of junk.
for _ in $(seq 1 300); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    exec 3<>"/dev/tcp/127.0.0.1/$p"
    head -c 64 /dev/urandom >&3 || true
    exec 3>&-
    break
  fi
  sleep 0.1
done
wait "$a" || fail "node a"
grep -q "refused: connection from 127.0.0.1:" "$tmp/a.log" || fail "node a's log does not name the refused connection"
grep -q '"link_rejections":{' "$tmp/m.jsonl" || fail "the metrics do not count the rejections"
grep -q '"test_accuracy":0\.[6-9]' "$tmp/m.jsonl" || fail "the encrypted run did not train"
grep -o '"link_rejections":{[^}]*}' "$tmp/m.jsonl" | tail -n 1
echo "ok: wire"
