#!/usr/bin/env bash
# The kernel tests ("[kernels]") with TROUPE_CPU_KERNELS=SET: passes when they
# pass, is skipped (77) when this CPU cannot run SET (troupe refuses it, naming
# the sets it runs), fails otherwise.
set -uo pipefail
set=$1 tests=$2
out=$(TROUPE_CPU_KERNELS=$set "$tests" "[kernels]" 2>&1)
rc=$?
if grep -q "TROUPE_CPU_KERNELS=$set: this CPU runs the kernel sets" <<<"$out"; then
  grep -m1 -o "TROUPE_CPU_KERNELS=$set: this CPU runs the kernel sets [^;]*" <<<"$out"
  exit 77
fi
tail -n 30 <<<"$out"
exit $rc
