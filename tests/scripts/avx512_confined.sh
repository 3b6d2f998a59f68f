#!/usr/bin/env bash
# The portable build's AVX-512 instructions are all in the "avx512" kernel set
# (functions of namespace troupe::kernels::detail::avx512, compiled by
# cmake/troupe_kernel_sets.cmake) or in the peak probe's 16-wide loop, both
# run only where cpuid reports AVX-512: no other function of LIB (an inline
# function of a header compiled for AVX-512 and kept by the linker, a flag
# leaking into the baseline) may use them. AVX-512 shows as a zmm register, a
# mask register or one of xmm/ymm16-31. Also checks the set does use them.
set -euo pipefail
lib=$1
objdump -d -C --no-show-raw-insn "$lib" | awk '
  /^[0-9a-f]+ <.*>:$/ { fn = $0; next }
  /zmm|%k[1-7]|[xy]mm(1[6-9]|2[0-9]|3[01])/ {
    if (fn ~ /::avx512::/) inside[fn] = 1
    else if (fn ~ /fma_loop_16/) probe = 1
    else outside[fn] = 1
  }
  END {
    n = 0; for (f in inside) ++n
    print "functions of the avx512 set with AVX-512 instructions: " n
    bad = 0; for (f in outside) { print "AVX-512 outside its kernel set: " f; ++bad }
    exit (bad > 0 || n == 0) ? 1 : 0
  }'
