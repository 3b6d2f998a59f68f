#!/usr/bin/env bash
# A trainer in a memory cgroup of 400 MB (a container's limit) with a batch that needs more: its
# tensors stop at the cgroup's limit with "out of memory: ..." (exit 1) instead of the cgroup's OOM
# killer (SIGKILL, exit 137). Needs root and a writable memory cgroup (v1 or v2); skipped (77) without.
#   tests/scripts/memory_cgroup.sh TRAINER
set -uo pipefail
trainer=$1
name=troupe_memory_test_$$
if [ -w /sys/fs/cgroup/memory ] && mkdir "/sys/fs/cgroup/memory/$name" 2>/dev/null; then
  dir=/sys/fs/cgroup/memory/$name
  echo 400M > "$dir/memory.limit_in_bytes" || { rmdir "$dir"; echo "skip: cannot set a v1 limit"; exit 77; }
elif grep -qw memory /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null && mkdir "/sys/fs/cgroup/$name" 2>/dev/null; then
  dir=/sys/fs/cgroup/$name
  echo 400M > "$dir/memory.max" || { rmdir "$dir"; echo "skip: cannot set a v2 limit"; exit 77; }
else
  echo "skip: no writable memory cgroup here"
  exit 77
fi
out=$(sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' sh "$dir" "$trainer" --model cnn --batch-size 8192 \
  --max-steps 1 --epochs 1 --evaluate false --progress none 2>&1)
rc=$?
rmdir "$dir" 2>/dev/null
echo "$out" | tail -n 3
if [ $rc -eq 1 ] && grep -q "out of memory: a tensor of .* it may hold (95 % of the memory available to it" <<<"$out"; then
  echo "ok: memory_cgroup (exit $rc)"
  exit 0
fi
echo "FAIL: expected exit 1 and out of memory, got exit $rc"
exit 1
