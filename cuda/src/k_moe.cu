// The mixture-of-experts row kernels (CudaBackend::gather_rows / combine_rows / row_dots): the
// rows routed to the experts gathered into a packed buffer, their outputs combined back with the
// routing weights, and per-row dot products (the routing weights' gradient). Sums in double, in
// the CPU backend's order where it fixes one (combine_rows: over the k terms of a row).
#include "check.h"
#include "k_moe.h"
#include "reduce.cuh"

namespace qlft::cu {

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(256)
    k_gather_rows(const float* x, int64_t ldx, const int32_t* rows, const float* scale, float* out,
                  int64_t ldo, int64_t n, int64_t cols) {
  const int64_t total = n * cols;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = t / cols, c = t % cols;
    const float v = x[int64_t(rows[i]) * ldx + c];
    out[i * ldo + c] = scale ? scale[i] * v : v;
  }
}

__global__ void __launch_bounds__(256)
    k_combine_rows(const float* src, int64_t lds, const int32_t* pos, const float* w, int k,
                   float* out, int64_t ldo, int64_t n, int64_t cols, bool accumulate) {
  const int64_t total = n * cols;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = t / cols, c = t % cols;
    float* o = out + r * ldo + c;
    double a = accumulate ? double(*o) : 0.0;
    for (int j = 0; j < k; ++j) {
      const int64_t rk = r * k + j;
      a += double(w ? w[rk] : 1.f) * double(src[int64_t(pos[rk]) * lds + c]);
    }
    *o = static_cast<float>(a);
  }
}

// One block per row (grid-stride over rows).
__global__ void __launch_bounds__(256)
    k_row_dots(const float* a, int64_t lda, const int32_t* rows, const float* b, int64_t ldb,
               int64_t n, int64_t cols, float* out) {
  __shared__ double red[32];
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const float* x = a + (rows ? int64_t(rows[i]) : i) * lda;
    const float* y = b + i * ldb;
    double d = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) d += double(x[c]) * double(y[c]);
    d = block_sum(d, red);  // (ends with a barrier: red is free for the next row)
    if (threadIdx.x == 0) out[i] = static_cast<float>(d);
  }
}

}  // namespace

void gather_rows(const float* x, int64_t ldx, const int32_t* rows, const float* scale, float* out,
                 int64_t ldo, int64_t n, int64_t cols, cudaStream_t s) {
  if (n <= 0 || cols <= 0) return;
  launch(k_gather_rows, grid_for(n * cols, kThreads), kThreads, 0, s, x, ldx, rows, scale, out, ldo,
         n, cols);
}

void combine_rows(const float* src, int64_t lds, const int32_t* pos, const float* w, int k,
                  float* out, int64_t ldo, int64_t n, int64_t cols, bool accumulate,
                  cudaStream_t s) {
  if (n <= 0 || cols <= 0) return;
  launch(k_combine_rows, grid_for(n * cols, kThreads), kThreads, 0, s, src, lds, pos, w, k, out,
         ldo, n, cols, accumulate);
}

void row_dots(const float* a, int64_t lda, const int32_t* rows, const float* b, int64_t ldb,
              int64_t n, int64_t cols, float* out, cudaStream_t s) {
  if (n <= 0) return;
  launch(k_row_dots, grid_for(n, 1), kThreads, 0, s, a, lda, rows, b, ldb, n, cols, out);
}

}  // namespace qlft::cu
