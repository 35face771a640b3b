// The LoRA dropout mask as a pure function of (seed, row, col): forward and backward recompute
// it instead of storing it. QLFT_HD so CUDA kernels draw the same mask.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/hd.h"

namespace qlft {

// splitmix64 finalizer: a well-mixed 64-bit hash.
QLFT_HD inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The row's share of the hash, computed once per row by the CPU loops.
QLFT_HD inline uint64_t lora_dropout_row_base(int64_t row) {
  return static_cast<uint64_t>(row) * 0x9e3779b97f4a7c15ull;
}

// murmur3's 32-bit finalizer: a bijection with full avalanche.
QLFT_HD inline uint32_t fmix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x85ebca6bu;
  x ^= x >> 13;
  x *= 0xc2b2ae35u;
  return x ^ (x >> 16);
}

// The 24 random bits of element (row, col), row given by its base: a row key mix64(seed ^
// row_base) (loop-invariant, so the row loops compute it once), then per element 32-bit
// arithmetic only, which every SIMD level has natively: fmix32 of the key's low half plus col
// times the golden ratio, xor its high half. Distinct columns of a row get distinct values (fmix32
// is a bijection). Two 64-bit products per element before (two mix64), which AVX2 builds from
// three 32-bit ones each: the mask cost 14% of a dropout-0.05 step on a Zen 3.
QLFT_HD inline uint32_t lora_dropout_bits(uint64_t seed, uint64_t row_base, int64_t col) {
  const uint64_t key = mix64(seed ^ row_base);
  const uint32_t x = static_cast<uint32_t>(key) + static_cast<uint32_t>(col) * 0x9e3779b9u;
  return fmix32(x ^ static_cast<uint32_t>(key >> 32)) >> 8;
}

// True if element (row, col) is kept under dropout probability p.
QLFT_HD inline bool lora_dropout_keep(uint64_t seed, int64_t row, int64_t col, float p) {
  // 24 random bits -> [0, 1)
  float u = static_cast<float>(lora_dropout_bits(seed, lora_dropout_row_base(row), col)) *
            (1.0f / 16777216.0f);
  return u >= p;
}

// lora_dropout_keep as an integer test, which the CPU's row loops vectorize:
// lora_dropout_bits(...) >= lora_dropout_threshold(p). Exact: u = k 2^-24 with k < 2^24 is
// exact in float, and p 2^24 in double, so u >= p iff k >= ceil(p 2^24). NaN p keeps nothing,
// as u >= NaN. At most 2^24: a 32-bit comparison.
inline uint32_t lora_dropout_threshold(float p) {
  if (!(p > 0.f)) return p == p ? 0 : uint32_t(1) << 24;
  const double t = static_cast<double>(p) * 16777216.0;
  return t >= 16777216.0 ? uint32_t(1) << 24 : static_cast<uint32_t>(std::ceil(t));
}

}  // namespace qlft
