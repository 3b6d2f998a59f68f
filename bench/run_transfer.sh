#!/usr/bin/env bash
# Transfer between two processes on this machine, in one invocation: troupe's
# transport against a raw Boost.Asio socket pair and a bare ping-pong
# (troupe_transfer_bench), then iperf3 on the same path as a second reference
# when it is installed (apt-get install iperf3).
# Usage: bench/run_transfer.sh [BUILD_DIR] (default build/). Env: REPS (9), PINGS (3000), HOST (127.0.0.1),
# IPERF_REPS (3).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bench=$build/bench/troupe_transfer_bench
[ -x "$bench" ] || { echo "run_transfer: $bench not built (cmake --build $build)" >&2; exit 1; }
host=${HOST:-127.0.0.1}
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name:\s*//p' | head -n 1)"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
"$bench" --reps "${REPS:-9}" --pings "${PINGS:-3000}" --host "$host"
if ! command -v iperf3 >/dev/null; then
  echo "iperf3: not installed (apt-get install iperf3), skipped"
  exit 0
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("'"$host"'", 0)); print(s.getsockname()[1])')
for i in $(seq "${IPERF_REPS:-3}"); do
  iperf3 -s -1 -B "$host" -p "$port" >/dev/null 2>&1 &
  server=$!
  sleep 0.3
  iperf3 -c "$host" -p "$port" -t 5 -f g | sed -n 's/.*\(  [0-9.]* Gbits\/sec\).*receiver/iperf3, 1 stream, 5 s:\1 (receiver)/p'
  wait "$server" || true
done
