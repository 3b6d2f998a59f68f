#!/usr/bin/env bash
# Runs troupe's whole test suite: installs missing packages, the tests' own too (scripts/setup.sh --test),
# configures and builds build/, then runs every test with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test --no-build
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j2
cd build
ctest --output-on-failure -j2
