#!/usr/bin/env bash
# troupe_trainer --dump-config > job.toml && troupe_trainer --config job.toml
# runs; a bad job file is an error naming the file, the line and the key.
set -euo pipefail
trainer=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$trainer" --model mlp --algorithm asgd --workers 2 --max-steps 20 --epochs 1 --evaluate false --progress none \
  --dump-config > "$tmp/job.toml"
grep -q '^workers = 2' "$tmp/job.toml"
"$trainer" --config "$tmp/job.toml" --metrics-out "$tmp/m.jsonl"
grep -q '"algorithm":"asgd","workers":2' "$tmp/m.jsonl"
# The dump of the dump is the same file.
"$trainer" --config "$tmp/job.toml" --dump-config > "$tmp/again.toml"
cmp "$tmp/job.toml" "$tmp/again.toml"
printf 'epochs = 1\nworkers = "eight"\n' > "$tmp/bad.toml"
if err=$("$trainer" --config "$tmp/bad.toml" 2>&1); then echo "a bad job file ran"; exit 1; fi
echo "$err"
grep -q "bad.toml:2: workers: expected an integer" <<<"$err"
