# The libtorch baseline (troupe_torch_baseline), included from bench/CMakeLists.txt.
#
# libtorch is found by hand rather than with find_package(Torch): Debian's
# TorchConfig.cmake pulls in Caffe2Config.cmake, which looks for gflags, glog,
# protobuf, MKL and MKL-DNN, prints status lines of its own and defines global
# helper targets. Headers and three libraries are all the C++ frontend needs.

find_path(TROUPE_TORCH_INCLUDE_DIR torch/csrc/api/include/torch/torch.h
  HINTS ENV TORCH_INSTALL_PREFIX PATH_SUFFIXES include)
find_library(TROUPE_TORCH_LIBRARY torch HINTS ENV TORCH_INSTALL_PREFIX PATH_SUFFIXES lib)
find_library(TROUPE_TORCH_CPU_LIBRARY torch_cpu HINTS ENV TORCH_INSTALL_PREFIX PATH_SUFFIXES lib)
find_library(TROUPE_C10_LIBRARY c10 HINTS ENV TORCH_INSTALL_PREFIX PATH_SUFFIXES lib)
mark_as_advanced(TROUPE_TORCH_INCLUDE_DIR TROUPE_TORCH_LIBRARY TROUPE_TORCH_CPU_LIBRARY
  TROUPE_C10_LIBRARY)

if(NOT TROUPE_TORCH_INCLUDE_DIR OR NOT TROUPE_TORCH_LIBRARY OR NOT TROUPE_TORCH_CPU_LIBRARY
   OR NOT TROUPE_C10_LIBRARY)
  message(STATUS "troupe: libtorch not found, baseline not built (scripts/setup.sh --bench installs it)")
  return()
endif()

# Debian builds c10 with glog and gflags (C10_USE_GLOG in c10/macros/cmake_macros.h):
# inline code in the headers may then refer to them directly.
find_library(TROUPE_GLOG_LIBRARY glog)
find_library(TROUPE_GFLAGS_LIBRARY gflags)
mark_as_advanced(TROUPE_GLOG_LIBRARY TROUPE_GFLAGS_LIBRARY)
find_package(Threads REQUIRED)

# An imported target, so that its include directories count as system ones and
# torch's headers do not flood the build with -Wall -Wextra warnings.
add_library(troupe_libtorch INTERFACE IMPORTED)
set_target_properties(troupe_libtorch PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES
    "${TROUPE_TORCH_INCLUDE_DIR};${TROUPE_TORCH_INCLUDE_DIR}/torch/csrc/api/include")
# --no-as-needed: libtorch/libtorch_cpu register their operators from static
# initializers, so they must stay linked even where no symbol of theirs is used.
target_link_libraries(troupe_libtorch INTERFACE
  -Wl,--no-as-needed ${TROUPE_TORCH_LIBRARY} ${TROUPE_TORCH_CPU_LIBRARY} -Wl,--as-needed
  ${TROUPE_C10_LIBRARY} Threads::Threads)
foreach(_lib IN ITEMS TROUPE_GLOG_LIBRARY TROUPE_GFLAGS_LIBRARY)
  if(${_lib})
    target_link_libraries(troupe_libtorch INTERFACE ${${_lib}})
  endif()
endforeach()

add_executable(troupe_torch_baseline ${CMAKE_CURRENT_LIST_DIR}/torch_baseline.cpp)
target_link_libraries(troupe_torch_baseline PRIVATE troupe_libtorch troupe_data)
