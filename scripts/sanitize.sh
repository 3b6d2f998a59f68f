#!/usr/bin/env bash
# The unit tests (troupe_tests, every Catch2 case) built with AddressSanitizer
# and UndefinedBehaviorSanitizer (g++ -fsanitize=address,undefined, undefined
# behaviour fatal) in a build tree of their own, then run once. Not part of
# the suite: the build takes ~15 min and the run ~4 min on 2 cores. Leak
# checking is off (the actor system's threads keep allocations at exit).
#   scripts/sanitize.sh [BUILD_DIR] [CATCH2 TEST SPEC ...]   (default build-asan/)
#   scripts/sanitize.sh build-asan "[kernels]"
# With --ctest first, every target is built so and the whole CTest suite runs
# on it: the multi-process, cluster and Slurm tests start the sanitized
# trainer (~30 min to build, ~8 min to run). Two tests cannot run in such a
# tree and are left out: package_consumer (its consumer is built without the
# sanitizer runtime) and trace_stats_reads_a_pipeline_trace (a bench program;
# benchmarks are not built here). The kernel tests run once per kernel set
# this CPU has, as in the suite.
#   scripts/sanitize.sh --ctest [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
whole=0
if [ "${1:-}" = "--ctest" ]; then whole=1; shift; fi
dir=${1:-build-asan}
[ $# -gt 0 ] && shift
flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTROUPE_BENCH=OFF \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" > /dev/null
export ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1
if [ "$whole" = 1 ]; then
  cmake --build "$dir" -j "$(nproc)"
  cd "$dir"
  exec ctest -j "$(nproc)" -E '^(package_consumer|trace_stats_reads_a_pipeline_trace)$'
fi
cmake --build "$dir" -j "$(nproc)" --target troupe_tests
cd "$dir/tests"
./troupe_tests "$@"
