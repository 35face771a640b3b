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
# built-ins forced in as nvcc does implicitly. tests/cuda compiles its .cu kernels the same way.
set(QLFT_EMU_DEVICE_OPTIONS
    "-xc++;-Wno-unknown-pragmas;-include;${CMAKE_CURRENT_SOURCE_DIR}/emu/include/qlft_emu_device.h")
# Shared-memory race detection (emu/src/racecheck.cpp): the device code is compiled with TSan's
# instrumentation and linked without its runtime; the emulator serves the calls. Not with another
# sanitizer (ASan's and TSan's instrumentation exclude each other; the ASan build runs without
# the check) and only on GCC and clang, which share the __tsan_* ABI.
if(NOT QLFT_SANITIZE AND NOT QLFT_FUZZ AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  list(APPEND QLFT_EMU_DEVICE_OPTIONS "-fsanitize=thread")
endif()
set(QLFT_EMU_DEVICE_OPTIONS "${QLFT_EMU_DEVICE_OPTIONS}" CACHE INTERNAL "")
set_source_files_properties(${QLFT_CUDA_SOURCES} PROPERTIES COMPILE_OPTIONS "${QLFT_EMU_DEVICE_OPTIONS}")
set_target_properties(qlft_cuda PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_compile_definitions(qlft_cuda PRIVATE QLFT_BUILDING QLFT_CUDA_EMULATE=1)
target_link_libraries(qlft_cuda PUBLIC qlft_core)
