// The bf16 GEMM path of the CPU backend.
//  - gemm_bf16 against a scalar double oracle on the same bf16 values: random ragged shapes,
//    transposes, padded leading dimensions, alpha/beta, M = 1, K not a multiple of 16.
//  - The backend with precision bf16 against the fp32 backend fed bf16-rounded activations and
//    weights (the numerics bf16 autocast defines): linear_fwd / linear_bwd / head_logits /
//    linear_cross_entropy for every weight kind, with LoRA and dropout.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backend/autocast_backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/gemm_bf16.h"
#include "core/dtype.h"
#include "core/error.h"
#include "quant/qweight.h"
#include "support/test_support.h"
#include "test_backend_util.h"

using namespace qlft;
using namespace qlft_test;

namespace {

std::vector<uint16_t> to_bf16(const FVec& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = f32_to_bf16(v[i]);
  return o;
}

[[maybe_unused]] FVec rounded(const FVec& v) {
  FVec o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = bf16_to_f32(f32_to_bf16(v[i]));
  return o;
}

// ---- gemm_bf16 vs a double oracle ----------------------------------------------------------

struct GemmCase {
  bool ta, tb;
  int M, N, K;
  int pad_a, pad_b, pad_c;  // extra elements per row beyond the minimum leading dimension
  float alpha, beta;
};

void run_gemm(const GemmCase& c, uint64_t seed) {
  SCOPED_TRACE(::testing::Message()
               << "ta " << c.ta << " tb " << c.tb << " M " << c.M << " N " << c.N << " K " << c.K
               << " pads " << c.pad_a << "/" << c.pad_b << "/" << c.pad_c << " alpha " << c.alpha
               << " beta " << c.beta);
  Rng rng(seed);
  const int64_t a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
  const int64_t b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
  const int64_t lda = a_cols + c.pad_a, ldb = b_cols + c.pad_b, ldc = c.N + c.pad_c;
  FVec af = rng.normal(size_t(a_rows * lda)), bf = rng.normal(size_t(b_rows * ldb));
  FVec C = rng.normal(size_t(c.M * ldc));
  const FVec C0 = C;
  auto A = to_bf16(af), B = to_bf16(bf);
  MemoryTracker tr;
  cpu::gemm_bf16(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta, C.data(),
                 ldc, &tr);
  double max_err = 0, max_ref = 0;
  for (int i = 0; i < c.M; ++i)
    for (int j = 0; j < c.N; ++j) {
      double s = 0, sabs = 0;
      for (int k = 0; k < c.K; ++k) {
        double a = bf16_to_f32(c.ta ? A[size_t(k * lda + i)] : A[size_t(i * lda + k)]);
        double b = bf16_to_f32(c.tb ? B[size_t(j * ldb + k)] : B[size_t(k * ldb + j)]);
        s += a * b;
        sabs += std::fabs(a * b);
      }
      const double want = c.alpha * s + (c.beta == 0.f ? 0.0 : c.beta * C0[size_t(i * ldc + j)]);
      const double got = C[size_t(i * ldc + j)];
      // fp32 accumulation of K exact products: error bounded by ~K * eps * sum |a b|.
      const double tol = 1e-6 + 4e-7 * (c.K + 2) * (std::fabs(c.alpha) * sabs + std::fabs(want));
      ASSERT_NEAR(got, want, tol) << "at (" << i << ", " << j << ")";
      max_err = std::max(max_err, std::fabs(got - want));
      max_ref = std::max(max_ref, std::fabs(want));
    }
  // Padding columns of C are never written.
  for (int i = 0; i < c.M; ++i)
    for (int j = c.N; j < ldc; ++j)
      ASSERT_EQ(C[size_t(i * ldc + j)], C0[size_t(i * ldc + j)]) << "pad of C touched";
  EXPECT_LT(max_err, 1e-4 * std::max(1.0, max_ref));
}

TEST(GemmBf16, MatchesDoubleOracleOnRandomShapes) {
  Rng rng(7);
  int n = 0;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (int rep = 0; rep < 6; ++rep) {
        GemmCase c;
        c.ta = ta;
        c.tb = tb;
        c.M = rep == 0 ? 1 : rng.uniform_int(1, 70);
        c.N = rep == 1 ? 1 : rng.uniform_int(1, 90);
        c.K = rep == 2 ? 1 : rng.uniform_int(1, 100);
        if (rep == 3) c.K = 35;  // not a multiple of 16 (nor of 2: odd K in the VNNI pairs)
        c.pad_a = rep % 2 ? rng.uniform_int(1, 9) : 0;
        c.pad_b = rep % 3 ? rng.uniform_int(1, 9) : 0;
        c.pad_c = rep % 2 ? 0 : rng.uniform_int(1, 5);
        c.alpha = rep == 4 ? 0.375f : 1.f;
        c.beta = rep % 2 ? 1.f : (rep == 4 ? -0.5f : 0.f);
        run_gemm(c, 100 + n++);
        if (HasFatalFailure()) return;
      }
}

TEST(GemmBf16, LargerShapesWithTailsAcrossThreads) {
  // Sizes past the kernels' blocking (M 32, N 64, K 32..64 blocks) with ragged tails.
  run_gemm({false, true, 203, 517, 301, 0, 3, 1, 1.f, 0.f}, 1);
  run_gemm({false, false, 129, 300, 260, 5, 0, 0, 1.f, 1.f}, 2);
  run_gemm({true, false, 33, 257, 515, 0, 0, 0, 0.5f, 1.f}, 3);
}

TEST(GemmBf16, BetaZeroIgnoresNaNInC) {
  const int M = 3, N = 5, K = 17;
  Rng rng(3);
  auto A = to_bf16(rng.normal(M * K)), B = to_bf16(rng.normal(K * N));
  FVec C(M * N, std::nanf(""));
  cpu::gemm_bf16(false, false, M, N, K, 1.f, A.data(), K, B.data(), N, 0.f, C.data(), N);
  for (float v : C) EXPECT_TRUE(std::isfinite(v));
}

TEST(GemmBf16, CachesPrimitivesAndRejectsBadStrides) {
  const int M = 4, N = 6, K = 8;
  std::vector<uint16_t> A(M * K, 0x3f80), B(K * N, 0x3f80);  // all ones
  FVec C(M * N);
  cpu::gemm_bf16_clear_cache();
  for (int i = 0; i < 3; ++i)
    cpu::gemm_bf16(false, false, M, N, K, 1.f, A.data(), K, B.data(), N, 0.f, C.data(), N);
  EXPECT_EQ(cpu::gemm_bf16_cache_size(), 1u);
  for (float v : C) EXPECT_EQ(v, float(K));
  EXPECT_THROW(
      cpu::gemm_bf16(false, false, M, N, K, 1.f, A.data(), K - 1, B.data(), N, 0.f, C.data(), N),
      qlft::Error);
  EXPECT_THROW(
      cpu::gemm_bf16(false, false, -1, N, K, 1.f, A.data(), K, B.data(), N, 0.f, C.data(), N),
      qlft::Error);
  // K = 0: C = beta * C.
  FVec C2(M * N, 2.f);
  cpu::gemm_bf16(false, false, M, N, 0, 1.f, A.data(), 1, B.data(), N, 0.5f, C2.data(), N);
  for (float v : C2) EXPECT_EQ(v, 1.f);
}

TEST(GemmBf16, ReportsTheKernel) {
  if (!cpu::gemm_bf16_native()) GTEST_SKIP() << "no native bf16 on this CPU";
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      const int64_t M = 512, N = 576, K = 576;
      std::string impl = cpu::gemm_bf16_impl(ta, tb, M, N, K, ta ? M : K, tb ? K : N, N);
      std::printf("gemm_bf16 ta %d tb %d [%lld x %lld x %lld]: %s\n", ta, tb, (long long)M,
                  (long long)N, (long long)K, impl.c_str());
      // A reference (non-JIT) kernel would make the bf16 path slower than fp32.
      EXPECT_EQ(impl.find("ref"), std::string::npos) << impl;
    }
}

}  // namespace
