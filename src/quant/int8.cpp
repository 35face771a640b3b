#include "quant/int8.h"

#include <algorithm>
#include <cmath>

#include "quant/nf4_math.h"
#include "quant/quant_kernels.h"
#include "core/threads.h"

namespace qlft {

void int8_quantize_rows(const float* x, int64_t rows, int64_t cols, int8_t* codes, float* scb) {
  const int nt = qlft::num_threads();
#pragma omp parallel for num_threads(nt) schedule(static) if (rows * cols > (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float am = 0.0f;
    for (int64_t c = 0; c < cols; ++c) am = std::max(am, std::fabs(xr[c]));
    scb[r] = am;
    const float scale = int8_row_scale(am);
    int8_t* q = codes + r * cols;
    for (int64_t c = 0; c < cols; ++c) q[c] = int8_encode(xr[c], scale);
  }
}

void int8_dequantize_rows(const int8_t* codes, const float* scb, int64_t r0, int64_t n,
                          int64_t cols, float* out) {
  quant_kernels().int8_dequantize_rows(codes, scb, r0, n, cols, out);
}

}  // namespace qlft
