#!/usr/bin/env bash
# cmake --install puts troupe's programs and libtroupe under a prefix, and the
# programs run from there as they are: no LD_LIBRARY_PATH, no ldconfig (their
# RPATH is $ORIGIN/../lib). Every program in the prefix's bin/ answers --help
# and --version (tests/scripts/program_help.sh); troupe_trainer trains a few
# steps and writes a checkpoint, troupe_checkpoint reads it and names a
# missing file, troupe_plan plans a job.
#   install_programs.sh BUILD_DIR VERSION
set -euo pipefail
build=$1 version=$2
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
unset LD_LIBRARY_PATH
cmake --install "$build" --prefix "$tmp/prefix" > /dev/null
bin=$tmp/prefix/bin
for p in troupe_trainer troupe_plan troupe_checkpoint; do
  [ -x "$bin/$p" ] || { echo "FAIL: $p is not installed in $bin"; exit 1; }
done
for p in "$bin"/*; do
  "$here/program_help.sh" "$p" "$version"
done

cd "$tmp"
"$bin/troupe_trainer" --model mlp --epochs 1 --max-steps 5 --evaluate false --progress none \
  --checkpoint "$tmp/run.ckpt" 2> trainer.log || { cat trainer.log; echo "FAIL: the installed trainer"; exit 1; }
out=$("$bin/troupe_checkpoint" "$tmp/run.ckpt")
echo "$out"
grep -q "^steps: 5$" <<<"$out" || { echo "FAIL: troupe_checkpoint did not read the trainer's 5 steps"; exit 1; }
if err=$("$bin/troupe_checkpoint" "$tmp/missing.ckpt" 2>&1); then
  echo "FAIL: troupe_checkpoint read a missing file"; exit 1
fi
echo "$err"
grep -q "missing.ckpt" <<<"$err" || { echo "FAIL: the error does not name the missing file"; exit 1; }
plan=$("$bin/troupe_plan" --model mlp --pipeline-stages 2 --json)
grep -q '"predicted_step_s":[0-9]' <<<"$plan" || { echo "$plan"; echo "FAIL: troupe_plan printed no plan"; exit 1; }
echo "ok: installed programs run from $tmp/prefix"
