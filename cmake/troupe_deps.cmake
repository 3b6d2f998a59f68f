# Finds every dependency troupe builds against (all Debian 12 packages; see scripts/setup.sh).
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(Eigen3 3.4 REQUIRED NO_MODULE)
find_package(ZLIB REQUIRED)
find_package(CapnProto REQUIRED)
# The links between nodes: OpenSSL's libcrypto (HMAC, RAND_bytes; libssl-dev), Boost.Asio headers (libboost-dev).
find_package(OpenSSL REQUIRED)
find_package(Boost 1.74 REQUIRED)
# Job files, command lines, JSON metrics (libtomlplusplus-dev, libcli11-dev, nlohmann-json3-dev).
find_package(tomlplusplus REQUIRED)
find_package(CLI11 REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)

# OpenBLAS, OpenMP flavour (libopenblas-openmp-dev): its threads obey omp_set_num_threads.
find_path(TROUPE_CBLAS_INCLUDE cblas.h
  PATHS /usr/include/x86_64-linux-gnu/openblas-openmp /usr/include/openblas NO_DEFAULT_PATH)
find_library(TROUPE_BLAS_LIBRARY NAMES openblas
  PATHS /usr/lib/x86_64-linux-gnu/openblas-openmp NO_DEFAULT_PATH)
if(NOT TROUPE_CBLAS_INCLUDE OR NOT TROUPE_BLAS_LIBRARY)
  message(FATAL_ERROR "OpenBLAS (OpenMP) not found: run scripts/setup.sh "
                      "(apt-get install libopenblas-openmp-dev libopenblas0-openmp)")
endif()
add_library(troupe::blas INTERFACE IMPORTED)
set_target_properties(troupe::blas PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${TROUPE_CBLAS_INCLUDE}"
  INTERFACE_LINK_LIBRARIES "${TROUPE_BLAS_LIBRARY}")

# CAF 0.17 ships no CMake config: imported targets by hand.
find_library(TROUPE_CAF_CORE caf_core)
find_library(TROUPE_CAF_IO caf_io)
if(TROUPE_CAF_CORE AND TROUPE_CAF_IO)
  add_library(caf::core INTERFACE IMPORTED)
  set_target_properties(caf::core PROPERTIES INTERFACE_LINK_LIBRARIES "${TROUPE_CAF_CORE};Threads::Threads")
  add_library(caf::io INTERFACE IMPORTED)
  set_target_properties(caf::io PROPERTIES INTERFACE_LINK_LIBRARIES "${TROUPE_CAF_IO};caf::core")
  set(TROUPE_HAVE_CAF ON)
endif()

# CUDA: AUTO turns it on only where nvcc is found.
set(TROUPE_CUDA_ENABLED OFF)
if(TROUPE_CUDA STREQUAL "ON" OR TROUPE_CUDA STREQUAL "AUTO")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(TROUPE_CUDA_ENABLED ON)
  elseif(TROUPE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "TROUPE_CUDA=ON but no CUDA compiler (nvcc) was found")
  endif()
elseif(NOT TROUPE_CUDA STREQUAL "OFF")
  message(FATAL_ERROR "TROUPE_CUDA must be AUTO, ON or OFF, not '${TROUPE_CUDA}'")
endif()
