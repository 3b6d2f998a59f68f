# cmake --install: libtroupe, its headers and a package config, so that a
# project outside the tree can find_package(troupe CONFIG REQUIRED) and link
# troupe::troupe.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS troupe EXPORT troupeTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# libtroupe keeps the folders of the libraries it links from outside the
# linker's own (OpenBLAS's OpenMP flavour), whichever flavour ldconfig prefers.
set_target_properties(troupe PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
# The programs a user runs (samples/CMakeLists.txt says which) find libtroupe
# in the prefix they are installed in, with no LD_LIBRARY_PATH or ldconfig:
# an RPATH of $ORIGIN/../lib; the build tree keeps its own RPATH.
if(TROUPE_SAMPLES)
  file(RELATIVE_PATH troupe_bin_to_lib ${CMAKE_INSTALL_FULL_BINDIR} ${CMAKE_INSTALL_FULL_LIBDIR})
  set_target_properties(${TROUPE_PROGRAMS} PROPERTIES INSTALL_RPATH "\$ORIGIN/${troupe_bin_to_lib}")
  install(TARGETS ${TROUPE_PROGRAMS} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
# Headers keep their folders under include/troupe: <troupe/troupe.hpp>
# includes "model/nn.hpp", found through include/troupe.
install(FILES include/troupe/troupe.hpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/troupe)
foreach(layer tensor kernels model data net train actors)
  install(DIRECTORY ${layer}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/troupe/${layer}
    FILES_MATCHING PATTERN "*.hpp" PATTERN "cuda" EXCLUDE)
endforeach()
install(FILES ${TROUPE_CAPNP_HDRS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/troupe/net)

install(EXPORT troupeTargets NAMESPACE troupe:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/troupe)
configure_package_config_file(cmake/troupeConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/troupeConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/troupe)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/troupeConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/troupeConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/troupeConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/troupe)
