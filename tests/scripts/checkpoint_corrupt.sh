#!/bin/sh
# troupe_checkpoint on a checkpoint with one bit of a weight flipped: a clear
# error naming the file and the checksum, exit status 1; the intact file reads.
# Skipped (77) without the Fashion-MNIST files to train the few steps on.
set -u
trainer=$1 info=$2 data=${3:-/usr/share/datasets/fashion-mnist}
if [ ! -e "$data/train-images-idx3-ubyte.gz" ] && [ ! -e "$data/train-images-idx3-ubyte" ]; then
  echo "SKIPPED: no Fashion-MNIST in $data"
  exit 77
fi
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
ckpt=$d/run.ckpt
if ! "$trainer" --data-dir "$data" --model mlp --epochs 1 --max-steps 2 --evaluate false --progress none \
  --threads 1 --checkpoint "$ckpt" >"$d/log" 2>&1; then
  cat "$d/log"
  echo "FAIL: the trainer did not write a checkpoint"
  exit 1
fi
"$info" "$ckpt" >/dev/null || { echo "FAIL: the intact checkpoint does not read"; exit 1; }
# A quarter into the file: inside the first layer's weights (the parameters come first).
size=$(wc -c <"$ckpt")
at=$((size / 4))
byte=$(od -An -tu1 -j "$at" -N1 "$ckpt" | tr -d ' ')
printf "$(printf '\\%03o' $((byte ^ 4)))" | dd of="$ckpt" bs=1 seek="$at" conv=notrunc 2>/dev/null
out=$("$info" "$ckpt" 2>&1)
rc=$?
echo "$out"
[ "$rc" -eq 1 ] || { echo "FAIL: exit status $rc, not 1"; exit 1; }
case $out in
  *"checkpoint $ckpt is corrupt: checksum mismatch"*) echo "ok: checkpoint_corrupt" ;;
  *) echo "FAIL: no checksum error naming $ckpt"; exit 1 ;;
esac
