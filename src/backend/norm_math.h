// RMSNorm per-element math shared by the CPU backend and CUDA kernels.
// Forward (HF LlamaRMSNorm order): y = w * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps).
// Backward with w frozen: dx_j = rstd * w_j * dy_j - x_j * rstd^3 / n * sum_i(dy_i * w_i * x_i).
#pragma once

#include <cmath>

#include "core/hd.h"

namespace qlft {

// rstd from the sum of squares of a row of n elements.
QLFT_HD inline float rmsnorm_rstd(double sum_sq, long n, float eps) {
  return static_cast<float>(1.0 / std::sqrt(sum_sq / static_cast<double>(n) + eps));
}

QLFT_HD inline float rmsnorm_apply(float x, float w, float rstd) {
  return w * (x * rstd);
}

// The row constant of the backward: rstd^3 / n * sum_i(dy_i * w_i * x_i).
QLFT_HD inline float rmsnorm_bwd_coef(double dot_dyw_x, long n, float rstd) {
  return static_cast<float>(dot_dyw_x * rstd * rstd * rstd / static_cast<double>(n));
}

// d(loss)/dx_j given the row coefficient above.
QLFT_HD inline float rmsnorm_bwd_elem(float x, float w, float dy, float rstd, float coef) {
  return rstd * w * dy - x * coef;
}

}  // namespace qlft
