// The AMX tile GEMM (backend/cpu/amx_gemm.h): its emulated execution on every CPU, its hardware
// execution where the CPU has AMX, against a plain triple loop. Operands are grid values k 2^-e
// (|k| <= 15, exact in bf16) whose products and sums are exact in fp32 in any order, so every
// comparison is exact: a wrong tile offset, pair order or causal bound moves whole values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backend/cpu/amx_gemm.h"
#include "core/error.h"
#include "core/half.h"
#include "support/test_support.h"

namespace {

using qlft::cpu::AmxCausal;
using qlft::cpu::AmxExec;

std::vector<float> grid(std::mt19937& rng, int64_t n, int e) {
  std::uniform_int_distribution<int> k(-15, 15);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = std::ldexp(float(k(rng)), -e);
  return v;
}

std::vector<uint16_t> bits(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = qlft::f32_to_bf16(v[i]);
  return o;
}

// B [K, N] row-major into the pair layout with ldb elements per pair row.
std::vector<uint16_t> pairs(const std::vector<float>& b, int64_t K, int64_t N, int64_t ldb) {
  std::vector<uint16_t> o(static_cast<size_t>(K / 2 * ldb), 0x7fc1);  // spare columns: NaN
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n)
      o[size_t(qlft::cpu::amx_vnni_at(k, n, ldb))] = qlft::f32_to_bf16(b[size_t(k * N + n)]);
  return o;
}

struct Case {
  int64_t M, N, K;
  AmxCausal causal;
  bool accumulate;
};

// The oracle: which k each element of C sums over, by amx_gemm.h's rules for 32 x 32 blocks
// (16 at the edges), and whether it is computed at all.
bool computed(const Case& c, int64_t m, int64_t n) {
  if (c.causal.kind != AmxCausal::ColsUpToRow) return true;
  const int64_t m0 = m / 32 * 32, last = std::min(c.M, m0 + 32) - 1;
  return n / 32 * 32 <= c.causal.d + last;
}
std::pair<int64_t, int64_t> k_range(const Case& c, int64_t m, int64_t n) {
  const int64_t m0 = m / 32 * 32, last = std::min(c.M, m0 + 32) - 1, n0 = n / 32 * 32;
  int64_t k0 = 0, k1 = c.K;
  if (c.causal.kind == AmxCausal::KUpToRow)
    k1 = std::clamp<int64_t>((c.causal.d + last + 1 + 31) / 32 * 32, 0, c.K);
  if (c.causal.kind == AmxCausal::KFromCol)
    k0 = std::min<int64_t>(std::max<int64_t>(n0 - c.causal.d, 0) / 32 * 32, c.K);
  return {k0, k1};
}

void check(AmxExec ex, const Case& c, uint32_t seed) {
  SCOPED_TRACE(::testing::Message()
               << "M " << c.M << " N " << c.N << " K " << c.K << " causal " << int(c.causal.kind)
               << " d " << c.causal.d << " accumulate " << c.accumulate);
  std::mt19937 rng(seed);
  const int64_t lda = c.K + 8, ldb = 2 * c.N + 32, ldc = c.N + 5;
  std::vector<float> a = grid(rng, c.M * lda, 3), b = grid(rng, c.K * c.N, 4);
  std::vector<float> c0 = grid(rng, c.M * ldc, 2);
  const std::vector<uint16_t> A = bits(a), B = pairs(b, c.K, c.N, ldb);
  std::vector<float> C = c0;
  qlft::cpu::amx_gemm_bf16(ex, c.M, c.N, c.K, A.data(), lda, B.data(), ldb, C.data(), ldc,
                           c.accumulate, c.causal);
  for (int64_t m = 0; m < c.M; ++m) {
    for (int64_t n = 0; n < c.N; ++n) {
      const float got = C[size_t(m * ldc + n)], before = c0[size_t(m * ldc + n)];
      if (!computed(c, m, n)) {
        ASSERT_EQ(got, before) << "skipped block written at " << m << ", " << n;
        continue;
      }
      const auto [k0, k1] = k_range(c, m, n);
      double want = c.accumulate ? before : 0.0;
      for (int64_t k = k0; k < k1; ++k)
        want += double(a[size_t(m * lda + k)]) * b[size_t(k * c.N + n)];
      ASSERT_EQ(double(got), want) << "C[" << m << ", " << n << "]";
    }
    for (int64_t n = c.N; n < ldc; ++n)
      ASSERT_EQ(C[size_t(m * ldc + n)], c0[size_t(m * ldc + n)]) << "spare column written";
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int64_t M : {16, 32, 48, 80})
    for (int64_t N : {16, 32, 80})
      for (int64_t K : {32, 64, 96})
        for (bool acc : {false, true}) out.push_back({M, N, K, {}, acc});
  // The causal kinds around their bounds: d from below the first block to past the last.
  for (int64_t d : {-40, -16, 0, 5, 31, 32, 47})
    for (auto kind : {AmxCausal::ColsUpToRow, AmxCausal::KUpToRow, AmxCausal::KFromCol})
      for (bool acc : {false, true}) out.push_back({80, 80, 96, {kind, d}, acc});
  return out;
}

TEST(AmxGemm, EmulatedMatchesTheExactProducts) {
  uint32_t seed = 1;
  for (const Case& c : cases()) check(AmxExec::Emulated, c, seed++);
}

TEST(AmxGemm, HardwareMatchesTheExactProducts) {
  if (!qlft::cpu::amx_hardware()) {
    QLFT_SKIP("isa-absent") << "no AMX tiles on this CPU (or QLFT_CPU_ISA)";
  }
  uint32_t seed = 1;
  for (const Case& c : cases()) check(AmxExec::Hardware, c, seed++);
}

// The causal kinds compute exactly what the full product gives where the operands are zero
// outside the causal region (attention's masked probabilities): P V with P zero past the
// diagonal, dK^T = Q^T dS with dS zero there.
TEST(AmxGemm, CausalBoundsLoseNothingOfTheMaskedProduct) {
  std::mt19937 rng(7);
  for (int64_t d : {0, 13, 32, 64}) {
    SCOPED_TRACE(::testing::Message() << "d " << d);
    const int64_t M = 96, K = 160, N = 64;  // rows (queries) x keys, then x head dims
    std::vector<float> p = grid(rng, M * K, 3), v = grid(rng, K * N, 2);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < K; ++j)
        if (j > d + i) p[size_t(i * K + j)] = 0.f;  // masked
    const std::vector<uint16_t> P = bits(p), V = pairs(v, K, N, 2 * N);
    std::vector<float> full(size_t(M * N)), part(size_t(M * N));
    qlft::cpu::amx_gemm_bf16(AmxExec::Emulated, M, N, K, P.data(), K, V.data(), 2 * N, full.data(),
                             N, false);
    qlft::cpu::amx_gemm_bf16(AmxExec::Emulated, M, N, K, P.data(), K, V.data(), 2 * N, part.data(),
                             N, false, {AmxCausal::KUpToRow, d});
    EXPECT_EQ(full, part) << "P V";
    // dV^T [N, keys] = dO^T [N, M] P [M, keys]: k over the query rows, from the key's diagonal.
    std::vector<float> dot = grid(rng, N * M, 2);
    const std::vector<uint16_t> DOT = bits(dot), PP = pairs(p, M, K, 2 * K);
    std::vector<float> fullv(size_t(N * K)), partv(size_t(N * K));
    qlft::cpu::amx_gemm_bf16(AmxExec::Emulated, N, K, M, DOT.data(), M, PP.data(), 2 * K,
                             fullv.data(), K, false);
    qlft::cpu::amx_gemm_bf16(AmxExec::Emulated, N, K, M, DOT.data(), M, PP.data(), 2 * K,
                             partv.data(), K, false, {AmxCausal::KFromCol, d});
    EXPECT_EQ(fullv, partv) << "dO^T P";
  }
}

TEST(AmxGemm, RejectsShapesOffTheTiles) {
  std::vector<uint16_t> a(64 * 64), b(64 * 64);
  std::vector<float> c(64 * 64);
  for (auto [M, N, K] : {std::array<int64_t, 3>{15, 16, 32}, {16, 17, 32}, {16, 16, 31}}) {
    try {
      qlft::cpu::amx_gemm_bf16(AmxExec::Emulated, M, N, K, a.data(), 64, b.data(), 64, c.data(), 64,
                               false);
      FAIL() << "accepted M " << M << " N " << N << " K " << K;
    } catch (const qlft::Error& e) {
      EXPECT_EQ(e.status(), QLFT_ERR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(e.what()).find("multiples of 16"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
