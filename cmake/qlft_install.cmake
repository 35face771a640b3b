# Installation and packaging of libqlft (included from the top-level CMakeLists.txt after the
# targets exist). `cmake --install <build> --prefix P` gives, for any P and wherever P is moved:
#   P/include/qlft.h, P/<libdir>/libqlft.so*, P/bin/qlft-finetune (RUNPATH $ORIGIN/../<libdir>),
#   P/<libdir>/libqlft-mpi.so             (the MPI plugin, when built: QLFT_MPI),
#   P/<libdir>/libqlft-cuda.so            (the CUDA plugin, when built: QLFT_CUDA / _EMULATE),
#   P/<libdir>/pkgconfig/qlft.pc          (paths relative to ${pcfiledir}),
#   P/<libdir>/cmake/qlft/qlftConfig.cmake + qlftConfigVersion.cmake + qlftTargets*.cmake
#                                         (find_package(qlft CONFIG) -> imported target qlft::qlft).
# The build tree is usable the same way: PKG_CONFIG_PATH=<build>/pkgconfig and
# -Dqlft_DIR=<build> (absolute paths to this build and source tree; never installed).
include(CMakePackageConfigHelpers)

add_library(qlft::qlft ALIAS qlft)  # the same name for add_subdirectory() users

# RUNPATH. For an installed target CMake links the build-tree binary with a padded RUNPATH so it
# can edit it in place at install time, and that padding is an empty entry (the current
# directory: libqlft.so once searched ./libopenblas.so.0). libqlft needs no path of its own, so
# it is linked once with its final RUNPATH, the same in the build and the install tree: only
# its dependencies' non-system directories (none on Debian, where MPI's libdir is also in
# ld.so.conf; an OpenMPI or oneDNN from /opt would be listed).
set_target_properties(qlft PROPERTIES BUILD_WITH_INSTALL_RPATH ON INSTALL_RPATH_USE_LINK_PATH ON)
# The installed CLI finds libqlft beside itself in any prefix. It is its own link of the CLI's
# objects (tools/qlft-finetune), linked with this RUNPATH, so no binary is edited at install.
file(RELATIVE_PATH _qlft_bin_to_lib "/P/${CMAKE_INSTALL_BINDIR}" "/P/${CMAKE_INSTALL_LIBDIR}")
set_target_properties(qlft-finetune-install PROPERTIES BUILD_WITH_INSTALL_RPATH ON
                      INSTALL_RPATH "$ORIGIN/${_qlft_bin_to_lib}")

set(QLFT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/qlft)
install(TARGETS qlft EXPORT qlftTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_SOURCE_DIR}/include/qlft.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The MPI plugin goes beside libqlft, where libqlft looks for it (src/parallel/mpi_plugin_loader.h);
# like libqlft it keeps only its dependencies' non-system directories as RUNPATH.
if(TARGET qlft-mpi)
  set_target_properties(qlft-mpi PROPERTIES BUILD_WITH_INSTALL_RPATH ON INSTALL_RPATH_USE_LINK_PATH ON)
  install(TARGETS qlft-mpi LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
# The CUDA plugin likewise (src/backend/cuda_plugin.h); its RUNPATH keeps the CUDA toolkit's
# library directory (cuBLASLt, NCCL) when that is not a system one.
if(TARGET qlft-cuda)
  set_target_properties(qlft-cuda PROPERTIES BUILD_WITH_INSTALL_RPATH ON INSTALL_RPATH_USE_LINK_PATH ON)
  install(TARGETS qlft-cuda LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
install(EXPORT qlftTargets NAMESPACE qlft:: DESTINATION ${QLFT_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/qlftConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/install-pkg/qlftConfig.cmake
                              INSTALL_DESTINATION ${QLFT_CMAKE_DIR})
# The SONAME is libqlft.so.<major>: any 0.x satisfies find_package(qlft 0.y) for y <= x.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/qlftConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/install-pkg/qlftConfig.cmake
              ${CMAKE_BINARY_DIR}/qlftConfigVersion.cmake DESTINATION ${QLFT_CMAKE_DIR})

# pkg-config: the prefix is found from the .pc file's own directory, so a moved prefix works.
# An absolute CMAKE_INSTALL_LIBDIR/INCLUDEDIR (e.g. a distribution's /usr/lib/...) is kept as is.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(QLFT_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(QLFT_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
else()
  file(RELATIVE_PATH _qlft_pc_up "/P/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/P")
  string(REGEX REPLACE "/$" "" _qlft_pc_up "${_qlft_pc_up}")
  set(QLFT_PC_PREFIX "\${pcfiledir}/${_qlft_pc_up}")
  set(QLFT_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(QLFT_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(QLFT_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/qlft.pc.in ${CMAKE_BINARY_DIR}/install-pkg/qlft.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/install-pkg/qlft.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# The build tree as a package (for the bindings' in-tree tests and for developers).
set(QLFT_PC_PREFIX "${CMAKE_BINARY_DIR}")
set(QLFT_PC_LIBDIR "$<TARGET_FILE_DIR:qlft>")
set(QLFT_PC_INCLUDEDIR "${PROJECT_SOURCE_DIR}/include")
configure_file(${PROJECT_SOURCE_DIR}/cmake/qlft.pc.in ${CMAKE_BINARY_DIR}/pkgconfig/qlft.pc.gen
               @ONLY)
file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/pkgconfig/qlft.pc
     INPUT ${CMAKE_BINARY_DIR}/pkgconfig/qlft.pc.gen)
export(EXPORT qlftTargets NAMESPACE qlft:: FILE ${CMAKE_BINARY_DIR}/qlftTargets.cmake)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/qlftConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/qlftConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_BINARY_DIR} INSTALL_PREFIX ${CMAKE_BINARY_DIR})
