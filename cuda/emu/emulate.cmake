# QLFT_CUDA_EMULATE: cuda/src/*.cu compiled as host C++ (g++/clang) against the headers in
# cuda/emu/include (cuda_runtime.h, cublasLt.h, nccl.h and the device built-ins, forced in with
# -include), linked with the emulator's runtime (cuda/emu/src). Same library name and entry points
# as the real build, so the CUDA plugin (libqlft-cuda.so) and tests/cuda link the same way.
file(GLOB QLFT_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/*.cu
     ${CMAKE_CURRENT_SOURCE_DIR}/src/*.cpp)
file(GLOB QLFT_CUDA_EMU_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/emu/src/*.cpp)
set_source_files_properties(${QLFT_CUDA_SOURCES} PROPERTIES LANGUAGE CXX)
add_library(qlft_cuda STATIC ${QLFT_CUDA_SOURCES} ${QLFT_CUDA_EMU_SOURCES})
target_include_directories(qlft_cuda BEFORE PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/emu/include)
target_include_directories(qlft_cuda PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/include
                                             ${CMAKE_CURRENT_SOURCE_DIR}/emu/src)
# .cu files: as C++ (-x c++ since the extension is not one the compiler knows), with the device
# built-ins forced in as nvcc does implicitly.
set_source_files_properties(${QLFT_CUDA_SOURCES} PROPERTIES COMPILE_OPTIONS
  "-xc++;-Wno-unknown-pragmas;-include;${CMAKE_CURRENT_SOURCE_DIR}/emu/include/qlft_emu_device.h")
set_target_properties(qlft_cuda PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_compile_definitions(qlft_cuda PRIVATE QLFT_BUILDING QLFT_CUDA_EMULATE=1)
target_link_libraries(qlft_cuda PUBLIC qlft_core)
