#!/usr/bin/env bash
# A project outside the tree builds against the installed package
# (find_package(troupe CONFIG REQUIRED), troupe::troupe) and trains a model
# it defines itself, compiled without -march=native: the package exports no
# instruction-set flags (troupe chooses its kernels when it starts).
set -euo pipefail
build=$1 consumer=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" > /dev/null
cmake -S "$consumer" -B "$tmp/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON > /dev/null
cmake --build "$tmp/build" > /dev/null
if grep -l -e "-march" -e "-mavx" -r "$tmp/prefix/lib/cmake/troupe" "$tmp/build/compile_commands.json"; then
  echo "the installed package passes instruction-set flags (-march, -mavx) to its consumer"
  exit 1
fi
out=$(LD_LIBRARY_PATH="$tmp/prefix/lib:${LD_LIBRARY_PATH:-}" "$tmp/build/consumer")
echo "$out"
grep -q "consumer: test accuracy" <<<"$out"
