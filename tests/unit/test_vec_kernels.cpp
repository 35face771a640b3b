// The CPU backend's per-ISA row kernels (backend/cpu/vec_kernels.h) that no backend op test
// reaches on every CPU: the fused bf16 softmax rows run inside attention only where oneDNN has a
// native bf16 engine, so here every level this CPU can run is called directly and held to
// independent rules: exp against double-precision exp, every bf16 output against core/half.h's
// scalar rounding of the fp32 value, the dropout rows against lora_dropout_keep's float test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/vec_kernels.h"
#include "backend/dropout.h"
#include "core/cpu_isa.h"
#include "core/half.h"

namespace {

using qlft::CpuIsa;
using qlft::cpu::VecKernels;

// The levels this CPU runs (at least the baseline), each with its kernel set.
std::vector<const VecKernels*> levels() {
  std::vector<const VecKernels*> out;
  for (CpuIsa isa : {CpuIsa::Baseline, CpuIsa::Avx2, CpuIsa::Avx512}) {
    const VecKernels* k = qlft::cpu::vec_kernels_at(isa);
    if (k && k->isa == isa) out.push_back(k);
  }
  return out;
}

// Ragged row lengths around the kernels' lane counts and blocks (16 lanes, 256-wide rounding
// blocks, 512-wide sum blocks).
const int64_t kLengths[] = {0, 1, 7, 15, 16, 17, 31, 255, 256, 257, 511, 512, 513, 1000};

std::vector<float> scores(int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, 3.f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = d(g);
  return x;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(VecKernels, SoftmaxRowsMatchDoubleExpAndScalarRoundingOnEveryLevel) {
  const auto sets = levels();
  ASSERT_FALSE(sets.empty());
  for (const VecKernels* k : sets) {
    for (int64_t n : kLengths) {
      SCOPED_TRACE("level " + std::to_string(int(k->isa)) + " n " + std::to_string(n));
      std::vector<float> x = scores(n, uint32_t(n) + 1);
      // masked keys (-inf) and far tails, as attention's rows have
      for (int64_t j = 3; j < n; j += 11) x[size_t(j)] = -std::numeric_limits<float>::infinity();
      for (int64_t j = 5; j < n; j += 13) x[size_t(j)] = -200.f;
      float m = -std::numeric_limits<float>::infinity();
      for (float v : x) m = std::max(m, v);
      EXPECT_EQ(bits(k->max_of(x.data(), n)), bits(m));

      std::vector<float> e = x;
      const double sum = k->exp_sum_shifted(e.data(), n, m);
      double want_sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        const float arg = x[size_t(j)] - m;
        const double want = std::exp(double(arg));
        if (want < 1e-37) {  // below the exp's clamp: exactly 0
          ASSERT_EQ(e[size_t(j)], 0.f) << j;
        } else {
          ASSERT_NEAR(e[size_t(j)], want, 3e-7 * want) << j << " arg " << arg;
        }
        want_sum += e[size_t(j)];
      }
      EXPECT_NEAR(sum, want_sum, 1e-6 * std::max(1.0, want_sum));
      EXPECT_EQ(k->sum_exp_shifted(x.data(), n, m), sum);  // the same sum, summed the same way

      std::vector<float> e1 = x;
      k->exp_shifted(e1.data(), n, m, 1.f);
      std::vector<float> e2 = x;
      std::vector<uint16_t> p16(size_t(n) + 1, 0xdead);
      k->exp_shifted_bf16(e2.data(), n, m, p16.data());
      for (int64_t j = 0; j < n; ++j) {
        ASSERT_EQ(bits(e1[size_t(j)]), bits(e[size_t(j)])) << j;
        ASSERT_EQ(bits(e2[size_t(j)]), bits(e[size_t(j)])) << j;
        ASSERT_EQ(p16[size_t(j)], qlft::f32_to_bf16(e[size_t(j)])) << j;
      }
      EXPECT_EQ(p16[size_t(n)], 0xdead);  // nothing past the row

      // The probabilities scaled into bf16, with subnormal products among them.
      const float inv = n ? float(1.0 / sum) : 1.f;
      std::vector<float> tiny = e;
      for (int64_t j = 2; j < n; j += 7) tiny[size_t(j)] = 1e-39f * float(j % 5);
      std::vector<uint16_t> s16(size_t(n) + 1, 0xdead);
      k->scale_to_bf16(tiny.data(), n, inv, s16.data());
      for (int64_t j = 0; j < n; ++j)
        ASSERT_EQ(s16[size_t(j)], qlft::f32_to_bf16(tiny[size_t(j)] * inv)) << j;
      EXPECT_EQ(s16[size_t(n)], 0xdead);

      // dS = P (dP - D), in place in fp32 and into bf16.
      std::vector<float> dp = scores(n, uint32_t(n) + 100), ds = dp;
      const float d = 0.37f;
      k->softmax_bwd_row(ds.data(), e.data(), d, n);
      std::vector<uint16_t> d16(size_t(n) + 1, 0xdead);
      k->softmax_bwd_row_bf16(dp.data(), e.data(), d, n, d16.data());
      for (int64_t j = 0; j < n; ++j) {
        const float want = e[size_t(j)] * (dp[size_t(j)] - d);
        ASSERT_EQ(bits(ds[size_t(j)]), bits(want)) << j;
        ASSERT_EQ(d16[size_t(j)], qlft::f32_to_bf16(want)) << j;
      }
      EXPECT_EQ(d16[size_t(n)], 0xdead);
    }
  }
}

TEST(VecKernels, SoftmaxExpPassesNaNOn) {
  for (const VecKernels* k : levels()) {
    SCOPED_TRACE("level " + std::to_string(int(k->isa)));
    std::vector<float> x = scores(40, 3);
    x[17] = std::nanf("");
    const float m = 9.f;
    std::vector<float> e = x;
    const double sum = k->exp_sum_shifted(e.data(), 40, m);
    EXPECT_TRUE(std::isnan(e[17]));
    EXPECT_TRUE(std::isnan(sum));
    EXPECT_FALSE(std::isnan(e[16]));
    std::vector<uint16_t> p16(40);
    e = x;
    k->exp_shifted_bf16(e.data(), 40, m, p16.data());
    EXPECT_TRUE(std::isnan(qlft::bf16_to_f32(p16[17])));
  }
}

TEST(VecKernels, DropoutRowsMatchTheMaskOnEveryLevel) {
  for (const VecKernels* k : levels()) {
    for (float p : {0.f, 0.05f, 0.5f, 0.9f}) {
      for (int64_t n : kLengths) {
        SCOPED_TRACE("level " + std::to_string(int(k->isa)) + " p " + std::to_string(p) + " n " +
                     std::to_string(n));
        const uint64_t seed = 0x1234567ull + uint64_t(n);
        const uint32_t t = qlft::lora_dropout_threshold(p);
        const int64_t row = 77 + n;
        const uint64_t base = qlft::lora_dropout_row_base(row);
        const float inv = 1.f / (1.f - p), s = 0.75f;
        const std::vector<float> x = scores(n, 5), g = scores(n, 6), dx0 = scores(n, 7);
        std::vector<float> out(size_t(n), -1.f);
        k->dropout_row(x.data(), n, seed, base, t, inv, out.data());
        // Each backward case: xd only, dx only, both.
        std::vector<float> xd1(size_t(n), -1.f), dx2 = dx0, xd3(size_t(n), -1.f), dx3 = dx0;
        k->dropout_bwd_row(x.data(), g.data(), n, seed, base, t, inv, s, xd1.data(), nullptr);
        k->dropout_bwd_row(x.data(), g.data(), n, seed, base, t, inv, s, nullptr, dx2.data());
        k->dropout_bwd_row(x.data(), g.data(), n, seed, base, t, inv, s, xd3.data(), dx3.data());
        for (int64_t c = 0; c < n; ++c) {
          const size_t i = size_t(c);
          const bool keep = qlft::lora_dropout_keep(seed, row, c, p);
          const float want_x = keep ? x[i] * inv : 0.f;
          ASSERT_EQ(bits(out[i]), bits(want_x)) << c;
          ASSERT_EQ(bits(xd1[i]), bits(want_x)) << c;
          ASSERT_EQ(bits(xd3[i]), bits(want_x)) << c;
          // dx + s g, with or without the product contracted into an FMA
          const float plain = dx0[i] + s * g[i], fused = std::fma(s, g[i], dx0[i]);
          for (float got : {dx2[i], dx3[i]}) {
            if (keep)
              ASSERT_TRUE(bits(got) == bits(plain) || bits(got) == bits(fused)) << c;
            else
              ASSERT_EQ(bits(got), bits(dx0[i])) << c;
          }
        }
      }
    }
  }
}

}  // namespace
