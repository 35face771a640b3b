// Launchers of the mixture-of-experts row kernels (k_moe.cu; device pointers, one stream).
// Matrices are row-major fp32 with leading dimensions in elements.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace qlft::cu {

// out[i, :cols] = x[rows[i], :cols] (times scale[i] where scale is not null), i < n.
void gather_rows(const float* x, int64_t ldx, const int32_t* rows, const float* scale, float* out,
                 int64_t ldo, int64_t n, int64_t cols, cudaStream_t s);
// out[r, c] = (accumulate ? out[r, c] : 0) + sum over j < k of (w ? w[r k + j] : 1)
// src[pos[r k + j], c], summed in double in the order of j, r < n.
void combine_rows(const float* src, int64_t lds, const int32_t* pos, const float* w, int k,
                  float* out, int64_t ldo, int64_t n, int64_t cols, bool accumulate,
                  cudaStream_t s);
// out[i] = sum over c < cols of a[rows ? rows[i] : i, c] b[i, c] (in double), i < n.
void row_dots(const float* a, int64_t lda, const int32_t* rows, const float* b, int64_t ldb,
              int64_t n, int64_t cols, float* out, cudaStream_t s);

}  // namespace qlft::cu
