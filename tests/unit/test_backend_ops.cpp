// Every CPU backend op: forward against a double-precision scalar oracle, backward against
// central differences of that oracle. Shapes are small and ragged; block sizes are shrunk so
// every panel / chunk / tile loop runs more than once.
#include <gtest/gtest.h>

#include <immintrin.h>

#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/fp_env.h"
#include "formats/safetensors.h"
#include "quant/qweight.h"
#include "test_backend_util.h"
#include "support/test_support.h"

using namespace qlft;
using namespace qlft_test;

namespace {

struct Fixture {
  MemoryTracker tracker;
  std::unique_ptr<Backend> be = make_cpu_backend(&tracker);
  cpu::CpuBackend& cpu() { return static_cast<cpu::CpuBackend&>(*be); }
  // Small blocks: several panels, dropout chunks, CE chunks and query blocks on small shapes.
  void shrink() {
    auto& t = cpu().tune;
    t.panel_bytes = 1;
    t.panel_min_rows = 1;
    t.panel_max_rows = 24;
    t.drop_chunk_bytes = 7 * 4 * 40;  // 7 rows of 40 columns
    t.ce_logits_bytes = 24 * 4 * 5;   // 5 rows of a 24-row panel
    t.attn_block_q = 8;
  }
};

MatF mat(FVec& v, int64_t r, int64_t c) {
  return MatF(v.data(), r, c);
}
CMatF cmat(const FVec& v, int64_t r, int64_t c) {
  return CMatF(v.data(), r, c);
}

// ---- linear -----------------------------------------------------------------------------------

struct LinearCase {
  int M, K, N, r;
  float p;
  bool bias;
  bool shrink;
  bool thin_sgemm = false;   // the LoRA's [M, r] products on OpenBLAS (CpuTuning::f32_thin_onednn)
  bool blas_onednn = false;  // sgemm() on oneDNN's dnnl_sgemm (CpuTuning::f32_blas)
};

void run_linear(const LinearCase& c, uint64_t seed) {
  Fixture fx;
  if (c.shrink) fx.shrink();
  fx.cpu().tune.f32_thin_onednn = !c.thin_sgemm;
  if (c.blas_onednn) fx.cpu().tune.f32_blas = cpu::CpuTuning::F32Blas::OneDnn;
  Rng rng(seed);
  const int M = c.M, K = c.K, N = c.N, r = c.r;
  FVec x = rng.normal(size_t(M) * K), W = rng.normal(size_t(N) * K, 0.2f);
  FVec b = rng.normal(N), A = rng.normal(size_t(r) * K, 0.3f), B = rng.normal(size_t(N) * r, 0.3f);
  const float scale = 1.75f;
  const uint64_t dseed = 12345 + seed;
  QWeight qw = qweight_from_f32(&fx.tracker, W.data(), N, K, QuantKind::F32);
  LoraRef l;
  l.A = A.data();
  l.B = B.data();
  l.r = r;
  l.scale = scale;
  l.dropout_p = c.p;
  l.dropout_seed = dseed;
  const LoraRef* lp = r > 0 ? &l : nullptr;

  FVec y(size_t(M) * N), xa(size_t(M) * std::max(r, 1));
  fx.be->linear_fwd(qw, c.bias ? b.data() : nullptr, lp, cmat(x, M, K), mat(y, M, N),
                    r > 0 ? xa.data() : nullptr);
  const FVec* bp = c.bias ? &b : nullptr;
  Vec Ad = to_d(A), Bd = to_d(B), xd = to_d(x);
  Vec yo = linear_oracle(xd, W, bp, Ad, Bd, r, scale, c.p, dseed, M, N, K);
  EXPECT_LT(rel_err(y, yo), 2e-6) << "linear_fwd";
  if (r > 0) {  // without xa kept (inference): the same y
    FVec y2(y.size());
    fx.be->linear_fwd(qw, c.bias ? b.data() : nullptr, lp, cmat(x, M, K), mat(y2, M, N), nullptr);
    EXPECT_EQ(y2, y) << "linear_fwd without xa";
  }

  // Backward of L = sum(dy * y).
  FVec dy = rng.normal(size_t(M) * N);
  Vec dyd = to_d(dy);
  FVec dx(size_t(M) * K, 0.f), dA(A.size(), 0.f), dB(B.size(), 0.f);
  fx.be->linear_bwd(qw, lp, cmat(x, M, K), r > 0 ? xa.data() : nullptr, cmat(dy, M, N),
                    mat(dx, M, K), dA.data(), dB.data());
  check_grad(
      "linear dx",
      [&](const Vec& xv) {
        return dot(dyd, linear_oracle(xv, W, bp, Ad, Bd, r, scale, c.p, dseed, M, N, K));
      },
      xd, dx, seed + 1);
  if (r > 0) {
    check_grad(
        "linear dA",
        [&](const Vec& av) {
          return dot(dyd, linear_oracle(xd, W, bp, av, Bd, r, scale, c.p, dseed, M, N, K));
        },
        Ad, dA, seed + 2);
    check_grad(
        "linear dB",
        [&](const Vec& bv) {
          return dot(dyd, linear_oracle(xd, W, bp, Ad, bv, r, scale, c.p, dseed, M, N, K));
        },
        Bd, dB, seed + 3);
  }
  EXPECT_EQ(fx.tracker.snapshot().reserved[int(MemCategory::Workspace)], 0u)
      << "workspace is released after each call";
}

// A LoRA as the merge rule sees it (rank and dropout only).
const LoraRef kMergeProbe = [] {
  LoraRef l;
  l.r = 4;
  return l;
}();

}  // namespace

TEST(BackendLinear, NoLoraDefaultBlocks) {
  run_linear({37, 70, 300, 0, 0.f, true, false}, 1);
}
TEST(BackendLinear, NoLoraSmallPanels) {
  run_linear({13, 40, 61, 0, 0.f, false, true}, 2);
}
TEST(BackendLinear, LoraNoDropout) {
  run_linear({29, 40, 53, 4, 0.f, true, true}, 3);
}
// fp32 folds a LoRA without dropout into the weight panels where M >= K (forward) and M >= N
// (dx): both here, over several panels split across threads ...
TEST(BackendLinear, LoraMergedIntoPanels) {
  ASSERT_TRUE(cpu::lora_merged(&kMergeProbe, 61, 53));
  run_linear({61, 40, 53, 4, 0.f, true, true}, 6);
}
// ... the forward alone (M < N: dx keeps its rank-r GEMM), default blocks.
TEST(BackendLinear, LoraMergedForwardOnly) {
  ASSERT_TRUE(cpu::lora_merged(&kMergeProbe, 45, 40));
  ASSERT_FALSE(cpu::lora_merged(&kMergeProbe, 45, 53));
  run_linear({45, 40, 53, 5, 0.f, false, false}, 7);
}
TEST(BackendLinear, LoraDropout) {
  run_linear({29, 40, 53, 3, 0.3f, false, true}, 4);
}
TEST(BackendLinear, LoraThinProductsOnSgemm) {
  run_linear({29, 40, 53, 4, 0.f, true, true, true}, 8);
  run_linear({29, 40, 53, 3, 0.3f, false, true, true}, 9);
}
// Every sgemm() of the layer on oneDNN (as where OpenBLAS's kernels are older than the CPU): the
// LoRA merged into the panels, dropout, the thin products, and a two-thread split without LoRA.
TEST(BackendLinear, SgemmOnOneDnn) {
  run_linear({61, 40, 53, 4, 0.f, true, true, true, true}, 10);
  run_linear({29, 40, 53, 3, 0.3f, false, true, true, true}, 11);
  run_linear({37, 70, 300, 0, 0.f, true, false, false, true}, 12);
}
TEST(BackendLinear, LoraDropoutDefaultBlocks) {
  run_linear({31, 33, 47, 8, 0.1f, true, false}, 5);
}

TEST(BackendLinear, DropoutReallyDrops) {
  // With p = 0.5 about half of the inputs are dropped: xa must differ from the undropped one.
  Fixture fx;
  Rng rng(9);
  const int M = 16, K = 32, N = 8, r = 2;
  FVec x = rng.normal(M * K), W = rng.normal(N * K), A = rng.normal(r * K), B = rng.normal(N * r);
  QWeight qw = qweight_from_f32(&fx.tracker, W.data(), N, K, QuantKind::F32);
  LoraRef l{A.data(), B.data(), r, 1.f, 0.f, 7};
  FVec y(M * N), xa0(M * r), xa1(M * r);
  fx.be->linear_fwd(qw, nullptr, &l, cmat(x, M, K), mat(y, M, N), xa0.data());
  l.dropout_p = 0.5f;
  fx.be->linear_fwd(qw, nullptr, &l, cmat(x, M, K), mat(y, M, N), xa1.data());
  int kept = 0;
  for (int i = 0; i < M; ++i)
    for (int c = 0; c < K; ++c) kept += lora_dropout_keep(7, i, c, 0.5f);
  EXPECT_GT(kept, M * K * 4 / 10);
  EXPECT_LT(kept, M * K * 6 / 10);
  EXPECT_GT(rel_err(xa1, to_d(xa0)), 0.1);
}

// The CPU loops' integer form of the mask (lora_dropout_threshold) against lora_dropout_keep's
// float test: p on and beside multiples of 2^-24, the ends, a NaN, and random p.
TEST(BackendLinear, DropoutThresholdFormMatchesTheFloatTest) {
  std::vector<float> ps = {0.f,  -0.f,  1e-30f, 1e-7f, 0.05f, 0.1f,         0.3333f,
                           0.5f, 0.99f, 1.f,    1.5f,  -0.2f, std::nanf("")};
  for (uint32_t k : {1u, 2u, 12345u, 8388608u, 16777215u}) {
    const float q = float(k) / 16777216.f;  // exactly k 2^-24
    ps.push_back(q);
    ps.push_back(std::nextafter(q, 0.f));
    ps.push_back(std::nextafter(q, 1.f));
  }
  Rng rng(17);
  for (int i = 0; i < 20; ++i) ps.push_back(float(rng.uniform_int(0, 1 << 20)) / float(1 << 20));
  for (float p : ps) {
    const uint64_t t = lora_dropout_threshold(p);
    // Every 24-bit draw k against the threshold, as lora_dropout_keep decides it.
    for (uint64_t k : {uint64_t(0), t > 0 ? t - 1 : 0, t, t + 1, uint64_t(16777215)}) {
      if (k > 16777215) continue;
      const bool want = float(k) * (1.0f / 16777216.0f) >= p;
      EXPECT_EQ(k >= t, want) << "p " << p << " k " << k;
    }
    for (int64_t row = 0; row < 8; ++row)
      for (int64_t c = 0; c < 300; ++c)
        ASSERT_EQ(lora_dropout_bits(99, lora_dropout_row_base(row), c) >= t,
                  lora_dropout_keep(99, row, c, p))
            << "p " << p << " row " << row << " col " << c;
  }
}

// The mask as a random source, over 1024 x 1024 elements (a layer's input at micro-batch 2 x 512
// and width 1024): each p's keep rate, adjacent columns and adjacent rows kept together at the
// product of the rates, two seeds agreeing as independent masks do, and the 24 bits' high and low
// nibbles uniform. Bounds at 5 standard deviations of N draws; a hash without its finalizer
// (a Weyl sequence per row) keeps adjacent columns together at 0.12 for p 0.5, not 0.25.
TEST(BackendLinear, DropoutMaskIsUniformAndIndependent) {
  const int64_t R = 1024, C = 1024;
  const double N = double(R) * C;
  auto near = [&](double got, double q, double n, const char* what, float p) {
    EXPECT_NEAR(got, q, 5 * std::sqrt(q * (1 - q) / n)) << what << ", p " << p;
  };
  for (float p : {0.05f, 0.1f, 0.5f}) {
    const uint32_t t = lora_dropout_threshold(p);
    double kept = 0, cols2 = 0, rows2 = 0, agree = 0;
    std::vector<uint8_t> prev(size_t(C), 0);
    for (int64_t r = 0; r < R; ++r) {
      const uint64_t base = lora_dropout_row_base(r);
      bool left = false;
      for (int64_t c = 0; c < C; ++c) {
        const bool k = lora_dropout_bits(7, base, c) >= t;
        kept += k;
        if (c > 0) cols2 += k && left;
        if (r > 0) rows2 += k && prev[size_t(c)];
        agree += k == (lora_dropout_bits(8, base, c) >= t);
        left = k;
        prev[size_t(c)] = k;
      }
    }
    const double q = 1.0 - double(t) / 16777216.0;
    near(kept / N, q, N, "keep rate", p);
    near(cols2 / (R * (C - 1)), q * q, R * (C - 1), "adjacent columns kept", p);
    near(rows2 / ((R - 1) * C), q * q, (R - 1) * C, "adjacent rows kept", p);
    near(agree / N, q * q + (1 - q) * (1 - q), N, "two seeds agreeing", p);
  }
  std::vector<double> hi(16, 0), lo(16, 0);
  for (int64_t r = 0; r < 256; ++r)
    for (int64_t c = 0; c < 4096; ++c) {
      const uint32_t b = lora_dropout_bits(11, lora_dropout_row_base(r), c);
      ASSERT_LT(b, 1u << 24);
      hi[b >> 20] += 1;
      lo[b & 15] += 1;
    }
  for (const auto* h : {&hi, &lo}) {
    double chi2 = 0;
    for (double v : *h) chi2 += (v - 65536.0) * (v - 65536.0) / 65536.0;
    EXPECT_LT(chi2, 50.0) << (h == &hi ? "high" : "low") << " nibble";  // 15 dof: p < 1e-5
  }
}

// ---- rmsnorm, rope, swiglu ---------------------------------------------------------------------

TEST(BackendRmsNorm, ForwardAndBackward) {
  Fixture fx;
  Rng rng(11);
  const int M = 19, C = 67;
  const float eps = 1e-5f;
  FVec x = rng.normal(M * C, 1.5f), w = rng.normal(C), y(M * C), rstd(M);
  fx.be->rmsnorm_fwd(cmat(x, M, C), w.data(), eps, mat(y, M, C), rstd.data());
  Vec xd = to_d(x);
  EXPECT_LT(rel_err(y, rmsnorm_oracle(xd, w, eps, M, C)), 1e-6);
  for (int i = 0; i < M; ++i) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += xd[i * C + c] * xd[i * C + c];
    EXPECT_NEAR(rstd[i], 1.0 / std::sqrt(ss / C + eps), 1e-6 * rstd[i]);
  }
  FVec dy = rng.normal(M * C), dx(M * C, 0.f);
  fx.be->rmsnorm_bwd(cmat(x, M, C), w.data(), rstd.data(), cmat(dy, M, C), mat(dx, M, C));
  Vec dyd = to_d(dy);
  check_grad(
      "rmsnorm dx", [&](const Vec& xv) { return dot(dyd, rmsnorm_oracle(xv, w, eps, M, C)); }, xd,
      dx, 12);
}

// add_rmsnorm_fwd_16 (the bf16 forward's residual add fused into the FFN norm): x + r and rstd
// the bits of add then rmsnorm_fwd_16, the bf16 output too; within one bf16 step of the double
// oracle of the norm on x + r. Ragged shapes.
TEST(BackendRmsNorm, AddThenNormToBf16) {
  Fixture fx;
  for (auto [M, C] : {std::pair{19, 67}, std::pair{1, 16}, std::pair{5, 130}}) {
    SCOPED_TRACE(::testing::Message() << M << " x " << C);
    Rng rng(uint64_t(M * 1000 + C));
    const float eps = 1e-5f;
    FVec x = rng.normal(size_t(M) * C, 1.5f), r = rng.normal(size_t(M) * C), w = rng.normal(C);
    FVec x2 = x, rstd(M), rstd2(M);
    fx.be->add(x.data(), r.data(), int64_t(M) * C);
    std::vector<uint16_t> y16(x.size()), z16(x.size());
    fx.be->rmsnorm_fwd_16(cmat(x, M, C), w.data(), eps, MatF(nullptr, M, C), rstd.data(),
                          DType::BF16, y16.data());
    fx.be->add_rmsnorm_fwd_16(mat(x2, M, C), r.data(), w.data(), eps, rstd2.data(), DType::BF16,
                              z16.data());
    EXPECT_EQ(0, std::memcmp(x.data(), x2.data(), x.size() * 4)) << "x + r";
    EXPECT_EQ(0, std::memcmp(rstd.data(), rstd2.data(), rstd.size() * 4)) << "rstd";
    const Vec yo = rmsnorm_oracle(to_d(x), w, eps, M, C);
    for (size_t i = 0; i < z16.size(); ++i) {
      ASSERT_EQ(z16[i], y16[i]) << i;
      if (std::fabs(yo[i]) < 1e-6) continue;
      const uint16_t want = f32_to_bf16(float(yo[i]));
      ASSERT_LE(std::abs(int(int16_t(z16[i])) - int(int16_t(want))), 1) << i;
    }
  }
}

class BackendRope : public ::testing::TestWithParam<bool> {};

TEST_P(BackendRope, ForwardMatchesOracleAndInverseIsBackward) {
  const bool adjacent = GetParam();
  Fixture fx;
  Rng rng(21);
  const int M = 23, heads = 3, hd = 16, cols = heads * hd + 5;  // extra columns stay untouched
  const float theta = 10000.f;
  std::vector<int32_t> pos(M);
  for (int i = 0; i < M; ++i) pos[i] = rng.uniform_int(0, 2000);
  FVec x = rng.normal(size_t(M) * cols), y = x;
  fx.be->rope(mat(y, M, cols), pos.data(), heads, hd, RopeFreqs::plain(theta, hd), adjacent, false);
  Vec xd = to_d(x);
  Vec yo = rope_oracle(xd, pos, M, heads, hd, cols, theta, adjacent);
  EXPECT_LT(rel_err(y, yo), 2e-6);
  for (int i = 0; i < M; ++i)
    for (int c = heads * hd; c < cols; ++c) EXPECT_EQ(y[i * cols + c], x[i * cols + c]);
  // The backward of a rotation is the inverse rotation: rope(dy, inverse) = d(sum dy*y)/dx.
  FVec dy = rng.normal(size_t(M) * cols), dx = dy;
  fx.be->rope(mat(dx, M, cols), pos.data(), heads, hd, RopeFreqs::plain(theta, hd), adjacent, true);
  for (int i = 0; i < M; ++i)
    for (int c = heads * hd; c < cols; ++c) dx[i * cols + c] = 0.f;  // not part of rope
  Vec dyd = to_d(dy);
  for (int i = 0; i < M; ++i)
    for (int c = heads * hd; c < cols; ++c) dyd[i * cols + c] = 0.0;
  check_grad(
      "rope dx",
      [&](const Vec& xv) {
        return dot(dyd, rope_oracle(xv, pos, M, heads, hd, cols, theta, adjacent));
      },
      xd, dx, 22);
  // Forward then inverse is the identity.
  FVec z = y;
  fx.be->rope(mat(z, M, cols), pos.data(), heads, hd, RopeFreqs::plain(theta, hd), adjacent, true);
  EXPECT_LT(rel_err(z, xd), 1e-6);
}
// rope_to_16 (the bf16 forward's stored q / k): the bits of rope then bf16 rounding, x left as
// it was, within one bf16 step of the double oracle; positions past the row count (a table per
// row) and within it (a table per position).
TEST_P(BackendRope, ToBf16MatchesRopeThenRounding) {
  const bool adjacent = GetParam();
  Fixture fx;
  for (int max_pos : {2000, 10}) {
    SCOPED_TRACE(max_pos);
    Rng rng(uint64_t(23 + max_pos));
    const int M = 23, heads = 3, hd = 16, cols = heads * hd;
    const float theta = 10000.f;
    std::vector<int32_t> pos(M);
    for (int i = 0; i < M; ++i) pos[i] = rng.uniform_int(0, max_pos);
    FVec x = rng.normal(size_t(M) * cols), y = x, keep = x;
    fx.be->rope(mat(y, M, cols), pos.data(), heads, hd, RopeFreqs::plain(theta, hd), adjacent,
                false);
    std::vector<uint16_t> x16(x.size());
    fx.be->rope_to_16(mat(x, M, cols), pos.data(), heads, hd, RopeFreqs::plain(theta, hd), adjacent,
                      DType::BF16, x16.data());
    const Vec yo = rope_oracle(to_d(keep), pos, M, heads, hd, cols, theta, adjacent);
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(x16[i], f32_to_bf16(y[i])) << i;
      ASSERT_EQ(x[i], keep[i]) << "x written at " << i;
      if (std::fabs(yo[i]) < 1e-3) continue;  // cancellation: relative error is meaningless
      const uint16_t w = f32_to_bf16(float(yo[i]));
      ASSERT_LE(std::abs(int(int16_t(x16[i])) - int(int16_t(w))), 1) << i;
    }
  }
}
INSTANTIATE_TEST_SUITE_P(Conventions, BackendRope, ::testing::Values(false, true));

// Hugging Face computes inv_freq and the angles in float32; at positions in the thousands a
// double-precision angle would differ from theirs by more than the tolerance.
TEST(BackendRopeParity, MatchesTransformersAtLargePositions) {
  auto st = SafetensorsFile::open(fixture_path("backend/rope.safetensors"));
  auto get = [&](const std::string& name, DType want) -> const SafeTensorInfo& {
    for (const auto& t : st->tensors())
      if (t.name == name) {
        EXPECT_EQ(int(t.dtype), int(want)) << name;
        return t;
      }
    throw std::runtime_error("fixture tensor missing: " + name);
  };
  Fixture fx;
  for (int i = 0; i < 2; ++i) {
    std::string p = "t" + std::to_string(i) + ".";
    const auto& meta = get(p + "meta", DType::F32);
    const float* m = reinterpret_cast<const float*>(meta.data);
    const float theta = m[0];
    const int hd = int(m[1]), heads = int(m[2]);
    const auto& xt = get(p + "x", DType::F32);
    const auto& yt = get(p + "y", DType::F32);
    const auto& pt = get(p + "pos", DType::I32);
    const int rows = int(pt.numel()), cols = heads * hd;
    ASSERT_EQ(xt.numel(), int64_t(rows) * cols);
    FVec x(reinterpret_cast<const float*>(xt.data),
           reinterpret_cast<const float*>(xt.data) + xt.numel());
    const float* y = reinterpret_cast<const float*>(yt.data);
    const int32_t* pos = reinterpret_cast<const int32_t*>(pt.data);
    fx.be->rope(mat(x, rows, cols), pos, heads, hd, RopeFreqs::plain(theta, hd), false, false);
    double err = 0;
    for (int64_t j = 0; j < xt.numel(); ++j) err = std::max(err, double(std::fabs(x[j] - y[j])));
    EXPECT_LT(err, 1e-5) << "theta " << theta << " head_dim " << hd;
  }
}

TEST(BackendSwiglu, ForwardAndBackward) {
  Fixture fx;
  Rng rng(31);
  const int M = 11, C = 45;
  FVec g = rng.normal(M * C, 3.f), u = rng.normal(M * C), out(M * C);
  g[0] = 90.f;  // saturated sigmoid on both sides
  g[1] = -90.f;
  fx.be->swiglu_fwd(cmat(g, M, C), cmat(u, M, C), mat(out, M, C));
  Vec gd = to_d(g), ud = to_d(u);
  auto oracle = [&](const Vec& gv, const Vec& uv) {
    Vec o(gv.size());
    for (size_t i = 0; i < o.size(); ++i) o[i] = silu_d(gv[i]) * uv[i];
    return o;
  };
  EXPECT_LT(rel_err(out, oracle(gd, ud)), 1e-6);
  FVec dout = rng.normal(M * C), dg(M * C, 99.f), du(M * C, 99.f);  // overwritten, not added
  fx.be->swiglu_bwd(cmat(g, M, C), cmat(u, M, C), cmat(dout, M, C), mat(dg, M, C), mat(du, M, C));
  Vec dd = to_d(dout);
  check_grad(
      "swiglu dgate", [&](const Vec& gv) { return dot(dd, oracle(gv, ud)); }, gd, dg, 32);
  check_grad(
      "swiglu dup", [&](const Vec& uv) { return dot(dd, oracle(gd, uv)); }, ud, du, 33);
}

// GeGLU (Gemma): gelu_pytorch_tanh(gate) * up against a double oracle of torch's formula,
// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), its gradients by finite differences; large
// |gate| saturates tanh on both sides.
TEST(BackendGeglu, ForwardAndBackward) {
  Fixture fx;
  Rng rng(34);
  const int M = 11, C = 45;
  FVec g = rng.normal(M * C, 3.f), u = rng.normal(M * C), out(M * C);
  g[0] = 40.f;
  g[1] = -40.f;
  fx.be->geglu_fwd(cmat(g, M, C), cmat(u, M, C), mat(out, M, C));
  Vec gd = to_d(g), ud = to_d(u);
  auto oracle = [&](const Vec& gv, const Vec& uv) {
    Vec o(gv.size());
    const double k = std::sqrt(2.0 / M_PI);
    for (size_t i = 0; i < o.size(); ++i) {
      const double x = gv[i];
      o[i] = 0.5 * x * (1 + std::tanh(k * (x + 0.044715 * x * x * x))) * uv[i];
    }
    return o;
  };
  EXPECT_LT(rel_err(out, oracle(gd, ud)), 1e-6);
  FVec dout = rng.normal(M * C), dg(M * C, 99.f), du(M * C, 99.f);  // overwritten, not added
  fx.be->geglu_bwd(cmat(g, M, C), cmat(u, M, C), cmat(dout, M, C), mat(dg, M, C), mat(du, M, C));
  Vec dd = to_d(dout);
  check_grad(
      "geglu dgate", [&](const Vec& gv) { return dot(dd, oracle(gv, ud)); }, gd, dg, 35);
  check_grad(
      "geglu dup", [&](const Vec& uv) { return dot(dd, oracle(gd, uv)); }, ud, du, 36);
}

// swiglu_fwd_from_16 (gate and up arriving rounded, as linear_fwd_to_16 writes them): the bits
// of swiglu_fwd_16's output on the fp32 gate / up those round from, the Backend default's bits
// too, and within one bf16 step of a double oracle, on ragged shapes. Every ISA level through
// the `isa` label.
TEST(BackendSwiglu, ForwardFromBf16) {
  Fixture fx;
  for (auto [M, C] : {std::pair{13, 45}, std::pair{3, 17}, std::pair{1, 64}, std::pair{6, 1}}) {
    SCOPED_TRACE(::testing::Message() << M << " x " << C);
    Rng rng(uint64_t(M) * 1000 + C);
    FVec gf = rng.normal(size_t(M) * C, 3.f), uf = rng.normal(size_t(M) * C);
    gf[0] = 90.f;
    if (gf.size() > 1) gf[1] = -90.f;
    const size_t n = gf.size();
    std::vector<uint16_t> g16(n), u16(n), want16(n), got16(n, 0x7fc1), def16(n, 0x7fc1);
    for (size_t i = 0; i < n; ++i) {
      g16[i] = f32_to_bf16(gf[i]);
      u16[i] = f32_to_bf16(uf[i]);
    }
    // swiglu_fwd_16 on the fp32 values (it rounds them itself).
    std::vector<uint16_t> g16b(n), u16b(n);
    FVec gc = gf, uc = uf;
    fx.be->swiglu_fwd_16(mat(gc, M, C), mat(uc, M, C), MatF(nullptr, M, C), DType::BF16,
                         g16b.data(), u16b.data(), want16.data(), false);
    ASSERT_EQ(g16b, g16);
    ASSERT_EQ(u16b, u16);
    fx.be->swiglu_fwd_from_16(DType::BF16, g16.data(), u16.data(), got16.data(), M, C);
    fx.be->Backend::swiglu_fwd_from_16(DType::BF16, g16.data(), u16.data(), def16.data(), M, C);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(got16[i], want16[i]) << i;
      ASSERT_EQ(def16[i], want16[i]) << i;
      const double g = bf16_to_f32(g16[i]), u = bf16_to_f32(u16[i]);
      const double want = g / (1.0 + std::exp(-g)) * u;
      if (std::fabs(want) < 1e-30) {  // the clamped exp's tail (a saturated gate) against exp
        ASSERT_LT(std::fabs(bf16_to_f32(got16[i])), 1e-30);
        continue;
      }
      const int diff = std::abs(int(int16_t(got16[i])) - int(int16_t(f32_to_bf16(float(want)))));
      ASSERT_LE(diff, 1) << i << " got " << bf16_to_f32(got16[i]) << " want " << want;
    }
  }
}

// swiglu_bwd_to_16 (the bf16 backward's dgate / dup, written as the gate / up dx GEMMs take
// them): the bits of swiglu_bwd_16 then bf16 rounding, and within one bf16 step of a double
// oracle rounded to bf16, on ragged shapes at a row stride wider than the columns (its spare
// columns untouched). Every ISA level through the `isa` label.
TEST(BackendSwiglu, BackwardToBf16) {
  Fixture fx;
  for (auto [M, C] : {std::pair{13, 45}, std::pair{3, 17}, std::pair{1, 64}}) {
    SCOPED_TRACE(::testing::Message() << M << " x " << C);
    Rng rng(uint64_t(M) * 100 + C);
    FVec gf = rng.normal(size_t(M) * C, 3.f), uf = rng.normal(size_t(M) * C),
         dout = rng.normal(size_t(M) * C);
    gf[0] = 90.f;
    if (gf.size() > 1) gf[1] = -90.f;
    std::vector<uint16_t> g16(gf.size()), u16(uf.size());
    for (size_t i = 0; i < gf.size(); ++i) {
      g16[i] = f32_to_bf16(gf[i]);
      u16[i] = f32_to_bf16(uf[i]);
    }
    // The separate ops.
    FVec groom(gf.size()), uroom(uf.size()), dg(gf.size()), du(gf.size());
    fx.be->swiglu_bwd_16(mat(groom, M, C), mat(uroom, M, C), DType::BF16, g16.data(), u16.data(),
                         cmat(dout, M, C), mat(dg, M, C), mat(du, M, C));
    const int64_t ld = C + 5;
    std::vector<uint16_t> dg16(size_t(M * ld), 0x7fc1), du16(size_t(M * ld), 0x7fc1);
    fx.be->swiglu_bwd_to_16(DType::BF16, g16.data(), u16.data(), cmat(dout, M, C),
                            View2<uint16_t>(dg16.data(), M, C, ld),
                            View2<uint16_t>(du16.data(), M, C, ld));
    int off_by_one = 0;
    for (int i = 0; i < M; ++i) {
      for (int j = 0; j < C; ++j) {
        const size_t e = size_t(i) * C + j, o = size_t(i * ld + j);
        ASSERT_EQ(dg16[o], f32_to_bf16(dg[e])) << "dgate " << i << "," << j;
        ASSERT_EQ(du16[o], f32_to_bf16(du[e])) << "dup " << i << "," << j;
        // The double oracle on the bf16 gate / up values.
        const double g = bf16_to_f32(g16[e]), u = bf16_to_f32(u16[e]), d = dout[e];
        const double sg = 1.0 / (1.0 + std::exp(-g));
        const double want_g = d * u * sg * (1.0 + g * (1.0 - sg)), want_u = d * g * sg;
        for (auto [got, want] : {std::pair{dg16[o], want_g}, std::pair{du16[o], want_u}}) {
          const uint16_t w = f32_to_bf16(float(want));
          if (std::fabs(want) < 1e-30) {  // the clamped exp's tail (a saturated gate) against exp
            ASSERT_LT(std::fabs(bf16_to_f32(got)), 1e-30);
            continue;
          }
          const int diff = std::abs(int(int16_t(got)) - int(int16_t(w)));  // same-sign steps
          ASSERT_LE(diff, 1) << i << "," << j << " got " << bf16_to_f32(got) << " want " << want;
          off_by_one += diff;
        }
      }
      for (int64_t j = C; j < ld; ++j) {
        ASSERT_EQ(dg16[size_t(i * ld + j)], 0x7fc1);
        ASSERT_EQ(du16[size_t(i * ld + j)], 0x7fc1);
      }
    }
    EXPECT_LE(off_by_one, 2 * M * C / 20) << "more than a few roundings on the other side";
  }
}

// ---- attention --------------------------------------------------------------------------------

namespace {

struct AttnCase {
  int batch, seq, heads, kv, hd;
  bool docs;
  int64_t block_q;
  int64_t stair = 0;  // CpuTuning::attn_stair_rows (0: whole tiles)
  float q_sd = 1.f;   // large values give scores far apart: softmax stability
  int window = 0;     // AttnShape::window (sliding-window attention)
  float softcap = 0;  // AttnShape::softcap and scale (Gemma 2)
  float scale = 0;
};

// fp32 tiles on oneDNN (the default, first keys rounded down to 64) or on sgemm(): OpenBLAS, or
// with blas_onednn oneDNN's dnnl_sgemm.
void run_attention_on(const AttnCase& c, uint64_t seed, bool onednn, bool blas_onednn = false) {
  SCOPED_TRACE(onednn        ? "tiles on oneDNN"
               : blas_onednn ? "tiles on sgemm, oneDNN"
                             : "tiles on sgemm, OpenBLAS");
  Fixture fx;
  fx.cpu().tune.attn_block_q = c.block_q;
  fx.cpu().tune.attn_stair_rows = c.stair;
  fx.cpu().tune.f32_attn_onednn = onednn;
  if (blas_onednn) fx.cpu().tune.f32_blas = cpu::CpuTuning::F32Blas::OneDnn;
  Rng rng(seed);
  AttnShape s = attn_shape(c.batch, c.seq, c.heads, c.kv, c.hd);
  s.window = c.window;
  s.softcap = c.softcap;
  s.scale = c.scale;
  const int rows = c.batch * c.seq, qc = c.heads * c.hd, kc = c.kv * c.hd;
  std::vector<int32_t> doc(rows);
  if (c.docs) {  // documents of random lengths; ids restart per batch element
    for (int b = 0; b < c.batch; ++b) {
      int d = 0, left = rng.uniform_int(1, c.seq / 2);
      for (int t = 0; t < c.seq; ++t) {
        if (left-- == 0) {
          ++d;
          left = rng.uniform_int(1, c.seq / 2) - 1;
        }
        doc[b * c.seq + t] = d;
      }
    }
    s.doc_ids = doc.data();
  }
  FVec q = rng.normal(size_t(rows) * qc, c.q_sd), k = rng.normal(size_t(rows) * kc),
       v = rng.normal(size_t(rows) * kc);
  FVec out(size_t(rows) * qc), lse(size_t(c.heads) * rows);
  fx.be->attention_fwd(s, cmat(q, rows, qc), cmat(k, rows, kc), cmat(v, rows, kc),
                       mat(out, rows, qc), lse.data());
  Vec qd = to_d(q), kd = to_d(k), vd = to_d(v), oo, lo;
  const std::vector<int32_t>* dp = c.docs ? &doc : nullptr;
  attention_oracle(s, qd, kd, vd, dp, oo, &lo);
  EXPECT_LT(rel_err(out, oo), 5e-6) << "attention out";
  EXPECT_LT(rel_err(lse, lo), 5e-6) << "attention lse";

  FVec dout = rng.normal(size_t(rows) * qc);
  FVec dq(q.size(), 0.f), dk(k.size(), 0.f), dv(v.size(), 0.f);
  fx.be->attention_bwd(s, cmat(q, rows, qc), cmat(k, rows, kc), cmat(v, rows, kc),
                       cmat(out, rows, qc), lse.data(), cmat(dout, rows, qc), mat(dq, rows, qc),
                       mat(dk, rows, kc), mat(dv, rows, kc));
  Vec dd = to_d(dout);
  auto L = [&](const Vec& qv, const Vec& kv, const Vec& vv) {
    Vec o;
    attention_oracle(s, qv, kv, vv, dp, o, nullptr);
    return dot(dd, o);
  };
  check_grad(
      "attention dq", [&](const Vec& x) { return L(x, kd, vd); }, qd, dq, seed + 1, 2e-4, 2, 8);
  check_grad(
      "attention dk", [&](const Vec& x) { return L(qd, x, vd); }, kd, dk, seed + 2, 2e-4, 2, 8);
  check_grad(
      "attention dv", [&](const Vec& x) { return L(qd, kd, x); }, vd, dv, seed + 3, 2e-4, 2, 8);
}

void run_attention(const AttnCase& c, uint64_t seed) {
  run_attention_on(c, seed, true);
  run_attention_on(c, seed, false);
  run_attention_on(c, seed, false, true);
}

}  // namespace

// The tiles flush subnormals on their threads (CpuTuning::flush_denormals) and leave the calling
// thread's floating-point environment as it was, flushing or not.
TEST(BackendAttention, CallerFloatEnvironmentKept) {
  Fixture fx;
  fx.cpu().tune.attn_block_q = 4;
  AttnShape s = attn_shape(1, 9, 2, 1, 8);
  Rng rng(61);
  const int rows = 9, qc = 16, kc = 8;
  FVec q = rng.normal(size_t(rows) * qc), k = rng.normal(size_t(rows) * kc),
       v = rng.normal(size_t(rows) * kc), out(size_t(rows) * qc), lse(size_t(2) * rows),
       dout = rng.normal(size_t(rows) * qc), dq(q.size()), dk(k.size()), dv(v.size());
  auto control = [] { return _mm_getcsr() & ~kMxcsrFlags; };  // MXCSR's control bits
  const unsigned before = _mm_getcsr();
  for (const unsigned csr :
       {before & ~kMxcsrFtzDaz & ~kMxcsrFlags, (before | kMxcsrFtzDaz) & ~kMxcsrFlags}) {
    _mm_setcsr(csr);
    fx.be->attention_fwd(s, cmat(q, rows, qc), cmat(k, rows, kc), cmat(v, rows, kc),
                         mat(out, rows, qc), lse.data());
    EXPECT_EQ(control(), csr) << "after attention_fwd";
    fx.be->attention_bwd(s, cmat(q, rows, qc), cmat(k, rows, kc), cmat(v, rows, kc),
                         cmat(out, rows, qc), lse.data(), cmat(dout, rows, qc), mat(dq, rows, qc),
                         mat(dk, rows, kc), mat(dv, rows, kc));
    EXPECT_EQ(control(), csr) << "after attention_bwd";
  }
  _mm_setcsr(before);
}

// QLFT_CPU_TUNE's parsing: fields by name, bad names and values refused naming them.
TEST(CpuTuningEnv, SetsFieldsAndRefusesUnknownNames) {
  cpu::CpuTuning t;
  cpu::apply_tuning_env(t, "attn_block_q=32,flush_denormals=0,,attn_stair_rows_bf16=16");
  EXPECT_EQ(t.attn_block_q, 32);
  EXPECT_FALSE(t.flush_denormals);
  EXPECT_EQ(t.attn_stair_rows_bf16, 16);
  EXPECT_EQ(t.attn_stair_rows, cpu::CpuTuning().attn_stair_rows);
  cpu::apply_tuning_env(t, "bf16_gemm=sgemm,f32_blas=onednn");
  EXPECT_EQ(t.bf16_gemm, cpu::CpuTuning::Bf16Gemm::Sgemm);
  EXPECT_EQ(t.f32_blas, cpu::CpuTuning::F32Blas::OneDnn);
  cpu::apply_tuning_env(t, "f32_blas=openblas,bf16_gemm=auto,bf16_lora_db_rows=1");
  EXPECT_TRUE(t.bf16_lora_db_rows);
  EXPECT_EQ(t.bf16_gemm, cpu::CpuTuning::Bf16Gemm::Auto);
  EXPECT_EQ(t.f32_blas, cpu::CpuTuning::F32Blas::OpenBlas);
  auto refused = [&](const char* spec, const char* says) {
    try {
      cpu::apply_tuning_env(t, spec);
      ADD_FAILURE() << spec << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), QLFT_ERR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused("attn_blockq=32", "unknown setting 'attn_blockq'");
  refused("flush_denormals=yes", "flush_denormals=yes must be 0 or 1");
  refused("attn_block_q=3x", "attn_block_q=3x is not an integer");
  refused("attn_block_q", "'attn_block_q' is not name=value");
  refused("bf16_gemm=openblas", "bf16_gemm=openblas must be auto, onednn or sgemm");
}

TEST(BackendAttention, MhaSingleBlock) {
  run_attention({1, 13, 2, 2, 8, false, 64}, 41);
}
TEST(BackendAttention, MhaSingleBlockStairs) {  // a ragged last step
  run_attention({1, 13, 2, 2, 8, false, 64, 5}, 48);
}
TEST(BackendAttention, Gqa8to4Ragged) {
  run_attention({2, 21, 8, 4, 8, false, 8}, 42);
}
TEST(BackendAttention, Gqa8to4RaggedStairs) {
  run_attention({2, 21, 8, 4, 8, false, 8, 3}, 49);
}
TEST(BackendAttention, Gqa4to1) {
  run_attention({2, 19, 4, 1, 16, false, 5, 2}, 43);
}
TEST(BackendAttention, DocIdsPacking) {
  run_attention({2, 27, 4, 2, 8, true, 8, 3}, 44);
}
TEST(BackendAttention, DocIdsGqa4to1DefaultBlock) {
  run_attention({1, 70, 4, 1, 8, true, 64}, 45);
}
TEST(BackendAttention, DocIdsGqa4to1DefaultStairs) {  // the defaults' ratio: 2 steps of a tile
  run_attention({1, 70, 4, 1, 8, true, 32, 16}, 50);
}
// Packed documents in tiles of 16 queries: on oneDNN tiles whose first key rounds down to a
// multiple of 16 across another document's keys (masked).
TEST(BackendAttention, DocIdsLongSequence) {
  run_attention({1, 150, 2, 1, 8, true, 16, 5}, 47);
}
TEST(BackendAttention, LargeScores) {
  run_attention({1, 33, 2, 1, 8, false, 16, 4, 12.f}, 46);
}
// Sliding windows (Mistral, Gemma's local layers): shorter than a tile, across tiles and
// stairs, with packed documents, and one longer than the sequence (no effect).
TEST(BackendAttention, SlidingWindow) {
  run_attention({2, 21, 4, 2, 8, false, 8, 3, 1.f, 5}, 52);
  run_attention({1, 70, 4, 1, 8, false, 64, 0, 1.f, 2}, 53);
  run_attention({1, 70, 4, 1, 8, false, 16, 5, 1.f, 23}, 54);
  run_attention({1, 13, 2, 2, 8, false, 64, 0, 1.f, 40}, 55);
}
TEST(BackendAttention, SlidingWindowDocIds) {
  run_attention({2, 27, 4, 2, 8, true, 8, 3, 1.f, 6}, 56);
  run_attention({1, 150, 2, 1, 8, true, 16, 5, 1.f, 20}, 57);
}

// Gemma 2's scores: scaled by 24^-0.5 (not head_dim^-0.5) and soft-capped at 2 (q spread so
// that most scores bend), with its sliding window and packed documents; the gradients against
// the oracle's finite differences go through the cap's tanh.
TEST(BackendAttention, SoftCapAndScale) {
  run_attention({2, 21, 4, 2, 8, false, 8, 3, 3.f, 0, 2.f, 0.2041241f}, 58);
  run_attention({1, 70, 4, 1, 16, true, 16, 5, 3.f, 6, 2.f, 0.2041241f}, 59);
  run_attention({1, 33, 2, 1, 8, false, 64, 0, 12.f, 0, 50.f, 0.f}, 60);  // Gemma 2's cap of 50
}

// ---- embedding, head, cross-entropy -----------------------------------------------------------

TEST(BackendEmbedding, GathersRowsAndRejectsBadIds) {
  Fixture fx;
  Rng rng(51);
  const int V = 17, H = 12, M = 9;
  FVec E = rng.normal(V * H);
  QWeight qe = qweight_from_f32(&fx.tracker, E.data(), V, H, QuantKind::F32);
  std::vector<int32_t> tok(M);
  for (auto& t : tok) t = rng.uniform_int(0, V - 1);
  FVec out(M * H);
  fx.be->embedding_fwd(qe, tok.data(), mat(out, M, H));
  for (int i = 0; i < M; ++i)
    for (int c = 0; c < H; ++c) ASSERT_EQ(out[i * H + c], E[tok[i] * H + c]);
  for (int32_t bad : {V, -1}) {
    tok[4] = bad;
    try {
      fx.be->embedding_fwd(qe, tok.data(), mat(out, M, H));
      ADD_FAILURE() << "no error for token id " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), QLFT_ERR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos) << e.what();
    }
  }
}

TEST(BackendHead, LogitsMatchOracle) {
  Fixture fx;
  fx.shrink();
  Rng rng(61);
  const int V = 77, H = 20, M = 9;
  FVec head = rng.normal(V * H), h = rng.normal(M * H), logits(M * V);
  QWeight qh = qweight_from_f32(&fx.tracker, head.data(), V, H, QuantKind::F32);
  fx.be->head_logits(qh, cmat(h, M, H), mat(logits, M, V));
  Vec o(M * V, 0.0);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < V; ++j)
      for (int c = 0; c < H; ++c) o[i * V + j] += double(h[i * H + c]) * head[j * H + c];
  EXPECT_LT(rel_err(logits, o), 2e-6);
}

namespace {
void run_ce(bool shrink, uint64_t seed, bool blas_onednn = false) {
  Fixture fx;
  if (shrink) fx.shrink();
  if (blas_onednn) fx.cpu().tune.f32_blas = cpu::CpuTuning::F32Blas::OneDnn;
  Rng rng(seed);
  const int V = 101, H = 24, M = 29;
  const int32_t ignore = -100;
  FVec head = rng.normal(V * H, 0.5f), h = rng.normal(M * H);
  std::vector<int32_t> t(M);
  for (int i = 0; i < M; ++i) t[i] = (i % 4 == 1) ? ignore : rng.uniform_int(0, V - 1);
  t[0] = V - 1;  // last vocab row (end of the last panel)
  QWeight qh = qweight_from_f32(&fx.tracker, head.data(), V, H, QuantKind::F32);
  const float gs = 0.37f;
  FVec dh(M * H, 0.f);
  int64_t count = -1;
  double loss =
      fx.be->linear_cross_entropy(qh, cmat(h, M, H), t.data(), ignore, gs, mat(dh, M, H), &count);
  Vec hd = to_d(h);
  int64_t ocount = 0;
  double lo = ce_oracle(hd, head, t, ignore, M, V, H, &ocount);
  EXPECT_EQ(count, ocount);
  EXPECT_NEAR(loss, lo, 1e-5 * std::fabs(lo));
  for (int i = 0; i < M; ++i) {
    if (t[i] == ignore) {
      for (int c = 0; c < H; ++c) EXPECT_EQ(dh[i * H + c], 0.f) << "ignored row " << i;
    }
  }
  FVec g(dh.size());
  for (size_t i = 0; i < g.size(); ++i) g[i] = dh[i] / gs;
  check_grad(
      "cross-entropy dh", [&](const Vec& x) { return ce_oracle(x, head, t, ignore, M, V, H); }, hd,
      g, seed + 1);
  // Without dh: same loss, nothing written.
  int64_t c2 = 0;
  double loss2 = fx.be->linear_cross_entropy(qh, cmat(h, M, H), t.data(), ignore, gs, MatF(), &c2);
  EXPECT_EQ(loss2, loss);
  EXPECT_EQ(c2, count);

  // The same loss over the head in uneven row slices, one at a time (a ZeRO-3 row-sharded
  // head): slices of 1, 39, 1 and 60 rows, targets in each, against the same oracle.
  const int64_t cuts[] = {0, 1, 40, 41, V};
  std::vector<QWeight> slices;
  for (int k = 0; k < 4; ++k)
    slices.push_back(qweight_from_f32(&fx.tracker, head.data() + cuts[k] * H, cuts[k + 1] - cuts[k],
                                      H, QuantKind::F32));
  std::vector<CrossEntropyRow> st(M);
  for (int k = 0; k < 4; ++k)
    fx.be->cross_entropy_stats(slices[k], cuts[k], V, cmat(h, M, H), t.data(), ignore, st.data());
  FVec lse(M);
  int64_t c3 = -1;
  const double loss3 = cross_entropy_finish(st.data(), t.data(), M, ignore, lse.data(), &c3);
  EXPECT_EQ(c3, ocount);
  EXPECT_NEAR(loss3, lo, 1e-5 * std::fabs(lo));
  FVec dh3(M * H, 0.f);
  for (int k = 0; k < 4; ++k)
    fx.be->cross_entropy_grad(slices[k], cuts[k], V, cmat(h, M, H), t.data(), ignore, lse.data(),
                              gs, mat(dh3, M, H));
  for (size_t i = 0; i < g.size(); ++i) g[i] = dh3[i] / gs;
  check_grad(
      "cross-entropy dh over slices",
      [&](const Vec& x) { return ce_oracle(x, head, t, ignore, M, V, H); }, hd, g, seed + 2);
  // The one walk over the same slices (fp32: Backend::cross_entropy_walk), against the oracle.
  ASSERT_EQ(fx.be->cross_entropy_walks(), 1);
  std::vector<CrossEntropyRow> st4(M);
  FVec acc(M * H, 0.f), dh4(M * H, 0.f);
  for (int k = 0; k < 4; ++k)
    fx.be->cross_entropy_walk(slices[k], cuts[k], V, cmat(h, M, H), t.data(), ignore, gs,
                              st4.data(), acc.data(), mat(dh4, M, H));
  cross_entropy_walk_end(st4.data(), t.data(), ignore, gs, acc.data(), mat(dh4, M, H));
  int64_t c4 = -1;
  EXPECT_NEAR(cross_entropy_finish(st4.data(), t.data(), M, ignore, lse.data(), &c4), lo,
              1e-5 * std::fabs(lo));
  EXPECT_EQ(c4, ocount);
  for (size_t i = 0; i < g.size(); ++i) g[i] = dh4[i] / gs;
  check_grad(
      "cross-entropy dh in one walk over slices",
      [&](const Vec& x) { return ce_oracle(x, head, t, ignore, M, V, H); }, hd, g, seed + 3);
}
}  // namespace

// Gemma 2's final soft-cap (cap 3 on logits of spread ~5, so tanh bends them): the capped loss
// and dh through the cap against the capped double oracle (dh by its finite differences), in
// default and small panels / chunks (the cap per panel); softcap() on head_logits equals the
// capped double logits.
TEST(BackendCrossEntropy, SoftCappedLogits) {
  for (const bool shrink : {false, true}) {
    SCOPED_TRACE(shrink ? "small panels" : "default blocks");
    Fixture fx;
    if (shrink) fx.shrink();
    Rng rng(74 + shrink);
    const int V = 101, H = 24, M = 29;
    const int32_t ignore = -100;
    const double cap = 3;
    FVec head = rng.normal(V * H, 1.f), h = rng.normal(M * H);
    std::vector<int32_t> t(M);
    for (int i = 0; i < M; ++i) t[i] = (i % 4 == 1) ? ignore : rng.uniform_int(0, V - 1);
    t[0] = V - 1;
    QWeight qh = qweight_from_f32(&fx.tracker, head.data(), V, H, QuantKind::F32);
    const float gs = 0.37f;
    FVec dh(M * H, 0.f);
    int64_t count = -1;
    const double loss = fx.be->linear_cross_entropy_capped(qh, cmat(h, M, H), t.data(), ignore, gs,
                                                           float(cap), mat(dh, M, H), &count);
    const Vec hd = to_d(h);
    int64_t oc = 0;
    const double lo = ce_oracle(hd, head, t, ignore, M, V, H, &oc, cap);
    EXPECT_EQ(count, oc);
    EXPECT_NEAR(loss, lo, 1e-5 * std::fabs(lo));
    EXPECT_GT(std::fabs(ce_oracle(hd, head, t, ignore, M, V, H) - lo), 0.1 * std::fabs(lo))
        << "the cap is visible in the loss";
    FVec g(dh.size());
    for (size_t i = 0; i < g.size(); ++i) g[i] = dh[i] / gs;
    check_grad(
        "capped cross-entropy dh",
        [&](const Vec& x) { return ce_oracle(x, head, t, ignore, M, V, H, nullptr, cap); }, hd, g,
        75);
    FVec logits(size_t(M) * V);
    fx.be->head_logits(qh, cmat(h, M, H), mat(logits, M, V));
    fx.be->softcap(mat(logits, M, V), float(cap));
    Vec o(size_t(M) * V, 0.0);
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < V; ++j) {
        double s = 0;
        for (int c = 0; c < H; ++c) s += double(h[i * H + c]) * head[j * H + c];
        o[size_t(i) * V + j] = cap * std::tanh(s / cap);
      }
    EXPECT_LT(rel_err(logits, o), 2e-6);
  }
}

TEST(BackendCrossEntropy, DefaultBlocks) {
  run_ce(false, 71);
}
TEST(BackendCrossEntropy, SmallPanelsAndChunks) {
  run_ce(true, 72);
}
TEST(BackendCrossEntropy, SgemmOnOneDnn) {
  run_ce(true, 73, true);
}
