#!/usr/bin/env bash
# Runs troupe's whole test suite: installs missing packages, the tests' own too (scripts/setup.sh --test),
# configures and builds build/, then runs every test with ctest and says why each skipped test was skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test --no-build
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j2
cd build
status=0; mkdir -p Testing
ctest --output-on-failure -j2 2>&1 | tee Testing/test_sh.log || status=$?
# CTest names the skipped tests only: print each one's reason (the first line of its output).
skipped=$(sed -n 's/^[[:space:]]*[0-9]* - \(.*\) (Skipped)$/\1/p' Testing/test_sh.log)
[ -z "$skipped" ] || echo "Why the tests that did not run were skipped:"
for t in $skipped; do
  # The test's "skipped: ..." line, else the first line of its output.
  reason=$(awk -v t="$t" '$0 == "" { next } $0 ~ "^[0-9]+/[0-9]+ Test: " && $3 == t { f = 1; next }
    f && /^Output:/ { o = 1; getline; next }
    o && /^<end of output>/ { exit }
    o && first == "" { first = $0 } o && /^skipped: / { print; found = 1; exit }
    END { if (!found && first != "") print first }' Testing/Temporary/LastTest.log)
  echo "  $t: ${reason:-(no output)}"
done
exit "$status"
