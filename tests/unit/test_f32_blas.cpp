// The fp32 BLAS choice (backend/cpu/f32_blas.h): OpenBLAS's core names mapped to the level of
// their kernels, the rule that hands sgemm() to oneDNN, and oneDNN's dnnl_sgemm (the engine it
// hands over to) against a double-precision oracle on ragged shapes, every transpose, padded
// leading dimensions, alpha and beta.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/f32_blas.h"
#include "backend/cpu/gemm_bf16.h"
#include "core/cpu_isa.h"

using namespace qlft;
using namespace qlft::cpu;

TEST(F32Blas, CoreNamesMapToTheirKernelLevel) {
  // Names as openblas_get_corename() spells them (OpenBLAS 0.3.21 dynamic x86_64 cores).
  EXPECT_EQ(openblas_core_isa("SkylakeX"), CpuIsa::Avx512);
  EXPECT_EQ(openblas_core_isa("Cooperlake"), CpuIsa::Avx512);
  EXPECT_EQ(openblas_core_isa("SapphireRapids"), CpuIsa::Avx512);
  EXPECT_EQ(openblas_core_isa("sapphirerapids"), CpuIsa::Avx512);  // case-insensitive
  EXPECT_EQ(openblas_core_isa("Haswell"), CpuIsa::Avx2);
  EXPECT_EQ(openblas_core_isa("Zen"), CpuIsa::Avx2);
  for (const char* old : {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Sandybridge",
                          "Atom", "Barcelona", "Bulldozer", "unknown", ""})
    EXPECT_EQ(openblas_core_isa(old), CpuIsa::Baseline) << old;
  EXPECT_EQ(openblas_core_isa("Haswellx"), CpuIsa::Baseline);  // whole names only
}

TEST(F32Blas, OneDnnTakesOverWhereOpenBlasKernelsAreOlderThanTheCpu) {
  // The case measured on an Emerald Rapids: Debian's OpenBLAS 0.3.21 runs "Prescott" kernels.
  EXPECT_TRUE(openblas_behind("Prescott", CpuIsa::Amx));
  EXPECT_TRUE(openblas_behind("Prescott", CpuIsa::Avx512));
  EXPECT_TRUE(openblas_behind("Prescott", CpuIsa::Avx2));
  EXPECT_TRUE(openblas_behind("Haswell", CpuIsa::Avx512));  // AVX2 kernels on an AVX-512 CPU
  EXPECT_TRUE(openblas_behind("Zen", CpuIsa::Avx512Bf16));  // a Zen 4 before OpenBLAS knew it
  // Kernels at the CPU's level (levels above AVX-512 add nothing to an fp32 GEMM).
  EXPECT_FALSE(openblas_behind("SapphireRapids", CpuIsa::Amx));
  EXPECT_FALSE(openblas_behind("SkylakeX", CpuIsa::Avx512Bf16));
  EXPECT_FALSE(openblas_behind("Zen", CpuIsa::Avx2));
  EXPECT_FALSE(openblas_behind("Haswell", CpuIsa::Avx2));
  // A capped run (QLFT_CPU_ISA) compares with the cap; a baseline CPU never hands over.
  EXPECT_FALSE(openblas_behind("Haswell", CpuIsa::Baseline));
  EXPECT_FALSE(openblas_behind("Prescott", CpuIsa::Baseline));
}

TEST(F32Blas, ThisProcessDecidesFromItsOwnCore) {
  const std::string core = openblas_core();
  EXPECT_FALSE(core.empty());
  EXPECT_EQ(f32_blas_onednn_auto(), openblas_behind(core, cpu_isa())) << "core " << core;
}

namespace {

// C = alpha op(A) op(B) + beta C in double, the same row-major conventions.
std::vector<double> oracle(bool ta, bool tb, int M, int N, int K, float alpha,
                           const std::vector<float>& A, int lda, const std::vector<float>& B,
                           int ldb, float beta, const std::vector<float>& C, int ldc) {
  std::vector<double> out(size_t(M) * N);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = 0;
      for (int k = 0; k < K; ++k) {
        const double a = ta ? A[size_t(k) * lda + i] : A[size_t(i) * lda + k];
        const double b = tb ? B[size_t(j) * ldb + k] : B[size_t(k) * ldb + j];
        s += a * b;
      }
      out[size_t(i) * N + j] = double(alpha) * s + double(beta) * C[size_t(i) * ldc + j];
    }
  return out;
}

}  // namespace

TEST(F32Blas, OneDnnSgemmMatchesOracle) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  struct Shape {
    int M, N, K;
    float alpha, beta;
  };
  for (const Shape sh :
       {Shape{1, 1, 1, 1.f, 0.f}, Shape{13, 7, 29, 0.5f, 0.f}, Shape{37, 65, 70, 1.f, 1.f},
        Shape{64, 17, 5, -2.f, 0.25f}, Shape{130, 96, 33, 1.f, 1.f}})
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      const int M = sh.M, N = sh.N, K = sh.K;
      // Leading dimensions padded past the rows' widths.
      const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
      std::vector<float> A(size_t(ta ? K : M) * lda), B(size_t(tb ? N : K) * ldb),
          C(size_t(M) * ldc);
      for (float& v : A) v = nd(rng);
      for (float& v : B) v = nd(rng);
      for (float& v : C) v = nd(rng);
      const std::vector<double> want =
          oracle(ta, tb, M, N, K, sh.alpha, A, lda, B, ldb, sh.beta, C, ldc);
      sgemm_onednn(ta, tb, M, N, K, sh.alpha, A.data(), lda, B.data(), ldb, sh.beta, C.data(), ldc);
      double err = 0, ref = 1e-6;
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
          err = std::max(err, std::fabs(C[size_t(i) * ldc + j] - want[size_t(i) * N + j]));
          ref = std::max(ref, std::fabs(want[size_t(i) * N + j]));
        }
      EXPECT_LT(err / ref, 2e-6) << M << "x" << N << "x" << K << " ta " << ta << " tb " << tb;
    }
}
