// The LoRA dropout mask as a pure function of (seed, row, col): forward and backward recompute
// it instead of storing it. QLFT_HD so CUDA kernels draw the same mask.
#pragma once

#include <cstdint>

#include "core/hd.h"

namespace qlft {

// splitmix64 finalizer: a well-mixed 64-bit hash.
QLFT_HD inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// True if element (row, col) is kept under dropout probability p.
QLFT_HD inline bool lora_dropout_keep(uint64_t seed, int64_t row, int64_t col, float p) {
  uint64_t h = mix64(seed ^ mix64(static_cast<uint64_t>(row) * 0x9e3779b97f4a7c15ull +
                                  static_cast<uint64_t>(col)));
  // 24 random bits -> [0, 1)
  float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
  return u >= p;
}

}  // namespace qlft
