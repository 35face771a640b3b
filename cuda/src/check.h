// Checking of every CUDA runtime and cuBLASLt call, and the one place kernels are launched.
//
// Rules (enforced by tests/cuda/check_cuda_sources.sh over cuda/src):
//  - every cuda*/cublasLt* call is wrapped in QLFT_CUDA_CHECK / QLFT_CUBLAS_CHECK (or
//    QLFT_CUDA_WARN in destructors, which must not throw);
//  - kernels are launched only through qlft::cu::launch, which checks cudaGetLastError;
//  - device memory comes only from the caching allocator (allocator.cu).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <utility>

#include "core/error.h"
#include "graph.h"
#include "launch_count.h"

// A kernel's dynamic shared memory (`extern __shared__ T name[]` under nvcc). The CPU emulator
// (QLFT_CUDA_EMULATE, cuda/emu) hands out a per-launch buffer instead: a block-scope extern
// declaration cannot be pointed at it.
#if defined(QLFT_CUDA_EMULATE)
#define QLFT_DYNAMIC_SHARED(T, name) T* const name = static_cast<T*>(::qlft_emu::dynamic_shared())
#else
#define QLFT_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#endif

namespace qlft::cu {

[[noreturn]] void throw_cuda(cudaError_t e, const char* expr, const char* file, int line);
[[noreturn]] void throw_cublas(cublasStatus_t s, const char* expr, const char* file, int line);
void warn_cuda(cudaError_t e, const char* expr, const char* file, int line) noexcept;
void warn_cublas(cublasStatus_t s, const char* expr, const char* file, int line) noexcept;

}  // namespace qlft::cu

#define QLFT_CUDA_CHECK(expr)                                                                     \
  do {                                                                                            \
    const cudaError_t qlft_cu_e_ = (expr);                                                        \
    if (qlft_cu_e_ != cudaSuccess) ::qlft::cu::throw_cuda(qlft_cu_e_, #expr, __FILE__, __LINE__); \
  } while (0)

#define QLFT_CUDA_WARN(expr)                                                                     \
  do {                                                                                           \
    const cudaError_t qlft_cu_e_ = (expr);                                                       \
    if (qlft_cu_e_ != cudaSuccess) ::qlft::cu::warn_cuda(qlft_cu_e_, #expr, __FILE__, __LINE__); \
  } while (0)

#define QLFT_CUBLAS_CHECK(expr)                                        \
  do {                                                                 \
    const cublasStatus_t qlft_cb_s_ = (expr);                          \
    if (qlft_cb_s_ != CUBLAS_STATUS_SUCCESS)                           \
      ::qlft::cu::throw_cublas(qlft_cb_s_, #expr, __FILE__, __LINE__); \
  } while (0)

#define QLFT_CUBLAS_WARN(expr)                                        \
  do {                                                                \
    const cublasStatus_t qlft_cb_s_ = (expr);                         \
    if (qlft_cb_s_ != CUBLAS_STATUS_SUCCESS)                          \
      ::qlft::cu::warn_cublas(qlft_cb_s_, #expr, __FILE__, __LINE__); \
  } while (0)

namespace qlft::cu {

// Launches kernel<<<grid, block, smem, stream>>>(args...) and checks the launch. Asynchronous
// faults surface at the next checked synchronizing call. Every launch is counted (launch_count.h).
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            Args&&... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;  // nothing to do (an empty launch errors)
  graph_before_launch(stream);  // a stream recorded as graphs opens its capture (graph.h)
  count_launch(reinterpret_cast<const void*>(kernel), graph_capturing(stream));
  // clang-format reads a .h as C++ and would split the launch chevrons:
  // clang-format off
#if defined(QLFT_CUDA_EMULATE)
  ::qlft_emu::launch(kernel, grid, block, smem, stream, std::forward<Args>(args)...);
#else
  kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
#endif
  QLFT_CUDA_CHECK(cudaGetLastError());
  // clang-format on
}

// A lower cap on every grid_for grid than the callers' (0: none; cuda_set_grid_cap, device.cu).
// Tests set it so each CUDA block's grid-stride loop runs several times on shapes small enough
// to emulate: the loop's second pass (and the barrier that guards its reuse of shared memory)
// otherwise only runs past 65535 blocks.
int64_t grid_cap_override();

// Blocks of `threads` covering n items, capped so grid-stride loops take the rest.
inline unsigned grid_for(int64_t n, int threads, int64_t cap = 65535) {
  int64_t g = (n + threads - 1) / threads;
  const int64_t o = grid_cap_override();
  if (o > 0 && o < cap) cap = o;
  if (g > cap) g = cap;
  return static_cast<unsigned>(g < 1 ? 1 : g);
}

}  // namespace qlft::cu
