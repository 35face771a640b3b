// Every CudaBackend op against the CPU backend on the same inputs, by normalized error
// (||cuda - cpu|| / ||cpu||): fp32 GEMM mode to 1e-5, bf16 mode to 2e-2. Weights in every storage
// format the device dequantizes (a fixed ragged shape and seeded drawn ones); LoRA with dropout;
// GQA and packed-document attention with head dims 8, 64 and 128 and ragged sequence lengths;
// cross-entropy with ignored targets.
#include <gtest/gtest.h>

#include <cstdio>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda_entry.h"
#include "backend/cuda_sizes.h"
#include "core/half.h"
#include "cuda_test_util.h"
#include "quant/ggml_types.h"
#include "quant/qweight.h"

using qlft_cuda_test::norm_err;

namespace {

using FVec = std::vector<float>;

struct Rng {
  std::mt19937_64 g;
  explicit Rng(uint64_t s) : g(s) {}
  FVec normal(size_t n, float sd = 1.f) {
    std::normal_distribution<float> d(0.f, sd);
    FVec v(n);
    for (auto& x : v) x = d(g);
    return v;
  }
  // A size drawn uniformly from [lo, hi] (the shapes below are drawn, seeded, so ragged tails
  // of every kernel's tiling are hit in different places; the trace names each shape).
  int64_t size(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(g); }
};

struct Pair {
  qlft::MemoryTracker tracker;
  std::unique_ptr<qlft::Backend> cpu, gpu;
  explicit Pair(const char* precision = "fp32") {
    cpu = qlft::make_cpu_backend(&tracker);
    qlft::CudaBackendOptions o;
    const std::string pr = precision;  // the test's labels: fp32, bf16, fp16
    o.spec.precision = pr == "bf16"   ? qlft::Precision::BF16
                       : pr == "fp16" ? qlft::Precision::FP16
                                      : qlft::Precision::FP32;
    gpu = qlft::make_cuda_backend(&tracker, o);
  }
};

qlft::MatF mat(FVec& v, int64_t r, int64_t c) {
  return {v.data(), r, c, c};
}
qlft::CMatF cmat(const FVec& v, int64_t r, int64_t c) {
  return {v.data(), r, c, c};
}

// Random GGUF blocks with sane f16 scales.
qlft::QWeight ggml_weight(qlft::MemoryTracker* t, qlft::GgmlType type, int64_t rows, int64_t cols,
                          uint64_t seed) {
  const qlft::GgmlTypeTraits* tr = qlft::ggml_type_traits(uint32_t(type));
  const int64_t nb = rows * cols / tr->block;
  std::vector<uint8_t> bytes(size_t(nb * tr->bytes));
  std::mt19937_64 g(seed);
  for (auto& b : bytes) b = uint8_t(g());
  const uint16_t d = qlft::f32_to_f16(0.02f), dm = qlft::f32_to_f16(0.01f);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* p = bytes.data() + b * tr->bytes;
    switch (type) {
      case qlft::GgmlType::Q6_K:
        std::memcpy(p + 208, &d, 2);
        break;
      case qlft::GgmlType::Q4_1:
      case qlft::GgmlType::Q4_K:
      case qlft::GgmlType::Q5_K:
        std::memcpy(p, &d, 2);
        std::memcpy(p + 2, &dm, 2);
        break;
      default:
        std::memcpy(p, &d, 2);
        break;
    }
  }
  return qlft::qweight_from_ggml(t, uint32_t(type), bytes.data(), rows, cols);
}

struct WeightCase {
  std::string name;
  std::function<qlft::QWeight(qlft::MemoryTracker*, const FVec&, int64_t, int64_t)> make;
};

std::vector<WeightCase> weight_cases() {
  auto from = [](qlft::QuantKind k, bool dq) {
    return [k, dq](qlft::MemoryTracker* t, const FVec& w, int64_t r, int64_t c) {
      return qlft::qweight_from_f32(t, w.data(), r, c, k, 64, dq);
    };
  };
  auto gg = [](qlft::GgmlType ty) {
    return [ty](qlft::MemoryTracker* t, const FVec&, int64_t r, int64_t c) {
      return ggml_weight(t, ty, r, c, 7 + uint64_t(ty));
    };
  };
  return {
      {"f32", from(qlft::QuantKind::F32, false)},   {"f16", from(qlft::QuantKind::F16, false)},
      {"bf16", from(qlft::QuantKind::BF16, false)}, {"nf4", from(qlft::QuantKind::NF4, false)},
      {"nf4_dq", from(qlft::QuantKind::NF4, true)}, {"int8", from(qlft::QuantKind::INT8, false)},
      {"q4_0", gg(qlft::GgmlType::Q4_0)},           {"q4_1", gg(qlft::GgmlType::Q4_1)},
      {"q8_0", gg(qlft::GgmlType::Q8_0)},           {"q4_k", gg(qlft::GgmlType::Q4_K)},
      {"q5_k", gg(qlft::GgmlType::Q5_K)},           {"q6_k", gg(qlft::GgmlType::Q6_K)}};
}

void linear_case(const char* precision, double tol) {
  Pair p(precision);
  Rng rng(1);
  const int r = 8;
  // The fixed ragged shape, then two drawn ones per weight format (K a multiple of 256 for the
  // K-quants).
  for (int shape = 0; shape < 3; ++shape)
    for (const WeightCase& wc : weight_cases()) {
      const int64_t M = shape ? rng.size(1, 80) : 37, K = shape ? 256 * rng.size(1, 2) : 256,
                    N = shape ? rng.size(1, 130) : 96;
      SCOPED_TRACE(wc.name + std::string(" ") + precision + " M " + std::to_string(M) + " K " +
                   std::to_string(K) + " N " + std::to_string(N));
      FVec wv = rng.normal(size_t(N * K), 0.05f);
      qlft::QWeight W = wc.make(&p.tracker, wv, N, K);
      FVec x = rng.normal(size_t(M * K)), bias = rng.normal(static_cast<size_t>(N));
      FVec A = rng.normal(size_t(r * K), 0.1f), B = rng.normal(size_t(N * r), 0.1f);
      qlft::LoraRef l;
      l.A = A.data();
      l.B = B.data();
      l.r = r;
      l.scale = 2.f;
      l.dropout_p = 0.1f;
      l.dropout_seed = 42;
      FVec y0(size_t(M * N)), y1(size_t(M * N)), xa0(size_t(M * r)), xa1(size_t(M * r));
      p.cpu->linear_fwd(W, bias.data(), &l, cmat(x, M, K), mat(y0, M, N), xa0.data());
      p.gpu->linear_fwd(W, bias.data(), &l, cmat(x, M, K), mat(y1, M, N), xa1.data());
      EXPECT_LT(norm_err(y1, y0), tol);
      EXPECT_LT(norm_err(xa1, xa0), 1e-5);  // the LoRA path is fp32 in both modes

      FVec dy = rng.normal(size_t(M * N));
      FVec dx0 = rng.normal(size_t(M * K)), dx1 = dx0;  // accumulate into the same start
      FVec dA0(size_t(r * K), 0.5f), dA1 = dA0, dB0(size_t(N * r), -0.5f), dB1 = dB0;
      p.cpu->linear_bwd(W, &l, cmat(x, M, K), xa0.data(), cmat(dy, M, N), mat(dx0, M, K),
                        dA0.data(), dB0.data());
      p.gpu->linear_bwd(W, &l, cmat(x, M, K), xa1.data(), cmat(dy, M, N), mat(dx1, M, K),
                        dA1.data(), dB1.data());
      EXPECT_LT(norm_err(dx1, dx0), tol);
      EXPECT_LT(norm_err(dA1, dA0), 1e-5);
      EXPECT_LT(norm_err(dB1, dB0), 1e-5);
    }
}

}  // namespace

TEST(CudaOps, LinearWithLoraEveryWeightFormatFp32) {
  QLFT_NEED_GPU();
  linear_case("fp32", 1e-5);
}

TEST(CudaOps, LinearWithLoraEveryWeightFormatBf16) {
  QLFT_NEED_GPU();
  linear_case("bf16", 2e-2);
}

// Every grid-stride kernel's loop taken several times per CUDA block (cuda_set_grid_cap: one
// block, the cap production launches reach past 65535 blocks), for every weight format's
// dequantization: the GGML kernels reuse their shared scratch on each pass, behind a trailing
// barrier that only such a loop exercises (the race check fails the launch without it). Forward
// (dense tile) and backward (dx through W) against the CPU backend, in both GEMM modes.
TEST(CudaOps, DequantizationLoopingPerBlockEqualsCpu) {
  QLFT_NEED_GPU();
  struct Cap {
    Cap() { qlft::cuda_set_grid_cap(1); }
    ~Cap() { qlft::cuda_set_grid_cap(0); }
  } cap;
  for (const char* precision : {"fp32", "bf16"}) {
    Pair p(precision);
    Rng rng(3);
    // 96 rows of 512: 1536 q4_0 blocks (12 passes of 128 threads), 192 K-quant blocks (6 of 32).
    const int64_t M = 9, K = 512, N = 96;
    const double tol = std::string(precision) == "bf16" ? 2e-2 : 1e-5;
    for (const WeightCase& wc : weight_cases()) {
      SCOPED_TRACE(wc.name + std::string(" ") + precision);
      FVec wv = rng.normal(size_t(N * K), 0.05f);
      qlft::QWeight W = wc.make(&p.tracker, wv, N, K);
      FVec x = rng.normal(size_t(M * K)), y0(size_t(M * N)), y1(size_t(M * N));
      p.cpu->linear_fwd(W, nullptr, nullptr, cmat(x, M, K), mat(y0, M, N), nullptr);
      p.gpu->linear_fwd(W, nullptr, nullptr, cmat(x, M, K), mat(y1, M, N), nullptr);
      EXPECT_LT(norm_err(y1, y0), tol);
      FVec dy = rng.normal(size_t(M * N)), dx0(size_t(M * K)), dx1(size_t(M * K));
      p.cpu->linear_bwd(W, nullptr, cmat(x, M, K), nullptr, cmat(dy, M, N), mat(dx0, M, K), nullptr,
                        nullptr);
      p.gpu->linear_bwd(W, nullptr, cmat(x, M, K), nullptr, cmat(dy, M, N), mat(dx1, M, K), nullptr,
                        nullptr);
      EXPECT_LT(norm_err(dx1, dx0), tol);
    }
  }
}

// cuda.tf32 (issue 18): fp32 GEMMs on TF32 tensor cores. Off, the product is the CPU's fp32 one
// to fp32 rounding; on, the inputs are rounded to 10 mantissa bits first: about 4e-4 relative
// off for dot products of 256 terms, and no more than 2e-3.
TEST(CudaOps, Tf32SettingRoundsFp32Gemms) {
  QLFT_NEED_GPU();
  qlft::MemoryTracker t;
  auto cpu = qlft::make_cpu_backend(&t);
  qlft::CudaBackendOptions o;
  auto exact = qlft::make_cuda_backend(&t, o);
  o.spec.tf32 = true;
  auto tf32 = qlft::make_cuda_backend(&t, o);
  Rng rng(31);
  const int64_t M = 37, N = 70, K = 256;
  FVec wv = rng.normal(size_t(N * K)), x = rng.normal(size_t(M * K));
  qlft::QWeight W = qlft::qweight_from_f32(&t, wv.data(), N, K, qlft::QuantKind::F32, 64, false);
  FVec y0(size_t(M * N)), y1(y0.size()), y2(y0.size());
  cpu->linear_fwd(W, nullptr, nullptr, cmat(x, M, K), mat(y0, M, N), nullptr);
  exact->linear_fwd(W, nullptr, nullptr, cmat(x, M, K), mat(y1, M, N), nullptr);
  tf32->linear_fwd(W, nullptr, nullptr, cmat(x, M, K), mat(y2, M, N), nullptr);
  EXPECT_LT(norm_err(y1, y0), 1e-6);
  const double e = norm_err(y2, y0);
  EXPECT_GT(e, 2e-5);
  EXPECT_LT(e, 2e-3);
  std::printf("tf32 GEMM: %.3g relative to fp32\n", e);
}

TEST(CudaOps, RmsNormRopeSwiglu) {
  QLFT_NEED_GPU();
  Pair p;
  Rng rng(2);
  // The fixed ragged shape, then three drawn ones (C = heads x head_dim 64 for RoPE).
  for (int shape = 0; shape < 4; ++shape) {
    const int64_t M = shape ? rng.size(1, 100) : 45, heads = shape ? rng.size(1, 5) : 3,
                  C = heads * 64;
    SCOPED_TRACE("M " + std::to_string(M) + " C " + std::to_string(C));
    FVec x = rng.normal(size_t(M * C)), w = rng.normal(static_cast<size_t>(C)),
         dy = rng.normal(size_t(M * C));
    FVec y0(x.size()), y1(x.size()), r0(static_cast<size_t>(M)), r1(static_cast<size_t>(M));
    p.cpu->rmsnorm_fwd(cmat(x, M, C), w.data(), 1e-5f, mat(y0, M, C), r0.data());
    p.gpu->rmsnorm_fwd(cmat(x, M, C), w.data(), 1e-5f, mat(y1, M, C), r1.data());
    EXPECT_LT(norm_err(y1, y0), 1e-6);
    EXPECT_LT(norm_err(r1, r0), 1e-6);
    FVec dx0(x.size(), 1.f), dx1 = dx0;
    p.cpu->rmsnorm_bwd(cmat(x, M, C), w.data(), r0.data(), cmat(dy, M, C), mat(dx0, M, C));
    p.gpu->rmsnorm_bwd(cmat(x, M, C), w.data(), r0.data(), cmat(dy, M, C), mat(dx1, M, C));
    EXPECT_LT(norm_err(dx1, dx0), 1e-6);

    std::vector<int32_t> pos(static_cast<size_t>(M));
    for (int64_t i = 0; i < M; ++i) pos[size_t(i)] = int32_t((i * 7) % 300);
    // A plain table and a scaled one (other frequencies and a cos / sin factor, as yarn's):
    // the device rotates with the table it is given.
    qlft::RopeFreqs scaled = qlft::RopeFreqs::plain(10000.f, 64);
    for (size_t i = 0; i < scaled.inv_freq.size(); ++i) scaled.inv_freq[i] /= float(1 + i % 3);
    scaled.scale = 1.25f;
    for (const qlft::RopeFreqs& f : {qlft::RopeFreqs::plain(10000.f, 64), scaled})
      for (bool adjacent : {false, true})
        for (bool inverse : {false, true}) {
          FVec a = x, b = x;
          p.cpu->rope(mat(a, M, C), pos.data(), int(heads), 64, f, adjacent, inverse);
          p.gpu->rope(mat(b, M, C), pos.data(), int(heads), 64, f, adjacent, inverse);
          EXPECT_LT(norm_err(b, a), 1e-5) << adjacent << inverse << f.scale;
        }

    FVec g = rng.normal(x.size()), u = rng.normal(x.size());
    FVec o0(x.size()), o1(x.size());
    p.cpu->swiglu_fwd(cmat(g, M, C), cmat(u, M, C), mat(o0, M, C));
    p.gpu->swiglu_fwd(cmat(g, M, C), cmat(u, M, C), mat(o1, M, C));
    EXPECT_LT(norm_err(o1, o0), 1e-6);
    FVec dg0(x.size()), du0(x.size()), dg1(x.size()), du1(x.size());
    p.cpu->swiglu_bwd(cmat(g, M, C), cmat(u, M, C), cmat(dy, M, C), mat(dg0, M, C), mat(du0, M, C));
    p.gpu->swiglu_bwd(cmat(g, M, C), cmat(u, M, C), cmat(dy, M, C), mat(dg1, M, C), mat(du1, M, C));
    EXPECT_LT(norm_err(dg1, dg0), 1e-6);
    EXPECT_LT(norm_err(du1, du0), 1e-6);
  }
}

TEST(CudaOps, AttentionCausalGqaPackedForwardBackward) {
  QLFT_NEED_GPU();
  Pair p;
  Rng rng(3);
  struct Case {
    int batch, seq, heads, kv, dim;
    bool docs;
  };
  for (const Case c : {Case{2, 37, 8, 4, 8, false}, Case{1, 100, 4, 2, 64, true},
                       Case{2, 70, 2, 1, 128, true}, Case{1, 33, 3, 3, 40, false}}) {
    SCOPED_TRACE(testing::Message() << "seq " << c.seq << " dim " << c.dim << " docs " << c.docs);
    const int64_t rows = int64_t(c.batch) * c.seq, Wq = int64_t(c.heads) * c.dim,
                  Wk = int64_t(c.kv) * c.dim;
    FVec q = rng.normal(size_t(rows * Wq)), k = rng.normal(size_t(rows * Wk)),
         v = rng.normal(size_t(rows * Wk)), dout = rng.normal(size_t(rows * Wq));
    std::vector<int32_t> doc(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) doc[size_t(i)] = int32_t((i % c.seq) / 23);
    qlft::AttnShape s;
    s.batch = c.batch;
    s.seq = c.seq;
    s.n_heads = c.heads;
    s.n_kv_heads = c.kv;
    s.head_dim = c.dim;
    s.doc_ids = c.docs ? doc.data() : nullptr;
    FVec o0(q.size()), o1(q.size()), l0(size_t(c.heads * rows)), l1(l0.size());
    p.cpu->attention_fwd(s, cmat(q, rows, Wq), cmat(k, rows, Wk), cmat(v, rows, Wk),
                         mat(o0, rows, Wq), l0.data());
    p.gpu->attention_fwd(s, cmat(q, rows, Wq), cmat(k, rows, Wk), cmat(v, rows, Wk),
                         mat(o1, rows, Wq), l1.data());
    EXPECT_LT(norm_err(o1, o0), 1e-5);
    EXPECT_LT(norm_err(l1, l0), 1e-5);
    FVec dq0(q.size(), 0.25f), dk0(k.size(), 0.25f), dv0(v.size(), 0.25f);
    FVec dq1 = dq0, dk1 = dk0, dv1 = dv0;
    p.cpu->attention_bwd(s, cmat(q, rows, Wq), cmat(k, rows, Wk), cmat(v, rows, Wk),
                         cmat(o0, rows, Wq), l0.data(), cmat(dout, rows, Wq), mat(dq0, rows, Wq),
                         mat(dk0, rows, Wk), mat(dv0, rows, Wk));
    p.gpu->attention_bwd(s, cmat(q, rows, Wq), cmat(k, rows, Wk), cmat(v, rows, Wk),
                         cmat(o0, rows, Wq), l0.data(), cmat(dout, rows, Wq), mat(dq1, rows, Wq),
                         mat(dk1, rows, Wk), mat(dv1, rows, Wk));
    EXPECT_LT(norm_err(dq1, dq0), 1e-4);
    EXPECT_LT(norm_err(dk1, dk0), 1e-4);
    EXPECT_LT(norm_err(dv1, dv0), 1e-4);
  }
}

TEST(CudaOps, EmbeddingHeadAndCrossEntropy) {
  QLFT_NEED_GPU();
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    const double tol = std::string(precision) == "fp32" ? 1e-5 : 2e-2;
    Pair p(precision);
    Rng rng(4);
    const int64_t V = 515, H = 64, M = 29;
    FVec ev = rng.normal(size_t(V * H), 0.1f);
    qlft::QWeight emb = qlft::qweight_from_f32(&p.tracker, ev.data(), V, H, qlft::QuantKind::NF4);
    std::vector<int32_t> tok(static_cast<size_t>(M));
    for (int64_t i = 0; i < M; ++i) tok[size_t(i)] = int32_t((i * 37) % V);
    FVec e0(size_t(M * H)), e1(e0.size());
    p.cpu->embedding_fwd(emb, tok.data(), mat(e0, M, H));
    p.gpu->embedding_fwd(emb, tok.data(), mat(e1, M, H));
    EXPECT_EQ(e1, e0);  // a gather of dequantized values: exact
    std::vector<int32_t> bad = tok;
    bad[3] = int32_t(V);
    EXPECT_THROW(p.gpu->embedding_fwd(emb, bad.data(), mat(e1, M, H)), qlft::Error);

    FVec h = rng.normal(size_t(M * H));
    FVec lg0(size_t(M * V)), lg1(lg0.size());
    p.cpu->head_logits(emb, cmat(h, M, H), mat(lg0, M, V));
    p.gpu->head_logits(emb, cmat(h, M, H), mat(lg1, M, V));
    EXPECT_LT(norm_err(lg1, lg0), tol);

    std::vector<int32_t> tg = tok;
    tg[0] = tg[5] = -100;
    FVec dh0(size_t(M * H), 0.1f), dh1 = dh0;
    int64_t n0 = 0, n1 = 0;
    const double L0 =
        p.cpu->linear_cross_entropy(emb, cmat(h, M, H), tg.data(), -100, 0.5f, mat(dh0, M, H), &n0);
    const double L1 =
        p.gpu->linear_cross_entropy(emb, cmat(h, M, H), tg.data(), -100, 0.5f, mat(dh1, M, H), &n1);
    EXPECT_EQ(n1, n0);
    EXPECT_NEAR(L1, L0, tol * std::fabs(L0));
    EXPECT_LT(norm_err(dh1, dh0), tol);
  }
}

TEST(CudaOps, WeightsStayResidentAndAccounted) {
  QLFT_NEED_GPU();
  Pair p;
  Rng rng(5);
  FVec wv = rng.normal(64 * 128);
  qlft::QWeight W = qlft::qweight_from_f32(&p.tracker, wv.data(), 64, 128, qlft::QuantKind::NF4);
  FVec x = rng.normal(4 * 128), y(4 * 64);
  const uint64_t before = p.tracker.snapshot().reserved[QLFT_MEM_WEIGHTS];
  p.gpu->linear_fwd(W, nullptr, nullptr, cmat(x, 4, 128), mat(y, 4, 64), nullptr);
  const uint64_t after = p.tracker.snapshot().reserved[QLFT_MEM_WEIGHTS];
  EXPECT_GT(after, before);  // the device copy is counted as weights
  p.gpu->linear_fwd(W, nullptr, nullptr, cmat(x, 4, 128), mat(y, 4, 64), nullptr);
  EXPECT_EQ(p.tracker.snapshot().reserved[QLFT_MEM_WEIGHTS], after);  // uploaded once
}

// A double-quantized NF4 weight stays double-quantized on the device (bitsandbytes' form: an
// 8-bit absmax code per 64-block, a float per 256 codes and the 256-entry code book, not a float
// per block), the kernel decoding the absmax as it dequantizes: the device copy's bytes are that
// form's (the allocator's rounding on each of its two blocks), and the rows it dequantizes equal
// the CPU's QWeight::dequantize_rows bit for bit, uploaded (resident) and used in place (the
// weight's Buffers in device memory, as ZeRO-3 and offload place them).
TEST(CudaOps, Nf4DoubleQuantStaysDoubleQuantizedOnTheDevice) {
  QLFT_NEED_GPU();
  Pair p;
  Rng rng(6);
  const int64_t V = 1030, H = 256;  // 4120 blocks: 17 nested groups, the last one partial
  FVec ev = rng.normal(size_t(V * H), 0.1f);
  qlft::QWeight W =
      qlft::qweight_from_f32(&p.tracker, ev.data(), V, H, qlft::QuantKind::NF4, 64, true);
  ASSERT_TRUE(W.double_quant);
  const uint64_t nb = uint64_t(V * H / 64), packed = uint64_t(V * H / 2);
  auto a16 = [](uint64_t b) { return (b + 15) / 16 * 16; };
  const uint64_t dq = a16(nb) + a16((nb + 255) / 256 * 4) + 256 * 4;
  FVec want(size_t(V * H));
  W.dequantize_rows(0, V, want.data());  // the CPU's dequantization
  std::vector<int32_t> tok(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) tok[size_t(i)] = int32_t((i * 389) % V);
  auto gathered = [&](const FVec& rows) {
    FVec g(rows.size());
    for (int64_t i = 0; i < V; ++i)
      std::memcpy(&g[size_t(i * H)], &rows[size_t(tok[size_t(i)]) * H], size_t(H) * 4);
    return g;
  };
  const FVec want_rows = gathered(want);

  const uint64_t before = p.tracker.snapshot().reserved[QLFT_MEM_WEIGHTS];
  FVec e1(size_t(V * H));
  p.gpu->embedding_fwd(W, tok.data(), mat(e1, V, H));
  EXPECT_EQ(p.tracker.snapshot().reserved[QLFT_MEM_WEIGHTS] - before,
            qlft::cuda_alloc_round(packed) + qlft::cuda_alloc_round(dq));
  EXPECT_LT(dq, nb * 4 / 3);  // vs a float per block
  EXPECT_EQ(e1, want_rows);

  // In place: the same storage in the backend's device memory.
  qlft::QWeight D;
  D.kind = W.kind;
  D.rows = W.rows;
  D.cols = W.cols;
  D.blocksize = W.blocksize;
  D.double_quant = true;
  D.nested_blocksize = W.nested_blocksize;
  D.nested_offset = W.nested_offset;
  auto put = [&](qlft::Buffer& dst, const qlft::Buffer& src) {
    dst = p.gpu->alloc(qlft::MemCategory::Weights, src.size(), "test weight");
    dst.copy_from_host(src.data(), src.size());
  };
  put(D.data, W.data);
  put(D.absmax, W.absmax);
  put(D.nested_absmax, W.nested_absmax);
  put(D.code, W.code);
  put(D.nested_code, W.nested_code);
  FVec e2(size_t(V * H));
  p.gpu->embedding_fwd(D, tok.data(), mat(e2, V, H));
  EXPECT_EQ(e2, want_rows);
}
