# The kernels written on kernels/cpu/simd.hpp's vectors, compiled once per
# instruction set into an object library troupe_kernels_<set> (its compiler
# flags, TROUPE_SIMD_WIDTH, and TROUPE_ISA: the namespace its code goes in);
# kernels/cpu/machine.cpp picks one set by cpuid when the process starts.
# TROUPE_KERNEL_SET_OBJECTS lists the objects for troupe_kernels, the set
# built with the baseline flags (generic) first: an inline function of a
# header that every set compiles is kept, by the linker, from the first
# object that defines it, so none compiled for a wider set runs outside it.
set(TROUPE_KERNEL_SET_SOURCES
  kernels/cpu/conv_direct.cpp
  kernels/cpu/conv_winograd.cpp
  kernels/cpu/elementwise_set.cpp
  kernels/cpu/sequence_set.cpp
  kernels/cpu/simd_set.cpp)
set(TROUPE_KERNEL_SET_OBJECTS "")

function(troupe_kernel_set isa width)
  add_library(troupe_kernels_${isa} OBJECT ${TROUPE_KERNEL_SET_SOURCES})
  target_compile_definitions(troupe_kernels_${isa} PRIVATE TROUPE_ISA=${isa} TROUPE_SIMD_WIDTH=${width})
  target_compile_options(troupe_kernels_${isa} PRIVATE ${ARGN})
  target_link_libraries(troupe_kernels_${isa} PRIVATE troupe_tensor OpenMP::OpenMP_CXX)
  set(TROUPE_KERNEL_SET_OBJECTS ${TROUPE_KERNEL_SET_OBJECTS} $<TARGET_OBJECTS:troupe_kernels_${isa}> PARENT_SCOPE)
endfunction()

troupe_kernel_set(generic 4)
troupe_kernel_set(avx2 8 -mavx2 -mfma)
# x86-64-v4's AVX-512 subsets; machine.cpp requires all five of the CPU.
troupe_kernel_set(avx512 16 -mavx512f -mavx512cd -mavx512bw -mavx512dq -mavx512vl)
