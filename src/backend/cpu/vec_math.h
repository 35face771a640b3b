// Elementwise math written so the compiler vectorizes it (no libm calls inside `omp simd`
// loops). Used on the hot softmax loops of attention and cross-entropy.
#pragma once

#include <cmath>
#include <cstdint>
#include <bit>

namespace qlft::cpu {

// Always inlined: vec_kernels.cpp compiles these into one function per ISA level (target
// attributes), and an out-of-line copy would be baseline code shared by every level.
#define QLFT_VEC_INLINE inline __attribute__((always_inline))

// exp(x) for x already in [-87.3, 88.3] (no NaN): Cody-Waite reduction x = n ln2 + r,
// |r| <= ln2 / 2, then a degree-7 Taylor polynomial (truncation error below 1e-8 relative) and
// 2^n built in the exponent bits; about 1 ulp. Callers bound the argument themselves, each as
// cheaply as its domain allows: range and NaN selects done in general cost a third of a sigmoid
// and a fifth of a softmax's exp (a Zen 3), and GCC copied the sigmoid's division into both arms
// of a NaN select.
QLFT_VEC_INLINE float exp_approx_in_range(float xc) {
  float n = std::nearbyint(xc * 1.44269504088896341f);
  float r = xc - n * 0.693145751953125f;
  r = r - n * 1.428606765330187e-06f;
  float p = 1.f / 5040.f;
  p = p * r + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

// exp(x) for x <= 88.3: a score minus its row's maximum or log-sum-exp, as every softmax here
// computes it. 0 below -87.3 (so exp(-inf) = 0); NaN gives itself.
QLFT_VEC_INLINE float exp_approx_shifted(float x) {
  const float lo = -87.3f;
  // NaN fails the comparison: lo for the arithmetic (the float-to-int step is undefined
  // behaviour for NaN, found by UBSan), and x itself returned.
  const float xc = x > lo ? x : lo;
  const float e = exp_approx_in_range(xc);
  const float r = x >= lo ? e : 0.f;
  return x != x ? x : r;
}

// The reductions below keep kLanes independent partial results in a fixed-size array (the
// compiler vectorizes the fixed-count inner loops at -O2, which it does not do for
// `omp simd reduction` there) and combine them in a fixed order: the result depends only on
// n, never on threads.
constexpr int kLanes = 16;

// max of x[0, n); -inf for n = 0.
QLFT_VEC_INLINE float max_of(const float* x, int64_t n) {
  float acc[kLanes];
  for (int l = 0; l < kLanes; ++l) acc[l] = -INFINITY;
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] = x[j + l] > acc[l] ? x[j + l] : acc[l];
  float m = -INFINITY;
  for (int l = 0; l < kLanes; ++l) m = acc[l] > m ? acc[l] : m;
  for (; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

// sum of exp(x[j] - m) over j < n: float lanes within blocks of 512, blocks added in double;
// with kStore, exp(x[j] - m) is also stored to out[j] (out may be x). A template argument, not a
// null test: with the test in the loop GCC kept the lanes' sums in memory.
template <bool kStore>
QLFT_VEC_INLINE double exp_sum_into(const float* x, float* out, int64_t n, float m) {
  double total = 0;
  int64_t j = 0;
  while (j + kLanes <= n) {
    float acc[kLanes] = {};
    const int64_t jend = n - j >= 512 ? j + 512 : j + (n - j) / kLanes * kLanes;
    for (; j < jend; j += kLanes)
      for (int l = 0; l < kLanes; ++l) {
        const float e = exp_approx_shifted(x[j + l] - m);
        if constexpr (kStore) out[j + l] = e;
        acc[l] += e;
      }
    float s = 0;
    for (int l = 0; l < kLanes; ++l) s += acc[l];
    total += s;
  }
  for (; j < n; ++j) {
    const float e = exp_approx_shifted(x[j] - m);
    if constexpr (kStore) out[j] = e;
    total += e;
  }
  return total;
}

QLFT_VEC_INLINE double sum_exp_shifted(const float* x, int64_t n, float m) {
  return exp_sum_into<false>(x, nullptr, n, m);
}

// x[j] = exp(x[j] - m) for j < n, returning their sum exactly as sum_exp_shifted adds it: one
// exp pass where the softmax needs both the sum and the values.
QLFT_VEC_INLINE double exp_sum_shifted(float* x, int64_t n, float m) {
  return exp_sum_into<true>(x, x, n, m);
}

}  // namespace qlft::cpu
