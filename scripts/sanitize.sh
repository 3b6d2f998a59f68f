#!/usr/bin/env bash
# The unit tests (troupe_tests, every Catch2 case) built with AddressSanitizer
# and UndefinedBehaviorSanitizer (g++ -fsanitize=address,undefined, undefined
# behaviour fatal) in a build tree of their own, then run once. Not part of
# the suite: the build takes ~15 min and the run ~4 min on 2 cores. Leak
# checking is off (the actor system's threads keep allocations at exit).
#   scripts/sanitize.sh [BUILD_DIR] [CATCH2 TEST SPEC ...]   (default build-asan/)
#   scripts/sanitize.sh build-asan "[kernels]"
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-asan}
[ $# -gt 0 ] && shift
flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTROUPE_BENCH=OFF \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" > /dev/null
cmake --build "$dir" -j "$(nproc)" --target troupe_tests
cd "$dir/tests"
ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 ./troupe_tests "$@"
