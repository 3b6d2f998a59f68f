# cmake --install: libtroupe, its headers and a package config, so that a
# project outside the tree can find_package(troupe CONFIG REQUIRED) and link
# troupe::troupe.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS troupe EXPORT troupeTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TROUPE_SAMPLES)
  install(TARGETS troupe_trainer RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
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
