// Shared pieces of the GPU tests: the device gate and the normalized error.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cuda_entry.h"
#include "support/test_support.h"

// Skips the test (reported as skipped by ctest) when no CUDA device can be used; fails instead
// under QLFT_REQUIRE_GPU=1 (a GPU machine with a broken driver must not look green).
#define QLFT_NEED_GPU()                                                              \
  do {                                                                               \
    std::string qlft_why_;                                                           \
    if (qlft::cuda_device_count(&qlft_why_) == 0)                                    \
      QLFT_SKIP("no-gpu") << "no usable CUDA device (" << qlft_why_ << "): skipped"; \
  } while (0)

namespace qlft_cuda_test {

// ||a - b|| / max(||b||, floor): the normalized error the GPU results are held to.
inline double norm_err(const std::vector<float>& a, const std::vector<float>& b,
                       double floor = 1e-12) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  if (a.size() != b.size()) return INFINITY;
  return std::sqrt(num) / std::max(std::sqrt(den), floor);
}

}  // namespace qlft_cuda_test
