// The bf16 GEMM path of the CPU backend.
//  - gemm_bf16 against a scalar double oracle on the same bf16 values: random ragged shapes,
//    transposes, padded leading dimensions, alpha/beta, M = 1, K not a multiple of 16.
//  - The backend with precision bf16 against the fp32 backend fed bf16-rounded activations and
//    weights (the numerics bf16 autocast defines): linear_fwd / linear_bwd / head_logits /
//    linear_cross_entropy for every weight kind; the LoRA path (bf16 GEMMs with its
//    intermediates rounded) against a double oracle on grid values, with dropout.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backend/autocast_backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/gemm_bf16.h"
#include "backend/dropout.h"
#include "core/cpu_isa.h"
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

FVec rounded(const FVec& v) {
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

// oneDNN has no bf16 matmul below AVX-512 (an AVX2-only CPU, or QLFT_CPU_ISA=avx2): the tests of
// that engine report the absent ISA path as skipped; the sgemm engine is tested everywhere.
#define SKIP_WITHOUT_ONEDNN_BF16()                                                     \
  do {                                                                                 \
    if (!cpu::gemm_bf16_available()) {                                                 \
      QLFT_SKIP("isa-absent") << "ISA path absent: oneDNN has no bf16 matmul at isa "  \
                              << cpu_isa_name(cpu_isa())                               \
                              << " (CPU: " << cpu_isa_name(cpu_isa_detected()) << ")"; \
    }                                                                                  \
  } while (0)

TEST(GemmBf16, MatchesDoubleOracleOnRandomShapes) {
  SKIP_WITHOUT_ONEDNN_BF16();
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
  SKIP_WITHOUT_ONEDNN_BF16();
  // Sizes past the kernels' blocking (M 32, N 64, K 32..64 blocks) with ragged tails.
  run_gemm({false, true, 203, 517, 301, 0, 3, 1, 1.f, 0.f}, 1);
  run_gemm({false, false, 129, 300, 260, 5, 0, 0, 1.f, 1.f}, 2);
  run_gemm({true, false, 33, 257, 515, 0, 0, 0, 0.5f, 1.f}, 3);
}

// gemm_bf16_out16: C written as bf16 by oneDNN. Against gemm_bf16's fp32 C rounded (the same
// sums, maybe in another order: within one bf16 step, nearly always the same bits) and within one
// bf16 step of the double oracle rounded; C's padding columns untouched. Random ragged shapes.
void run_gemm_out16(const GemmCase& c, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "ta " << c.ta << " tb " << c.tb << " M " << c.M << " N "
                                    << c.N << " K " << c.K << " alpha " << c.alpha);
  Rng rng(seed);
  const int64_t a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
  const int64_t b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
  const int64_t lda = a_cols + c.pad_a, ldb = b_cols + c.pad_b, ldc = c.N + c.pad_c;
  const auto A = to_bf16(rng.normal(size_t(a_rows * lda))),
             B = to_bf16(rng.normal(size_t(b_rows * ldb)));
  FVec C(size_t(c.M * ldc), NAN);
  std::vector<uint16_t> C16(size_t(c.M * ldc), 0x7fc1);
  MemoryTracker tr;
  cpu::gemm_bf16(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, 0.f, C.data(),
                 ldc, &tr);
  cpu::gemm_bf16_out16(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, C16.data(),
                       ldc, &tr);
  EXPECT_GT(
      cpu::gemm_bf16_out16_scratchpad_size(c.ta, c.tb, c.M, c.N, c.K, lda, ldb, ldc, c.alpha) + 1,
      0u);
  int off = 0;
  auto step = [](uint16_t a, uint16_t b) { return std::abs(int(int16_t(a)) - int(int16_t(b))); };
  for (int i = 0; i < c.M; ++i) {
    for (int j = 0; j < c.N; ++j) {
      const size_t e = size_t(i * ldc + j);
      double s = 0;
      for (int k = 0; k < c.K; ++k)
        s += double(bf16_to_f32(c.ta ? A[size_t(k * lda + i)] : A[size_t(i * lda + k)])) *
             bf16_to_f32(c.tb ? B[size_t(j * ldb + k)] : B[size_t(k * ldb + j)]);
      const uint16_t want = f32_to_bf16(float(c.alpha * s));
      ASSERT_LE(step(C16[e], f32_to_bf16(C[e])), 1) << "at (" << i << ", " << j << ")";
      ASSERT_LE(step(C16[e], want), 1)
          << "at (" << i << ", " << j << ") got " << bf16_to_f32(C16[e]) << " want " << c.alpha * s;
      off += C16[e] != f32_to_bf16(C[e]);
    }
    for (int64_t j = c.N; j < ldc; ++j) ASSERT_EQ(C16[size_t(i * ldc + j)], 0x7fc1) << "pad";
  }
  EXPECT_LE(off, c.M * c.N / 50 + 1) << "more than a few roundings on the other side";
}

TEST(GemmBf16, Out16MatchesRoundedFp32OnRandomShapes) {
  SKIP_WITHOUT_ONEDNN_BF16();
  Rng rng(17);
  int n = 0;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (int rep = 0; rep < 4; ++rep) {
        GemmCase c{};
        c.ta = ta;
        c.tb = tb;
        c.M = rep == 0 ? 1 : rng.uniform_int(1, 70);
        c.N = rep == 1 ? 1 : rng.uniform_int(1, 90);
        c.K = rep == 2 ? 35 : rng.uniform_int(1, 100);
        c.pad_a = rep % 2 ? rng.uniform_int(1, 9) : 0;
        c.pad_b = rep % 3 ? rng.uniform_int(1, 9) : 0;
        c.pad_c = rep % 2 ? 0 : rng.uniform_int(1, 5);
        c.alpha = rep == 3 ? 0.375f : 1.f;
        run_gemm_out16(c, 300 + n++);
        if (HasFatalFailure()) return;
      }
  // Past the kernels' blocking, with ragged tails (the linear layers' shape: x W^T).
  run_gemm_out16({false, true, 203, 517, 301, 0, 3, 1, 1.f, 0.f}, 1);
  run_gemm_out16({false, true, 130, 96, 608, 0, 0, 0, 1.f, 0.f}, 2);
}

TEST(GemmBf16, BetaZeroIgnoresNaNInC) {
  SKIP_WITHOUT_ONEDNN_BF16();
  const int M = 3, N = 5, K = 17;
  Rng rng(3);
  auto A = to_bf16(rng.normal(M * K)), B = to_bf16(rng.normal(K * N));
  FVec C(M * N, std::nanf(""));
  cpu::gemm_bf16(false, false, M, N, K, 1.f, A.data(), K, B.data(), N, 0.f, C.data(), N);
  for (float v : C) EXPECT_TRUE(std::isfinite(v));
}

TEST(GemmBf16, CachesPrimitivesAndRejectsBadStrides) {
  SKIP_WITHOUT_ONEDNN_BF16();
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
  if (!cpu::gemm_bf16_native()) {
    QLFT_SKIP("isa-absent") << "no native bf16 on this CPU";
  }
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

// ---- bf16 converter ---------------------------------------------------------------------------

TEST(GemmBf16, BulkConverterMatchesScalarRounding) {
  // Ties, NaN, inf, subnormals and random values through the vector and the tail loops.
  FVec v = {0.f,     -0.f,     1.f,       1.00390625f, 1.01171875f, 3.0e38f, -3.4e38f, 1e-40f,
            -1e-39f, INFINITY, -INFINITY, NAN,         -NAN,        65504.f, 1.f / 3,  -2.5f};
  Rng rng(9);
  FVec r = rng.normal(1000, 100.f);
  v.insert(v.end(), r.begin(), r.end());
  for (uint32_t u : {0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x7fc00001u, 0xff800001u}) {
    float f;
    std::memcpy(&f, &u, 4);
    v.push_back(f);
  }
  std::vector<uint16_t> bulk(v.size());
  f32_to_bf16_n(v.data(), bulk.data(), v.size());
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(bulk[i], f32_to_bf16(v[i])) << "element " << i;
  FVec rt(v.size());
  round_through_n(DType::BF16, v.data(), rt.data(), v.size());
  for (size_t i = 0; i < v.size(); ++i)
    ASSERT_EQ(f32_bits(rt[i]), f32_bits(bf16_to_f32(f32_to_bf16(v[i])))) << "element " << i;
  round_through_n(DType::BF16, v.data(), v.data(), v.size());  // in place
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(f32_bits(v[i]), f32_bits(rt[i])) << i;
}

// ---- the backend at precision bf16 -------------------------------------------------------------

using Engine = cpu::CpuTuning::Bf16Gemm;
using AttnAmx = cpu::CpuTuning::AttnAmx;

// A weight of each kind with its exact fp32 dequantization (the reference rounds that to bf16).
struct KindWeight {
  QWeight q;
  FVec deq;  // dequantize_rows of q
};

KindWeight make_weight(MemoryTracker* tr, const std::string& kind, int N, int K, uint64_t seed) {
  Rng rng(seed);
  FVec W = rng.normal(size_t(N) * K, 0.2f);
  KindWeight w;
  if (kind == "f32") {
    w.q = qweight_from_f32(tr, W.data(), N, K, QuantKind::F32);
  } else if (kind == "nf4") {
    w.q = qweight_from_f32(tr, W.data(), N, K, QuantKind::NF4, 64, true);
  } else if (kind == "int8") {
    w.q = qweight_from_f32(tr, W.data(), N, K, QuantKind::INT8);
  } else {
    // GGUF blocks of 32 with random codes and small fp16 scales: Q8_0 = {d, int8[32]},
    // Q4_1 = {d, m, nibbles[16]}.
    const bool q8 = kind == "q8_0";
    const int bytes = q8 ? 34 : 20;
    const int64_t nb = int64_t(N) * K / 32;
    std::vector<uint8_t> raw(size_t(nb * bytes));
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* blk = raw.data() + b * bytes;
      uint16_t d = f32_to_f16(0.01f + 0.02f * std::fabs(rng.normal(1)[0]));
      uint16_t m = f32_to_f16(-0.1f * std::fabs(rng.normal(1)[0]));
      std::memcpy(blk, &d, 2);
      if (!q8) std::memcpy(blk + 2, &m, 2);
      for (int i = q8 ? 2 : 4; i < bytes; ++i) blk[i] = uint8_t(rng.uniform_int(0, 255));
    }
    w.q = qweight_from_ggml(tr, q8 ? 8u : 3u, raw.data(), N, K);  // GGML_TYPE_Q8_0 / Q4_1
  }
  w.deq.resize(size_t(N) * K);
  w.q.dequantize_rows(0, N, w.deq.data());
  return w;
}

struct Pair {
  MemoryTracker tr;
  std::unique_ptr<Backend> bf = make_cpu_backend(&tr);   // precision bf16
  std::unique_ptr<Backend> ref = make_cpu_backend(&tr);  // fp32, fed rounded values
  // attn_block_q, attn_stair_rows: the bf16 backend's attention tile rows and staircase steps
  // (0: its defaults).
  Pair(Engine e, bool small_blocks, int64_t attn_block_q = 0, int64_t attn_stair_rows = 0,
       AttnAmx amx = AttnAmx::Off) {
    auto& c = static_cast<cpu::CpuBackend&>(*bf);
    c.set_precision(DType::BF16);
    c.tune.bf16_gemm = e;
    c.tune.attn_amx = amx;
    if (attn_block_q > 0) c.tune.attn_block_q = attn_block_q;
    if (attn_stair_rows > 0) c.tune.attn_stair_rows = c.tune.attn_stair_rows_bf16 = attn_stair_rows;
    if (small_blocks)
      for (auto* b : {&c, &static_cast<cpu::CpuBackend&>(*ref)}) {
        b->tune.panel_bytes = 1;
        b->tune.panel_min_rows = 1;
        b->tune.panel_max_rows = 8;  // several panels, a ragged last one
        b->tune.drop_chunk_bytes = 9 * 4 * 64;
        b->tune.ce_logits_bytes = 16 * 4 * 5;
      }
  }
};

const char* engine_name(Engine e) {
  return e == Engine::OneDnn ? "onednn" : "sgemm";
}

// Tolerance: same bf16 products, fp32 sums in another order.
constexpr double kTol = 2e-5;

// Values k * 2^-e with |k| <= 15: exact in bf16, and sums of their products are exact in fp32 in
// any order. The LoRA path's fp32 intermediates (xa, g) are then the same bits on every engine and
// summation order, so their bf16 rounding is deterministic and the oracle can reproduce it.
FVec grid(Rng& rng, size_t n, int e) {
  FVec v(n);
  for (float& x : v) x = std::ldexp(float(rng.uniform_int(-15, 15)), -e);
  return v;
}

double bf(double v) {
  return bf16_to_f32(f32_to_bf16(float(v)));
}

// The LoRA part of a bf16 linear layer in double, as cpu_linear.cpp defines it: x (after dropout),
// dy, A, B rounded to bf16 (grid values already are), xa and g rounded where they enter the next
// GEMM. `round_mid` false: the intermediates not rounded (to show the rounding is visible).
struct LoraOracle {
  Vec y, xa, dx, dA, dB;  // contributions: y += y, dx += dx, dA += dA, dB += dB
};
LoraOracle lora_oracle(const FVec& x, const FVec& dy, const LoraRef& l, int M, int N, int K,
                       bool round_mid) {
  const int r = l.r;
  const double inv = 1.0 / (1.0 - l.dropout_p);
  auto drop = [&](int i, int k) {  // bf16 rounding of the dropped-out input
    return lora_dropout_keep(l.dropout_seed, i, k, l.dropout_p) ? bf(x[size_t(i) * K + k] * inv)
                                                                : 0.0;
  };
  auto mid = [&](double v) { return round_mid ? bf(v) : v; };
  LoraOracle o;
  o.xa.assign(size_t(M) * r, 0);
  o.y.assign(size_t(M) * N, 0);
  o.dx.assign(size_t(M) * K, 0);
  o.dA.assign(size_t(r) * K, 0);
  o.dB.assign(size_t(N) * r, 0);
  Vec g(size_t(M) * r, 0);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < r; ++j) {
      for (int k = 0; k < K; ++k) o.xa[i * r + j] += drop(i, k) * l.A[j * K + k];
      for (int n = 0; n < N; ++n) g[i * r + j] += double(dy[size_t(i) * N + n]) * l.B[n * r + j];
    }
  for (int i = 0; i < M; ++i)
    for (int n = 0; n < N; ++n)
      for (int j = 0; j < r; ++j) {
        o.y[i * N + n] += l.scale * mid(o.xa[i * r + j]) * l.B[n * r + j];
        o.dB[n * r + j] += l.scale * double(dy[size_t(i) * N + n]) * mid(o.xa[i * r + j]);
      }
  for (int i = 0; i < M; ++i)
    for (int k = 0; k < K; ++k) {
      const bool keep = lora_dropout_keep(l.dropout_seed, i, k, l.dropout_p);
      for (int j = 0; j < r; ++j) {
        o.dA[j * K + k] += l.scale * mid(g[i * r + j]) * drop(i, k);
        if (keep) o.dx[i * K + k] += l.scale * inv * mid(g[i * r + j]) * l.A[j * K + k];
      }
    }
  return o;
}

// got against base (the fp32 reference's values, without LoRA) + lora, relative to the largest.
double err_with(const FVec& got, const FVec& base, const Vec& lora) {
  double err = 0, scale = 1e-6;
  for (size_t i = 0; i < got.size(); ++i) {
    const double want = double(base[i]) + lora[i];
    err = std::max(err, std::fabs(got[i] - want));
    scale = std::max(scale, std::fabs(want));
  }
  return err / scale;
}

// scale 4 (a power of two) without dropout takes the fused LoRA GEMMs (cpu_linear.cpp), other
// scales and dropout the separate ones; small_blocks: many weight panels (the backward then
// keeps its GEMMs separate too); db_rows: CpuTuning::bf16_lora_db_rows (dB through its
// transpose).
void run_linear_bf16(Engine e, const std::string& kind, int M, float p, uint64_t seed,
                     float scale = 4.f, bool small_blocks = true, bool db_rows = false) {
  SCOPED_TRACE(::testing::Message()
               << engine_name(e) << " " << kind << " M " << M << " p " << p << " scale " << scale
               << " small blocks " << small_blocks << " dB by rows " << db_rows);
  Pair px(e, small_blocks);
  static_cast<cpu::CpuBackend&>(*px.bf).tune.bf16_lora_db_rows = db_rows;
  const bool ggml = kind == "q8_0" || kind == "q4_1";
  const int K = ggml ? 64 : 50, N = 27, r = 4;
  KindWeight w = make_weight(&px.tr, kind, N, K, seed);
  QWeight wref = qweight_from_f32(&px.tr, rounded(w.deq).data(), N, K, QuantKind::F32);
  Rng rng(seed + 1);
  // x and dy: normal in the base GEMMs' share (any value), grid values for the LoRA path.
  FVec x = grid(rng, size_t(M) * K, 4), bias = rng.normal(N);
  // A LoRA part about as large as the base part, so its rounding shows in y.
  FVec A = grid(rng, size_t(r) * K, 4), B = grid(rng, size_t(N) * r, 4);
  LoraRef l;
  l.A = A.data();
  l.B = B.data();
  l.r = r;
  l.scale = scale;
  l.dropout_p = p;
  l.dropout_seed = seed * 7 + 1;
  FVec dy = grid(rng, size_t(M) * N, 6);
  const LoraOracle o = lora_oracle(x, dy, l, M, N, K, true);
  const LoraOracle u = lora_oracle(x, dy, l, M, N, K, false);

  // Base part: the fp32 backend on the rounded weight (x and dy are bf16 values already).
  FVec y(size_t(M) * N), yb(y.size()), xa(size_t(M) * r);
  px.bf->linear_fwd(w.q, bias.data(), &l, CMatF(x.data(), M, K), MatF(y.data(), M, N), xa.data());
  px.ref->linear_fwd(wref, bias.data(), nullptr, CMatF(x.data(), M, K), MatF(yb.data(), M, N),
                     nullptr);
  EXPECT_LT(err_with(y, yb, o.y), kTol) << "y";
  EXPECT_LT(err_with(xa, FVec(xa.size()), o.xa), 1e-7) << "xa";
  // The rounding of xa is visible: the oracle without it is far off.
  EXPECT_GT(err_with(y, yb, u.y), 10 * kTol) << "xa's rounding not visible";
  // Without LoRA: the base part alone, and the unrounded weight is far off.
  FVec y0(y.size()), yu(y.size());
  px.bf->linear_fwd(w.q, bias.data(), nullptr, CMatF(x.data(), M, K), MatF(y0.data(), M, N),
                    nullptr);
  EXPECT_LT(max_rel_error(y0.data(), yb.data(), y0.size()), kTol) << "y without LoRA";
  QWeight wu = qweight_from_f32(&px.tr, w.deq.data(), N, K, QuantKind::F32);
  px.ref->linear_fwd(wu, bias.data(), nullptr, CMatF(x.data(), M, K), MatF(yu.data(), M, N),
                     nullptr);
  EXPECT_GT(max_rel_error(y0.data(), yu.data(), y0.size()), 10 * kTol) << "rounding not visible";

  // linear_fwd_to_16: y without bias rounded to bf16. oneDNN's fused path (no bias, fusable
  // LoRA) has its GEMM write the bf16 output (the same sums, maybe in another order: within
  // one bf16 step of y's rounding, nearly always the same bits), y's fp32 room untouched; other
  // paths give exactly y's rounding. With a bias: linear_fwd then rounding, bit for bit.
  {
    FVec yn(y.size()), ynb(y.size()), xan(xa.size());
    px.bf->linear_fwd(w.q, nullptr, &l, CMatF(x.data(), M, K), MatF(yn.data(), M, N), xan.data());
    px.ref->linear_fwd(wref, nullptr, nullptr, CMatF(x.data(), M, K), MatF(ynb.data(), M, N),
                       nullptr);
    const bool gemm_writes = e == Engine::OneDnn && scale == 4.f && p == 0.f;
    for (const float* bias_p :
         {static_cast<const float*>(nullptr), static_cast<const float*>(bias.data())}) {
      SCOPED_TRACE(bias_p ? "linear_fwd_to_16 with bias" : "linear_fwd_to_16");
      const FVec& want = bias_p ? y : yn;
      std::vector<uint16_t> y16(y.size(), 0x7fc1);
      FVec room(y.size(), NAN), xa16(xa.size(), NAN);
      px.bf->linear_fwd_to_16(w.q, bias_p, &l, CMatF(x.data(), M, K), MatF(room.data(), M, N),
                              xa16.data(), DType::BF16, y16.data());
      EXPECT_EQ(0, std::memcmp(xa16.data(), xa.data(), xa.size() * 4)) << "xa";
      int off = 0;
      FVec widened(y.size());
      for (size_t i = 0; i < y16.size(); ++i) {
        const int d = std::abs(int(int16_t(y16[i])) - int(int16_t(f32_to_bf16(want[i]))));
        ASSERT_LE(d, gemm_writes && !bias_p ? 1 : 0) << i;
        off += d;
        widened[i] = bf16_to_f32(y16[i]);
        if (gemm_writes && !bias_p) {
          ASSERT_TRUE(std::isnan(room[i])) << "y written " << i;
        }
      }
      EXPECT_LE(off, int(y16.size()) / 50 + 1);
      // Against the double oracle: within bf16's rounding of it.
      if (!bias_p) {
        EXPECT_LT(err_with(widened, ynb, o.y), 8e-3) << "y16 against the oracle";
      }
    }
  }

  const FVec dx0 = rng.normal(size_t(M) * K), dA0 = rng.normal(A.size()),
             dB0 = rng.normal(B.size());
  FVec dx = dx0, dA = dA0, dB = dB0, dxb = dx0;
  px.bf->linear_bwd(w.q, &l, CMatF(x.data(), M, K), xa.data(), CMatF(dy.data(), M, N),
                    MatF(dx.data(), M, K), dA.data(), dB.data());
  px.ref->linear_bwd(wref, nullptr, CMatF(x.data(), M, K), nullptr, CMatF(dy.data(), M, N),
                     MatF(dxb.data(), M, K), nullptr, nullptr);
  EXPECT_LT(err_with(dx, dxb, o.dx), kTol) << "dx";
  EXPECT_LT(err_with(dA, dA0, o.dA), kTol) << "dA";
  EXPECT_LT(err_with(dB, dB0, o.dB), kTol) << "dB";
  EXPECT_GT(err_with(dA, dA0, u.dA), 10 * kTol) << "g's rounding not visible";

  // dy given in bf16 (Backend::next_dy_16): dy's fp32 values never read (NaN here), the
  // copy's spare columns NaN before the call (the fused path writes them). At the stride the
  // backend asks for: the same bits; at a wider one the GEMMs see another leading dimension
  // (oneDNN may then sum dB into its old values in another order).
  // The fused width: N + r padded to 32 for oneDNN's bf16 operands, unpadded for sgemm's fp32.
  const int64_t asked = px.bf->grad_16_stride(w.q, &l);
  EXPECT_EQ(asked,
            scale == 4.f && p == 0.f && !small_blocks ? (e == Engine::OneDnn ? 32 : N + r) : N);
  for (int64_t ld : {asked, int64_t(N) + 7}) {
    SCOPED_TRACE(::testing::Message() << "next_dy_16 stride " << ld);
    ASSERT_GE(ld, N);
    std::vector<uint16_t> dy16(size_t(M * ld), uint16_t(0x7fc1));
    for (int i = 0; i < M; ++i)
      for (int n = 0; n < N; ++n) dy16[size_t(i * ld + n)] = f32_to_bf16(dy[size_t(i) * N + n]);
    const FVec nan_dy(dy.size(), NAN);
    FVec dx16 = dx0, dA16 = dA0, dB16 = dB0;
    px.bf->next_dy_16(DType::BF16, View2<uint16_t>(dy16.data(), M, N, ld));
    px.bf->linear_bwd(w.q, &l, CMatF(x.data(), M, K), xa.data(), CMatF(nan_dy.data(), M, N),
                      MatF(dx16.data(), M, K), dA16.data(), dB16.data());
    if (ld == asked) {
      EXPECT_EQ(0, std::memcmp(dx16.data(), dx.data(), dx.size() * 4)) << "dx";
      EXPECT_EQ(0, std::memcmp(dA16.data(), dA.data(), dA.size() * 4)) << "dA";
      EXPECT_EQ(0, std::memcmp(dB16.data(), dB.data(), dB.size() * 4)) << "dB";
    } else {
      EXPECT_LT(err_with(dx16, dxb, o.dx), kTol) << "dx";
      EXPECT_LT(err_with(dA16, dA0, o.dA), kTol) << "dA";
      EXPECT_LT(err_with(dB16, dB0, o.dB), kTol) << "dB";
    }
    for (int i = 0; i < M; ++i)  // dy's own columns untouched
      for (int n = 0; n < N; ++n)
        ASSERT_EQ(dy16[size_t(i * ld + n)], f32_to_bf16(dy[size_t(i) * N + n]));
  }
  // next_dx_16 (after defer_zero, as the runner calls them): where taken (the fused dx GEMM on
  // oneDNN) the GEMM writes dx rounded (within one bf16 step of the fresh fp32 dx's rounding,
  // nearly always the same bits) and leaves dx unwritten; dA and dB as without it.
  {
    FVec dxf(dx0.size(), NAN), dAf = dA0, dBf = dB0;
    ASSERT_TRUE(px.bf->defer_zero(dxf.data(), int64_t(dxf.size())));
    px.bf->linear_bwd(w.q, &l, CMatF(x.data(), M, K), xa.data(), CMatF(dy.data(), M, N),
                      MatF(dxf.data(), M, K), dAf.data(), dBf.data());
    std::vector<uint16_t> dx16(dx0.size(), 0x7fc1);
    FVec dxn(dx0.size(), NAN), dAn = dA0, dBn = dB0;
    ASSERT_TRUE(px.bf->defer_zero(dxn.data(), int64_t(dxn.size())));
    const bool takes = px.bf->next_dx_16(DType::BF16, dx16.data(), w.q, &l);
    EXPECT_EQ(takes, e == Engine::OneDnn && scale == 4.f && p == 0.f && !small_blocks);
    px.bf->linear_bwd(w.q, &l, CMatF(x.data(), M, K), xa.data(), CMatF(dy.data(), M, N),
                      MatF(dxn.data(), M, K), dAn.data(), dBn.data());
    EXPECT_EQ(0, std::memcmp(dAn.data(), dAf.data(), dAf.size() * 4)) << "dA, next_dx_16";
    EXPECT_EQ(0, std::memcmp(dBn.data(), dBf.data(), dBf.size() * 4)) << "dB, next_dx_16";
    int off = 0;
    for (size_t i = 0; i < dxf.size(); ++i) {
      if (!takes) {
        ASSERT_EQ(dx16[i], 0x7fc1) << i;
        ASSERT_EQ(f32_bits(dxn[i]), f32_bits(dxf[i])) << i;
        continue;
      }
      const int d = std::abs(int(int16_t(dx16[i])) - int(int16_t(f32_to_bf16(dxf[i]))));
      ASSERT_LE(d, 1) << i;
      off += d;
      ASSERT_TRUE(std::isnan(dxn[i])) << "dx written " << i;
    }
    EXPECT_LE(off, int(dxf.size()) / 50 + 1);
  }

  // Without dx (no fused GEMM) and without LoRA.
  {
    std::vector<uint16_t> dy16(size_t(M) * N);
    for (size_t i = 0; i < dy16.size(); ++i) dy16[i] = f32_to_bf16(dy[i]);
    const FVec nan_dy(dy.size(), NAN);
    FVec dA4 = dA0, dB4 = dB0, dA5 = dA0, dB5 = dB0, dx4 = dx0, dx5 = dx0;
    px.bf->linear_bwd(w.q, &l, CMatF(x.data(), M, K), xa.data(), CMatF(dy.data(), M, N), MatF(),
                      dA4.data(), dB4.data());
    px.bf->next_dy_16(DType::BF16, View2<uint16_t>(dy16.data(), M, N));
    px.bf->linear_bwd(w.q, &l, CMatF(x.data(), M, K), xa.data(), CMatF(nan_dy.data(), M, N), MatF(),
                      dA5.data(), dB5.data());
    EXPECT_EQ(0, std::memcmp(dA4.data(), dA5.data(), dA4.size() * 4)) << "dA, no dx";
    EXPECT_EQ(0, std::memcmp(dB4.data(), dB5.data(), dB4.size() * 4)) << "dB, no dx";
    px.bf->linear_bwd(w.q, nullptr, CMatF(x.data(), M, K), nullptr, CMatF(dy.data(), M, N),
                      MatF(dx4.data(), M, K), nullptr, nullptr);
    px.bf->next_dy_16(DType::BF16, View2<uint16_t>(dy16.data(), M, N));
    px.bf->linear_bwd(w.q, nullptr, CMatF(x.data(), M, K), nullptr, CMatF(nan_dy.data(), M, N),
                      MatF(dx5.data(), M, K), nullptr, nullptr);
    EXPECT_EQ(0, std::memcmp(dx4.data(), dx5.data(), dx4.size() * 4)) << "dx, no LoRA";
  }

  // Without LoRA, without xa from the forward pass, without dx.
  FVec dx2 = dx0, dx2b = dx0;
  px.bf->linear_bwd(w.q, nullptr, CMatF(x.data(), M, K), nullptr, CMatF(dy.data(), M, N),
                    MatF(dx2.data(), M, K), nullptr, nullptr);
  EXPECT_LT(max_rel_error(dx2.data(), dxb.data(), dx2.size()), kTol) << "dx without LoRA";
  FVec dA3(A.size()), dB3(B.size());
  px.bf->linear_bwd(w.q, &l, CMatF(x.data(), M, K), nullptr, CMatF(dy.data(), M, N), MatF(),
                    dA3.data(), dB3.data());
  EXPECT_LT(err_with(dA3, FVec(dA3.size()), o.dA), kTol) << "dA, no dx";
  EXPECT_LT(err_with(dB3, FVec(dB3.size()), o.dB), kTol) << "dB, recomputed xa";
}

class Bf16Kinds : public ::testing::TestWithParam<std::tuple<Engine, std::string>> {};

TEST_P(Bf16Kinds, LinearMatchesFp32OnRoundedValues) {
  auto [e, kind] = GetParam();
  if (e == Engine::OneDnn) SKIP_WITHOUT_ONEDNN_BF16();
  run_linear_bf16(e, kind, 37, 0.f, 11);
  run_linear_bf16(e, kind, 37, 0.f, 14, 4.f, false);   // fused forward and backward
  run_linear_bf16(e, kind, 37, 0.f, 15, 1.5f, false);  // separate LoRA GEMMs
  run_linear_bf16(e, kind, 37, 0.5f, 12);  // 1 / (1 - p) exact: dropped values stay on the grid
  run_linear_bf16(e, kind, 1, 0.5f, 13);
  run_linear_bf16(e, kind, 37, 0.f, 16, 4.f, false, true);  // dB by rows: fused,
  run_linear_bf16(e, kind, 37, 0.5f, 17, 4.f, true, true);  // separate with dropout
}

// dh as precision bf16's one walk over the head defines it, in double (h and the head rows W
// already bf16 values): per row, E = bf16(exp(logit - K ln 2)) for K = ceil(max / ln 2), summed
// times the head rows, then dh += gs (acc / sum of exp(logit - K ln 2) - W[target]). No panels:
// the backend's shifts are multiples of ln 2 (ce_acc_shift), so its rounding is this one however
// the head is cut. tol: each element's bound, 1e-5 of the sum of its terms' magnitudes (fp32
// sums, the backend's fp32 logits and exp) plus, for each E within 3e-5 (relative) of a bf16
// rounding midpoint, its rounding step: the backend's fp32 value of that one may round either
// way.
struct CeDhOracle {
  Vec want, tol;
};
CeDhOracle ce_dh_one_walk_oracle(const FVec& h, const FVec& W, const std::vector<int32_t>& t, int M,
                                 int H, int V, float gs, const FVec& dh0) {
  CeDhOracle o;
  o.want.assign(h.size(), 0.0);
  o.tol.assign(h.size(), 0.0);
  for (size_t i = 0; i < h.size(); ++i) {
    o.want[i] = dh0[i];
    o.tol[i] = 1e-6 * std::fabs(dh0[i]);
  }
  for (int i = 0; i < M; ++i) {
    if (t[size_t(i)] == -100) continue;
    Vec lg(static_cast<size_t>(V));
    double m = -INFINITY;
    for (int v = 0; v < V; ++v) {
      double s = 0;
      for (int c = 0; c < H; ++c) s += double(h[size_t(i * H + c)]) * W[size_t(v * H + c)];
      lg[size_t(v)] = s;
      m = std::max(m, s);
    }
    const double shift = std::ceil(m / std::log(2.0)) * std::log(2.0);
    double sum = 0;
    Vec acc(size_t(H), 0.0), mag(size_t(H), 0.0), amb(size_t(H), 0.0);
    for (int v = 0; v < V; ++v) {
      const double e = std::exp(lg[size_t(v)] - shift), er = bf(e);
      sum += e;
      // The bf16 step at e, and whether e is near the midpoint between two bf16 values.
      const double step = std::ldexp(1.0, std::ilogb(e) - 7);
      const double frac = (e - std::floor(e / step) * step) / step;
      const bool near = std::fabs(frac - 0.5) < 3e-5 * e / step;
      for (int c = 0; c < H; ++c) {
        const double w = W[size_t(v * H + c)];
        acc[size_t(c)] += er * w;
        mag[size_t(c)] += std::fabs(er * w);
        if (near) amb[size_t(c)] += step * std::fabs(w);
      }
    }
    const int tg = t[size_t(i)];
    for (int c = 0; c < H; ++c) {
      const double w = W[size_t(tg * H + c)];
      o.want[size_t(i * H + c)] += gs * (acc[size_t(c)] / sum - w);
      o.tol[size_t(i * H + c)] +=
          gs * (1e-5 * (mag[size_t(c)] / sum + std::fabs(w)) + amb[size_t(c)] / sum);
    }
  }
  return o;
}

// Elements of dh outside the oracle's bounds (at most 5 reported).
int ce_dh_outside(const FVec& dh, const CeDhOracle& o, const char* what) {
  int bad = 0;
  for (size_t i = 0; i < dh.size(); ++i)
    if (!(std::fabs(dh[i] - o.want[i]) <= o.tol[i]) && ++bad <= 5)
      ADD_FAILURE() << what << " [" << i << "]: " << dh[i] << " vs " << o.want[i] << " +- "
                    << o.tol[i];
  return bad;
}

// Cross-entropy: loss against the fp32 backend on rounded h and head (exact up to order); dh
// (one walk over the head in panels, and over uneven row slices of it as a ZeRO-3 head is
// walked) against the one double oracle above, which rounds the exponentials as the bf16 dh
// GEMM's operand and can tell them rounded from not (the bound is far below a bf16 step).
TEST_P(Bf16Kinds, CrossEntropyAndLogits) {
  auto [e, kind] = GetParam();
  if (e == Engine::OneDnn) SKIP_WITHOUT_ONEDNN_BF16();
  SCOPED_TRACE(::testing::Message() << engine_name(e) << " " << kind);
  Pair px(e, true);
  const int M = 23, H = 64, V = 45;
  const float gs = 0.37f;
  KindWeight w = make_weight(&px.tr, kind, V, H, 21);
  const FVec Wr = rounded(w.deq);
  QWeight wref = qweight_from_f32(&px.tr, Wr.data(), V, H, QuantKind::F32);
  Rng rng(22);
  FVec h = rng.normal(size_t(M) * H);
  const FVec hr = rounded(h);
  std::vector<int32_t> t(M);
  for (int i = 0; i < M; ++i) t[i] = i % 5 == 3 ? -100 : rng.uniform_int(0, V - 1);
  t[0] = V - 1;  // in the last panel

  FVec dh = rng.normal(h.size());
  const FVec dh0 = dh;
  int64_t cnt = 0, cnt_r = 0;
  double loss = px.bf->linear_cross_entropy(w.q, CMatF(h.data(), M, H), t.data(), -100, gs,
                                            MatF(dh.data(), M, H), &cnt);
  double loss_r = px.ref->linear_cross_entropy(wref, CMatF(hr.data(), M, H), t.data(), -100, gs,
                                               MatF(), &cnt_r);
  EXPECT_EQ(cnt, cnt_r);
  EXPECT_NEAR(loss, loss_r, 1e-5 * std::fabs(loss_r));
  auto& cpu = static_cast<cpu::CpuBackend&>(*px.bf);
  ASSERT_LT(cpu::panel_rows_lp(cpu, w.q), V / 2) << "several panels";
  const CeDhOracle oracle = ce_dh_one_walk_oracle(hr, Wr, t, M, H, V, gs, dh0);
  EXPECT_EQ(ce_dh_outside(dh, oracle, "dh"), 0);

  // Row slices of 1, 17, 1 and 26 rows (the head's dequantized values as f32 slices, which the
  // backend rounds as it rounds the kind's panels), one walk each, then walk_end.
  ASSERT_EQ(px.bf->cross_entropy_walks(), 1);
  const int cuts[] = {0, 1, 18, 19, V};
  std::vector<QWeight> slices;
  for (int k = 0; k < 4; ++k)
    slices.push_back(qweight_from_f32(&px.tr, w.deq.data() + cuts[k] * H, cuts[k + 1] - cuts[k], H,
                                      QuantKind::F32));
  std::vector<CrossEntropyRow> st(M);
  FVec acc(h.size(), 0.f), dh2 = dh0, lse(M);
  for (int k = 0; k < 4; ++k)
    px.bf->cross_entropy_walk(slices[size_t(k)], cuts[k], V, CMatF(h.data(), M, H), t.data(), -100,
                              gs, st.data(), acc.data(), MatF(dh2.data(), M, H));
  cross_entropy_walk_end(st.data(), t.data(), -100, gs, acc.data(), MatF(dh2.data(), M, H));
  int64_t cnt2 = 0;
  EXPECT_NEAR(cross_entropy_finish(st.data(), t.data(), M, -100, lse.data(), &cnt2), loss_r,
              1e-5 * std::fabs(loss_r));
  EXPECT_EQ(cnt2, cnt_r);
  EXPECT_EQ(ce_dh_outside(dh2, oracle, "sliced dh"), 0);

  FVec lg(size_t(M) * V), lgr(lg.size());
  px.bf->head_logits(w.q, CMatF(h.data(), M, H), MatF(lg.data(), M, V));
  px.ref->head_logits(wref, CMatF(hr.data(), M, H), MatF(lgr.data(), M, V));
  EXPECT_LT(max_rel_error(lg.data(), lgr.data(), lg.size()), kTol) << "head_logits";
}

// ---- attention at precision bf16 ---------------------------------------------------------------

// Causal GQA attention (optional document mask) in double as precision bf16 defines it: q, k, v,
// dout are bf16 values already; P rounded where it enters P V and dV, dS where it enters dQ and
// dK (`round_mid` false: neither, to show that the rounding is visible). D_i = dO_i . O_i takes
// the O the backend's forward returned, as the backend's backward does.
struct AttnOut {
  Vec out, dq, dk, dv;
};
AttnOut attention_bf16_oracle(const AttnShape& s, const FVec& q, const FVec& k, const FVec& v,
                              const FVec& o_fwd, const FVec& dout, const int32_t* doc,
                              bool round_mid) {
  const int T = s.seq, H = s.n_heads, KV = s.n_kv_heads, D = s.head_dim;
  const int rows = s.batch * T, qc = H * D, kc = KV * D;
  const double scale = s.scale > 0 ? double(s.scale) : 1.0 / std::sqrt(double(D));
  const double cap = s.softcap;  // soft-capped scores: dS through 1 - tanh^2 before rounding
  auto mid = [&](double x) { return round_mid ? bf(x) : x; };
  AttnOut r;
  r.out.assign(size_t(rows) * qc, 0);
  r.dq.assign(size_t(rows) * qc, 0);
  r.dk.assign(size_t(rows) * kc, 0);
  r.dv.assign(size_t(rows) * kc, 0);
  Vec sc(static_cast<size_t>(T)), th(static_cast<size_t>(T), 0.0);
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < H; ++h) {
      const int kh = h / (H / KV);
      for (int i = 0; i < T; ++i) {
        const int ri = b * T + i;
        double m = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          const int rj = b * T + j;
          sc[j] = -INFINITY;
          if (doc && doc[ri] != doc[rj]) continue;
          if (s.window > 0 && j <= i - s.window) continue;  // outside the sliding window
          double d = 0;
          for (int e = 0; e < D; ++e) d += double(q[ri * qc + h * D + e]) * k[rj * kc + kh * D + e];
          sc[j] = d * scale;
          if (cap > 0) {
            th[j] = std::tanh(sc[j] / cap);
            sc[j] = cap * th[j];
          }
          m = std::max(m, sc[j]);
        }
        double z = 0;
        for (int j = 0; j <= i; ++j) z += std::exp(sc[j] - m);
        double Di = 0;
        for (int e = 0; e < D; ++e)
          Di += double(dout[ri * qc + h * D + e]) * o_fwd[ri * qc + h * D + e];
        for (int j = 0; j <= i; ++j) {
          const int rj = b * T + j;
          const double p = std::exp(sc[j] - m) / z, pr = mid(p);
          double dp = 0;
          for (int e = 0; e < D; ++e) {
            r.out[ri * qc + h * D + e] += pr * v[rj * kc + kh * D + e];
            dp += double(dout[ri * qc + h * D + e]) * v[rj * kc + kh * D + e];
          }
          const double ds = mid(p * (dp - Di) * (1 - th[j] * th[j]));
          for (int e = 0; e < D; ++e) {
            r.dq[ri * qc + h * D + e] += scale * ds * k[rj * kc + kh * D + e];
            r.dk[rj * kc + kh * D + e] += scale * ds * q[ri * qc + h * D + e];
            r.dv[rj * kc + kh * D + e] += pr * dout[ri * qc + h * D + e];
          }
        }
      }
    }
  return r;
}

// ||got - want|| / ||want||: an occasional bf16 rounding that lands on the other side (fp32 sums
// and exp_approx against double) moves one element by 2^-8 and this norm by little; a rounding
// left out moves every element.
double rms_rel(const FVec& got, const Vec& want) {
  double e = 0, w = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    e += (got[i] - want[i]) * (got[i] - want[i]);
    w += want[i] * want[i];
  }
  return std::sqrt(e / std::max(w, 1e-300));
}

class Bf16Attention : public ::testing::TestWithParam<Engine> {};

const char* amx_name(AttnAmx amx) {
  return amx == AttnAmx::Off ? "" : amx == AttnAmx::On ? " amx" : " amx emulated";
}

// Ragged shapes, then (for the AMX tile path above all: its 2 x 2 tile blocks, causal blocks
// skipped on and off the diagonal, several key blocks per tile) whole 32-row blocks, head_dim 64
// and keys past 128. tol: the relative rms error against the oracle; at seq 200 a few roundings
// of P and dS land on the other side of the double oracle's (4-7e-6 on every engine), still far
// below a rounding left out (the "unrounded" checks, 1.6e-3).
struct AttnCase {
  int batch, seq, heads, kv, hd;
  bool docs;
  int64_t block_q, stair;
  double tol;
  int window = 0;       // AttnShape::window (sliding-window attention)
  float softcap = 0.f;  // AttnShape::softcap (Gemma 2), with scale
  float scale = 0.f;    // AttnShape::scale
  float q_sd = 1.f;     // q's spread: large enough that scores pass the cap
};
std::vector<AttnCase> attn_cases() {
  return {{2, 37, 4, 2, 16, false, 8, 3, 1e-6},
          {1, 50, 6, 2, 32, true, 16, 5, 1e-6},
          {2, 9, 2, 1, 8, false, 64, 0, 1e-6},
          {1, 200, 2, 1, 64, false, 64, 0, 2e-5},
          {1, 161, 2, 2, 64, true, 96, 32, 1e-6},
          {2, 45, 4, 2, 16, false, 8, 3, 1e-6, 7},
          {1, 161, 2, 2, 64, true, 32, 8, 1e-6, 40},
          // Gemma 2: scores scaled by 24^-0.5 and soft-capped at 2 (tanh bends most of them)
          {2, 37, 4, 2, 16, false, 8, 3, 1e-6, 5, 2.f, 0.2041241f, 3.f},
          {1, 161, 2, 2, 64, true, 32, 8, 5e-6, 0, 2.f, 0.2041241f, 3.f}};
}

void check_attention_oracle(Engine e, AttnAmx amx) {
  for (const AttnCase c : attn_cases()) {
    SCOPED_TRACE(::testing::Message()
                 << engine_name(e) << amx_name(amx) << " seq " << c.seq << " heads " << c.heads
                 << "/" << c.kv << " hd " << c.hd << " docs " << c.docs << " stair " << c.stair
                 << " window " << c.window << " softcap " << c.softcap);
    Pair px(e, false, c.block_q, c.stair, amx);
    Rng rng(uint64_t(c.seq) * 31 + c.hd);
    AttnShape s = attn_shape(c.batch, c.seq, c.heads, c.kv, c.hd);
    s.window = c.window;
    s.softcap = c.softcap;
    s.scale = c.scale;
    const int rows = c.batch * c.seq, qc = c.heads * c.hd, kc = c.kv * c.hd;
    std::vector<int32_t> doc(static_cast<size_t>(rows));
    for (int i = 0; i < rows; ++i) doc[size_t(i)] = (i % c.seq) / 12;  // documents of 12
    if (c.docs) s.doc_ids = doc.data();
    const FVec q = rng.normal(size_t(rows) * qc, c.q_sd), k = rng.normal(size_t(rows) * kc),
               v = rng.normal(size_t(rows) * kc), dout = rng.normal(size_t(rows) * qc);
    FVec out(q.size()), lse(size_t(c.heads) * rows), dq(q.size()), dk(k.size()), dv(v.size());
    px.bf->attention_fwd(s, CMatF(q.data(), rows, qc), CMatF(k.data(), rows, kc),
                         CMatF(v.data(), rows, kc), MatF(out.data(), rows, qc), lse.data());
    px.bf->attention_bwd(s, CMatF(q.data(), rows, qc), CMatF(k.data(), rows, kc),
                         CMatF(v.data(), rows, kc), CMatF(out.data(), rows, qc), lse.data(),
                         CMatF(dout.data(), rows, qc), MatF(dq.data(), rows, qc),
                         MatF(dk.data(), rows, kc), MatF(dv.data(), rows, kc));
    const FVec qr = rounded(q), kr = rounded(k), vr = rounded(v), dr = rounded(dout);
    const int32_t* dp = c.docs ? doc.data() : nullptr;
    const AttnOut want = attention_bf16_oracle(s, qr, kr, vr, out, dr, dp, true);
    const AttnOut bare = attention_bf16_oracle(s, qr, kr, vr, out, dr, dp, false);
    const double e_out = rms_rel(out, want.out), e_dq = rms_rel(dq, want.dq),
                 e_dk = rms_rel(dk, want.dk), e_dv = rms_rel(dv, want.dv);
    const double u_out = rms_rel(out, bare.out), u_dq = rms_rel(dq, bare.dq),
                 u_dk = rms_rel(dk, bare.dk), u_dv = rms_rel(dv, bare.dv);
    std::printf(
        "%s: vs oracle out %.2g dq %.2g dk %.2g dv %.2g; vs unrounded P/dS %.2g %.2g %.2g %.2g\n",
        engine_name(e), e_out, e_dq, e_dk, e_dv, u_out, u_dq, u_dk, u_dv);
    EXPECT_LT(e_out, c.tol);
    EXPECT_LT(e_dq, c.tol);
    EXPECT_LT(e_dk, c.tol);
    EXPECT_LT(e_dv, c.tol);
    EXPECT_GT(u_out, 5 * e_out + 2e-4) << "P's rounding not visible in out";
    EXPECT_GT(u_dq, 5 * e_dq + 2e-4) << "dS's rounding not visible in dq";
    EXPECT_GT(u_dv, 5 * e_dv + 2e-4) << "P's rounding not visible in dv";
    // lse: fp32 softmax statistics of the rounded scores, against the fp32 backend.
    FVec out32(q.size()), lse32(lse.size());
    px.ref->attention_fwd(s, CMatF(qr.data(), rows, qc), CMatF(kr.data(), rows, kc),
                          CMatF(vr.data(), rows, kc), MatF(out32.data(), rows, qc), lse32.data());
    EXPECT_LT(max_rel_error(lse.data(), lse32.data(), lse.size()), 1e-5) << "lse";
  }
}

TEST_P(Bf16Attention, MatchesTheRoundingOracle) {
  const Engine e = GetParam();
  if (e == Engine::OneDnn) SKIP_WITHOUT_ONEDNN_BF16();
  check_attention_oracle(e, AttnAmx::Off);
}

// attention_bwd_16: dq, dk, dv rotated back and rounded in the kernel. Against the separate
// ops (attention_bwd into zeroed fp32, rope inverse, bf16 rounding): the same bits; against the
// double oracle rotated back in double and rounded: equal but for roundings that land on the
// other side. q, k, v also given as attention_inputs_16 (the runner's way), whose fp32 copies
// are then NaN. Strides wider than the columns, with their spare columns left as they were.
void rope_inverse_double(Vec& x, const std::vector<int32_t>& pos, int heads, int D, float theta,
                         bool adjacent) {
  const int cols = heads * D, half = D / 2;
  for (size_t row = 0; row < pos.size(); ++row)
    for (int h = 0; h < heads; ++h) {
      double* xh = x.data() + row * size_t(cols) + size_t(h) * D;
      for (int i = 0; i < half; ++i) {
        const double ang = double(pos[row]) * std::pow(double(theta), -2.0 * i / D);
        const double c = std::cos(ang), sn = -std::sin(ang);
        double& a = adjacent ? xh[2 * i] : xh[i];
        double& b = adjacent ? xh[2 * i + 1] : xh[i + half];
        const double a0 = a, b0 = b;
        a = a0 * c - b0 * sn;
        b = a0 * sn + b0 * c;
      }
    }
}

void check_attention_bwd16(Engine e, AttnAmx amx) {
  struct Case {
    int batch, seq, heads, kv, hd;
    bool docs, adjacent;
    int64_t block_q, stair;
  };
  for (const Case c :
       {Case{2, 37, 4, 2, 16, false, false, 8, 3}, Case{1, 50, 6, 2, 32, true, true, 16, 5},
        Case{2, 9, 3, 3, 8, false, true, 64, 0}, Case{1, 161, 2, 1, 64, true, true, 96, 32}}) {
    SCOPED_TRACE(::testing::Message() << engine_name(e) << amx_name(amx) << " seq " << c.seq
                                      << " heads " << c.heads << "/" << c.kv << " hd " << c.hd
                                      << " docs " << c.docs << " adjacent " << c.adjacent);
    Pair px(e, false, c.block_q, c.stair, amx);
    Rng rng(uint64_t(c.seq) * 17 + c.hd);
    AttnShape s = attn_shape(c.batch, c.seq, c.heads, c.kv, c.hd);
    const int rows = c.batch * c.seq, qc = c.heads * c.hd, kc = c.kv * c.hd;
    std::vector<int32_t> doc(static_cast<size_t>(rows)), pos(static_cast<size_t>(rows));
    for (int i = 0; i < rows; ++i) {
      doc[size_t(i)] = (i % c.seq) / 12;
      pos[size_t(i)] = c.docs ? (i % c.seq) % 12 : i % c.seq;  // positions restart per document
    }
    if (c.docs) s.doc_ids = doc.data();
    const float theta = 10000.f;
    const RopeFreqs freqs = RopeFreqs::plain(theta, c.hd);
    RopeArgs ra;
    ra.pos = pos.data();
    ra.freqs = &freqs;
    ra.adjacent = c.adjacent;
    // bf16 values already (what the runner stores), so the fp32 and 16-bit inputs agree.
    const FVec q = rounded(rng.normal(size_t(rows) * qc)),
               k = rounded(rng.normal(size_t(rows) * kc)),
               v = rounded(rng.normal(size_t(rows) * kc)), dout = rng.normal(size_t(rows) * qc);
    FVec out(q.size()), lse(size_t(c.heads) * rows);
    px.bf->attention_fwd(s, CMatF(q.data(), rows, qc), CMatF(k.data(), rows, kc),
                         CMatF(v.data(), rows, kc), MatF(out.data(), rows, qc), lse.data());
    // attention_fwd_to_16: out's rounding (the tiles rounded in the kernel; out's fp32 room
    // untouched), the same lse; the Backend default (autocast's emulation) likewise.
    {
      const std::vector<uint16_t> want16 = to_bf16(out);
      std::vector<uint16_t> o16(out.size(), 0x7fc1);
      FVec room(out.size(), NAN), lse2(lse.size());
      px.bf->attention_fwd_to_16(s, CMatF(q.data(), rows, qc), CMatF(k.data(), rows, kc),
                                 CMatF(v.data(), rows, kc), MatF(room.data(), rows, qc),
                                 lse2.data(), DType::BF16, o16.data());
      ASSERT_EQ(o16, want16) << "attention_fwd_to_16";
      ASSERT_EQ(0, std::memcmp(lse2.data(), lse.data(), lse.size() * 4));
      for (float x : room) ASSERT_TRUE(std::isnan(x)) << "out written";
      auto emu = make_autocast_backend(make_cpu_backend(&px.tr), DType::BF16, false);
      FVec eo(out.size()), el(lse.size()), eroom(out.size());
      std::vector<uint16_t> e16(out.size());
      emu->attention_fwd(s, CMatF(q.data(), rows, qc), CMatF(k.data(), rows, kc),
                         CMatF(v.data(), rows, kc), MatF(eo.data(), rows, qc), el.data());
      emu->attention_fwd_to_16(s, CMatF(q.data(), rows, qc), CMatF(k.data(), rows, kc),
                               CMatF(v.data(), rows, kc), MatF(eroom.data(), rows, qc), el.data(),
                               DType::BF16, e16.data());
      ASSERT_EQ(e16, to_bf16(eo)) << "default attention_fwd_to_16";
    }
    // attention_out_16: out (hint 1) and dout (hint 2, as next_dx_16 writes it) read only
    // through their bf16 copies (fp32 values NaN): the bits of fp32 out / dout holding the
    // rounded values.
    {
      const std::vector<uint16_t> q16 = to_bf16(q), k16 = to_bf16(k), v16 = to_bf16(v),
                                  out16 = to_bf16(out), dout16 = to_bf16(dout);
      const FVec outr = rounded(out), doutr = rounded(dout), nan_q(out.size(), NAN);
      std::vector<uint16_t> g[3][3];
      for (int hint = 0; hint < 3; ++hint) {
        for (int j = 0; j < 3; ++j) g[hint][j].assign(size_t(rows) * (j ? kc : qc), 0x7fc1);
        px.bf->attention_inputs_16(DType::BF16, q16.data(), k16.data(), v16.data());
        if (hint)
          px.bf->attention_out_16(DType::BF16, out16.data(), hint == 2 ? dout16.data() : nullptr);
        px.bf->attention_bwd_16(s, CMatF(q.data(), rows, qc), CMatF(k.data(), rows, kc),
                                CMatF(v.data(), rows, kc),
                                CMatF((hint ? nan_q : outr).data(), rows, qc), lse.data(),
                                CMatF((hint == 2 ? nan_q : doutr).data(), rows, qc), ra,
                                DType::BF16, View2<uint16_t>(g[hint][0].data(), rows, qc),
                                View2<uint16_t>(g[hint][1].data(), rows, kc),
                                View2<uint16_t>(g[hint][2].data(), rows, kc));
      }
      for (int hint = 1; hint < 3; ++hint)
        for (int j = 0; j < 3; ++j)
          ASSERT_EQ(g[0][j], g[hint][j]) << "attention_out_16 " << hint << ", output " << j;
    }
    // The separate ops.
    FVec dq(q.size(), 0.f), dk(k.size(), 0.f), dv(v.size(), 0.f);
    px.bf->attention_bwd(s, CMatF(q.data(), rows, qc), CMatF(k.data(), rows, kc),
                         CMatF(v.data(), rows, kc), CMatF(out.data(), rows, qc), lse.data(),
                         CMatF(dout.data(), rows, qc), MatF(dq.data(), rows, qc),
                         MatF(dk.data(), rows, kc), MatF(dv.data(), rows, kc));
    px.bf->rope(MatF(dq.data(), rows, qc), pos.data(), c.heads, c.hd, freqs, c.adjacent, true);
    px.bf->rope(MatF(dk.data(), rows, kc), pos.data(), c.kv, c.hd, freqs, c.adjacent, true);
    const std::vector<uint16_t> q16 = to_bf16(q), k16 = to_bf16(k), v16 = to_bf16(v);
    const FVec nq(q.size(), NAN), nk(k.size(), NAN), nv(v.size(), NAN);
    for (bool inputs16 : {false, true}) {
      SCOPED_TRACE(inputs16 ? "attention_inputs_16" : "fp32 inputs");
      const int64_t lq = qc + 3, lk = kc + 7, lv = kc;
      std::vector<uint16_t> gq(size_t(rows * lq), 0x7fc1), gk(size_t(rows * lk), 0x7fc1),
          gv(size_t(rows * lv), 0x7fc1);
      if (inputs16) px.bf->attention_inputs_16(DType::BF16, q16.data(), k16.data(), v16.data());
      px.bf->attention_bwd_16(
          s, CMatF((inputs16 ? nq : q).data(), rows, qc),
          CMatF((inputs16 ? nk : k).data(), rows, kc), CMatF((inputs16 ? nv : v).data(), rows, kc),
          CMatF(out.data(), rows, qc), lse.data(), CMatF(dout.data(), rows, qc), ra, DType::BF16,
          View2<uint16_t>(gq.data(), rows, qc, lq), View2<uint16_t>(gk.data(), rows, kc, lk),
          View2<uint16_t>(gv.data(), rows, kc, lv));
      auto same = [&](const std::vector<uint16_t>& g, int64_t ld, const FVec& want, int cols,
                      const char* what) {
        for (int i = 0; i < rows; ++i) {
          for (int j = 0; j < cols; ++j)
            ASSERT_EQ(g[size_t(i * ld + j)], f32_to_bf16(want[size_t(i) * cols + j]))
                << what << " row " << i << " col " << j;
          for (int64_t j = cols; j < ld; ++j)
            ASSERT_EQ(g[size_t(i * ld + j)], 0x7fc1) << what << " spare column written";
        }
      };
      same(gq, lq, dq, qc, "dq");
      same(gk, lk, dk, kc, "dk");
      same(gv, lv, dv, kc, "dv");
      if (inputs16) continue;
      // Backend's default (the separate ops through workspace), as a backend without native
      // bf16 GEMMs runs it: autocast's emulation over the fp32 backend.
      if (e == Engine::Sgemm) {
        auto emu = make_autocast_backend(make_cpu_backend(&px.tr), DType::BF16, false);
        FVec eq(q.size(), 0.f), ek(k.size(), 0.f), ev(v.size(), 0.f);
        emu->attention_bwd(s, CMatF(q.data(), rows, qc), CMatF(k.data(), rows, kc),
                           CMatF(v.data(), rows, kc), CMatF(out.data(), rows, qc), lse.data(),
                           CMatF(dout.data(), rows, qc), MatF(eq.data(), rows, qc),
                           MatF(ek.data(), rows, kc), MatF(ev.data(), rows, kc));
        emu->rope(MatF(eq.data(), rows, qc), pos.data(), c.heads, c.hd, freqs, c.adjacent, true);
        emu->rope(MatF(ek.data(), rows, kc), pos.data(), c.kv, c.hd, freqs, c.adjacent, true);
        std::vector<uint16_t> hq(gq.size(), 0x7fc1), hk(gk.size(), 0x7fc1), hv(gv.size(), 0x7fc1);
        emu->attention_bwd_16(
            s, CMatF(q.data(), rows, qc), CMatF(k.data(), rows, kc), CMatF(v.data(), rows, kc),
            CMatF(out.data(), rows, qc), lse.data(), CMatF(dout.data(), rows, qc), ra, DType::BF16,
            View2<uint16_t>(hq.data(), rows, qc, lq), View2<uint16_t>(hk.data(), rows, kc, lk),
            View2<uint16_t>(hv.data(), rows, kc, lv));
        same(hq, lq, eq, qc, "default dq");
        same(hk, lk, ek, kc, "default dk");
        same(hv, lv, ev, kc, "default dv");
      }
      // The double oracle, rotated back in double, rounded to bf16.
      const FVec dr = rounded(dout);
      AttnOut want =
          attention_bf16_oracle(s, q, k, v, out, dr, c.docs ? doc.data() : nullptr, true);
      rope_inverse_double(want.dq, pos, c.heads, c.hd, theta, c.adjacent);
      rope_inverse_double(want.dk, pos, c.kv, c.hd, theta, c.adjacent);
      auto widened = [&](const std::vector<uint16_t>& g, int64_t ld, int cols) {
        FVec o(size_t(rows) * cols);
        for (int i = 0; i < rows; ++i)
          for (int j = 0; j < cols; ++j)
            o[size_t(i) * cols + j] = bf16_to_f32(g[size_t(i * ld + j)]);
        return o;
      };
      auto bfv = [](Vec x) {
        for (double& d : x) d = bf(d);
        return x;
      };
      const double eq = rms_rel(widened(gq, lq, qc), bfv(want.dq)),
                   ek = rms_rel(widened(gk, lk, kc), bfv(want.dk)),
                   ev = rms_rel(widened(gv, lv, kc), bfv(want.dv));
      std::printf("%s: bf16 grads vs rounded oracle dq %.2g dk %.2g dv %.2g\n", engine_name(e), eq,
                  ek, ev);
      // A rounding flipped by float noise moves an element by 2^-8 relative; the rms stays far
      // below the 2^-9-ish of a rounding left out or a rotation missed.
      EXPECT_LT(eq, 3e-4);
      EXPECT_LT(ek, 3e-4);
      EXPECT_LT(ev, 3e-4);
      EXPECT_GT(rms_rel(widened(gq, lq, qc),
                        bfv(attention_bf16_oracle(s, q, k, v, out, dr,
                                                  c.docs ? doc.data() : nullptr, true)
                                .dq)),
                1e-2)
          << "the rotation is visible";
    }
  }
}

TEST_P(Bf16Attention, BackwardToBf16WithRope) {
  const Engine e = GetParam();
  if (e == Engine::OneDnn) SKIP_WITHOUT_ONEDNN_BF16();
  check_attention_bwd16(e, AttnAmx::Off);
}

// The AMX tile path (CpuTuning::attn_amx) through the same checks: emulated on every CPU, on
// the tiles themselves where the CPU has them.
TEST(Bf16AttentionAmx, EmulatedMatchesTheRoundingOracle) {
  check_attention_oracle(Engine::Sgemm, AttnAmx::Emulated);
  check_attention_bwd16(Engine::Sgemm, AttnAmx::Emulated);
}

TEST(Bf16AttentionAmx, HardwareMatchesTheRoundingOracle) {
  if (!cpu::amx_hardware()) {
    QLFT_SKIP("isa-absent") << "no AMX tiles on this CPU (or QLFT_CPU_ISA)";
  }
  check_attention_oracle(Engine::OneDnn, AttnAmx::On);
  check_attention_bwd16(Engine::OneDnn, AttnAmx::On);
}

INSTANTIATE_TEST_SUITE_P(All, Bf16Attention, ::testing::Values(Engine::OneDnn, Engine::Sgemm),
                         [](const auto& info) { return std::string(engine_name(info.param)); });

INSTANTIATE_TEST_SUITE_P(All, Bf16Kinds,
                         ::testing::Combine(::testing::Values(Engine::OneDnn, Engine::Sgemm),
                                            ::testing::Values("f32", "nf4", "int8", "q4_1",
                                                              "q8_0")),
                         [](const auto& info) {
                           return std::string(engine_name(std::get<0>(info.param))) + "_" +
                                  std::get<1>(info.param);
                         });

TEST(Bf16Backend, DequantizeRowsBf16EqualsRoundedFp32) {
  MemoryTracker tr;
  for (const char* kind : {"f32", "nf4", "int8", "q4_1", "q8_0"}) {
    KindWeight w = make_weight(&tr, kind, 13, 64, 5);
    for (auto [r0, n] : {std::pair{0, 13}, std::pair{3, 7}, std::pair{12, 1}}) {
      std::vector<uint16_t> got(size_t(n) * 64);
      w.q.dequantize_rows_bf16(r0, n, got.data());
      for (int i = 0; i < n * 64; ++i)
        ASSERT_EQ(got[i], f32_to_bf16(w.deq[size_t(r0) * 64 + i])) << kind << " " << i;
    }
  }
  // Rows longer than the internal tile.
  FVec big = Rng(6).normal(2 * 5000);
  QWeight q = qweight_from_f32(&tr, big.data(), 2, 5000, QuantKind::INT8);
  FVec deq(big.size());
  q.dequantize_rows(0, 2, deq.data());
  std::vector<uint16_t> got(big.size());
  q.dequantize_rows_bf16(0, 2, got.data());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], f32_to_bf16(deq[i])) << i;
  EXPECT_THROW(q.dequantize_rows_bf16(1, 2, got.data()), qlft::Error);
}

// Autocast over the CPU backend: native bf16 = the CPU backend at precision bf16 (no second
// rounding); native = false keeps the emulation (fp32 weights, rounded inputs).
TEST(Bf16Backend, AutocastUsesTheNativePath) {
  MemoryTracker tr;
  const int M = 9, K = 40, N = 11;
  Rng rng(31);
  FVec x = rng.normal(size_t(M) * K), W = rng.normal(size_t(N) * K, 0.2f);
  QWeight q = qweight_from_f32(&tr, W.data(), N, K, QuantKind::NF4, 64, false);
  auto nat = make_autocast_backend(make_cpu_backend(&tr), DType::BF16, true);
  auto emu = make_autocast_backend(make_cpu_backend(&tr), DType::BF16, false);
  auto cpu_bf = make_cpu_backend(&tr);
  static_cast<cpu::CpuBackend&>(*cpu_bf).set_precision(DType::BF16);
  FVec y1(size_t(M) * N), y2(y1.size()), y3(y1.size()), y4(y1.size());
  nat->linear_fwd(q, nullptr, nullptr, CMatF(x.data(), M, K), MatF(y1.data(), M, N), nullptr);
  cpu_bf->linear_fwd(q, nullptr, nullptr, CMatF(x.data(), M, K), MatF(y2.data(), M, N), nullptr);
  EXPECT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * 4));
  emu->linear_fwd(q, nullptr, nullptr, CMatF(x.data(), M, K), MatF(y3.data(), M, N), nullptr);
  // Emulation: the fp32 backend on rounded x with the weight as stored.
  auto f32 = make_cpu_backend(&tr);
  FVec xr = rounded(x);
  f32->linear_fwd(q, nullptr, nullptr, CMatF(xr.data(), M, K), MatF(y4.data(), M, N), nullptr);
  EXPECT_EQ(0, std::memcmp(y3.data(), y4.data(), y3.size() * 4));
  EXPECT_GT(max_rel_error(y1.data(), y3.data(), y1.size()), 1e-4);  // weights rounded or not
  // fp16 never switches the inner backend.
  auto inner = make_cpu_backend(&tr);
  auto* raw = static_cast<cpu::CpuBackend*>(inner.get());
  auto f16 = make_autocast_backend(std::move(inner), DType::F16, true);
  EXPECT_EQ(raw->precision(), DType::F32);
}

// Kept scratch (CpuTuning::reuse_scratch) changes no value, grows with the shapes, is counted
// as workspace while kept, and is given back by release_scratch().
TEST(Bf16Backend, ReusedScratchGivesTheSameBits) {
  for (Engine e : {Engine::OneDnn, Engine::Sgemm}) {
    if (e == Engine::OneDnn && !cpu::gemm_bf16_available()) {
      std::printf("oneDNN engine: no bf16 matmul at isa %s; sgemm only\n", cpu_isa_name(cpu_isa()));
      continue;
    }
    MemoryTracker tr;
    auto keep = make_cpu_backend(&tr), fresh = make_cpu_backend(&tr);
    for (auto* b : {keep.get(), fresh.get()}) {
      auto& c = static_cast<cpu::CpuBackend&>(*b);
      c.set_precision(DType::BF16);
      c.tune.bf16_gemm = e;
    }
    static_cast<cpu::CpuBackend&>(*keep).tune.reuse_scratch = true;
    static_cast<cpu::CpuBackend&>(*fresh).tune.reuse_scratch = false;
    Rng rng(41);
    for (auto [M, K, N] : {std::tuple{5, 32, 7}, std::tuple{19, 96, 40}, std::tuple{3, 64, 9}}) {
      KindWeight w = make_weight(&tr, "nf4", N, K, uint64_t(M));
      FVec x = rng.normal(size_t(M) * K), dy = rng.normal(size_t(M) * N);
      FVec A = rng.normal(size_t(2) * K, 0.3f), B = rng.normal(size_t(N) * 2, 0.3f);
      LoraRef l;
      l.A = A.data();
      l.B = B.data();
      l.r = 2;
      FVec y1(size_t(M) * N), y2(y1.size()), dx1(x.size()), dx2(x.size());
      FVec dA1(A.size()), dA2(A.size()), dB1(B.size()), dB2(B.size());
      keep->linear_fwd(w.q, nullptr, &l, CMatF(x.data(), M, K), MatF(y1.data(), M, N), nullptr);
      fresh->linear_fwd(w.q, nullptr, &l, CMatF(x.data(), M, K), MatF(y2.data(), M, N), nullptr);
      keep->linear_bwd(w.q, &l, CMatF(x.data(), M, K), nullptr, CMatF(dy.data(), M, N),
                       MatF(dx1.data(), M, K), dA1.data(), dB1.data());
      fresh->linear_bwd(w.q, &l, CMatF(x.data(), M, K), nullptr, CMatF(dy.data(), M, N),
                        MatF(dx2.data(), M, K), dA2.data(), dB2.data());
      EXPECT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * 4)) << engine_name(e) << M;
      EXPECT_EQ(0, std::memcmp(dx1.data(), dx2.data(), dx1.size() * 4)) << engine_name(e) << M;
      EXPECT_EQ(0, std::memcmp(dA1.data(), dA2.data(), dA1.size() * 4)) << engine_name(e) << M;
      EXPECT_EQ(0, std::memcmp(dB1.data(), dB2.data(), dB1.size() * 4)) << engine_name(e) << M;
    }
    const auto ws = size_t(MemCategory::Workspace);
    const uint64_t kept = tr.snapshot().reserved[ws];
    EXPECT_GT(kept, 0u) << "kept scratch is counted";
    static_cast<cpu::CpuBackend&>(*keep).release_scratch();
    EXPECT_EQ(tr.snapshot().reserved[ws], 0u);
  }
}

}  // namespace
