#!/usr/bin/env bash
# A 2-stage pipeline traced through the public API, read back by
# bench/trace_stats.py: two stage tracks, every one busy for 2 micro-batches
# x 2 actions x 1 ms at least (no timing beyond that floor is asserted).
set -euo pipefail
build=$1 src=$2
command -v python3 > /dev/null || { echo "FAILED: python3 is not installed (scripts/setup.sh installs it)"; exit 1; }
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
"$build/bench/troupe_pipeline_bubble" --stages 2 --micro-batches 2 --steps 2 --op-ms 1 --trace "$d/t.json" >/dev/null
python3 "$src/bench/trace_stats.py" "$d/t.json" --only stage --stages 2 --micro-batches 2 --json "$d/s.json"
python3 - "$d/s.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
tracks = s["tracks"]
assert [t["track"] for t in tracks] == ["stage 0 on node 0", "stage 1 on node 0"], tracks
for t in tracks:
    assert t["busy_ms"] >= 2 * 2 * 2 * 1.0, t        # 2 mini-batches x 2 micro-batches x (forward + backward)
    assert 0 < t["utilization"] <= 1 and 0 <= t["idle_per_mini_batch"] < 1, t
assert abs(s["ideal_idle_mini_batch"] - 1 / 3) < 1e-9 and abs(s["ideal_idle_run"] - 1 / 5) < 1e-9, s
print("trace_stats: ok")
PY
# A file that is not a trace is refused with a message naming it.
echo '{"traceEvents": []}' > "$d/empty.json"
if python3 "$src/bench/trace_stats.py" "$d/empty.json" 2>"$d/err"; then echo "an empty trace was accepted" >&2; exit 1; fi
grep -q "empty.json holds no spans" "$d/err"
