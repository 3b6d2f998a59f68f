#!/usr/bin/env bash
# The layering check fails, naming the file and the rule, when an include
# breaks the table: a copy of the tree with model/ including actors/, then
# one with net/ including OpenMP's header.
set -euo pipefail
src=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cp -r "$src"/{tensor,kernels,model,data,net,train,actors,samples,include} "$tmp"/
"$src"/scripts/check_layering.sh "$tmp" > /dev/null || { echo "the clean copy must pass"; exit 1; }
echo '#include "actors/fit.hpp"' >> "$tmp/model/layout.cpp"
if out=$("$src"/scripts/check_layering.sh "$tmp"); then
  echo "check_layering.sh passed a tree where model/ includes actors/"; exit 1
fi
echo "$out"
grep -q 'model/layout.cpp:[0-9]*: includes "actors/fit.hpp": model/ may include only tensor kernels model' <<<"$out"
cp "$src"/model/layout.cpp "$tmp/model/layout.cpp"
"$src"/scripts/check_layering.sh "$tmp" > /dev/null || { echo "the restored copy must pass"; exit 1; }
echo '#include <omp.h>' >> "$tmp/net/address.cpp"
if out=$("$src"/scripts/check_layering.sh "$tmp"); then
  echo "check_layering.sh passed a tree where net/ includes <omp.h>"; exit 1
fi
echo "$out"
grep -q 'net/address.cpp:[0-9]*: includes <omp.h>: omp headers belong to kernels/ only, not net/' <<<"$out"
