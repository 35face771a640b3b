// Properties of the CPU backend beyond single-op correctness: accumulate-vs-overwrite rules,
// equivalences between ops (fused cross-entropy vs logits + log-softmax, packed attention vs
// one call per document), determinism across thread counts, memory-limit failures, argument
// errors, and weights in storage formats other than f32.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/half.h"
#include "core/threads.h"
#include "quant/ggml_types.h"
#include "quant/qweight.h"
#include "support/test_support.h"
#include "test_backend_util.h"

using namespace qlft;
using namespace qlft_test;

namespace {

MatF mat(FVec& v, int64_t r, int64_t c) {
  return MatF(v.data(), r, c);
}
CMatF cmat(const FVec& v, int64_t r, int64_t c) {
  return CMatF(v.data(), r, c);
}

template <class F>
int32_t status_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.status();
  }
  return QLFT_OK;
}

// init + 2 * (once - init), elementwise: what a second accumulating call must give.
void expect_doubled(const FVec& init, const FVec& once, const FVec& twice, const char* what) {
  Vec want(init.size());
  for (size_t i = 0; i < init.size(); ++i) want[i] = 2.0 * once[i] - init[i];
  EXPECT_LT(rel_err(twice, want), 1e-5) << what;
}

}  // namespace

TEST(BackendAccumulate, LinearBwdAddsIntoDxDaDb) {
  MemoryTracker tr;
  auto be = make_cpu_backend(&tr);
  Rng rng(101);
  const int M = 17, K = 30, N = 41, r = 4;
  FVec x = rng.normal(M * K), W = rng.normal(N * K), A = rng.normal(r * K), B = rng.normal(N * r);
  FVec dy = rng.normal(M * N), y(M * N), xa(M * r);
  QWeight qw = qweight_from_f32(&tr, W.data(), N, K, QuantKind::F32);
  for (float p : {0.f, 0.25f}) {
    LoraRef l{A.data(), B.data(), r, 0.5f, p, 3};
    be->linear_fwd(qw, nullptr, &l, cmat(x, M, K), mat(y, M, N), xa.data());
    FVec dx0 = rng.normal(M * K), dA0 = rng.normal(r * K), dB0 = rng.normal(N * r);
    FVec dx = dx0, dA = dA0, dB = dB0;
    be->linear_bwd(qw, &l, cmat(x, M, K), xa.data(), cmat(dy, M, N), mat(dx, M, K), dA.data(),
                   dB.data());
    FVec dx1 = dx, dA1 = dA, dB1 = dB;
    be->linear_bwd(qw, &l, cmat(x, M, K), xa.data(), cmat(dy, M, N), mat(dx, M, K), dA.data(),
                   dB.data());
    expect_doubled(dx0, dx1, dx, "dx");
    expect_doubled(dA0, dA1, dA, "dA");
    expect_doubled(dB0, dB1, dB, "dB");
    // xa not kept: recomputed with the same mask, same gradients.
    FVec dA2 = dA0, dB2 = dB0;
    be->linear_bwd(qw, &l, cmat(x, M, K), nullptr, cmat(dy, M, N), MatF(), dA2.data(), dB2.data());
    EXPECT_LT(rel_err(dA2, to_d(dA1)), 1e-6);
    EXPECT_LT(rel_err(dB2, to_d(dB1)), 1e-6);
  }
}

TEST(BackendAccumulate, RmsNormAttentionAndCrossEntropyAdd) {
  MemoryTracker tr;
  auto be = make_cpu_backend(&tr);
  Rng rng(102);
  {
    const int M = 5, C = 24;
    FVec x = rng.normal(M * C), w = rng.normal(C), y(M * C), rs(M), dy = rng.normal(M * C);
    be->rmsnorm_fwd(cmat(x, M, C), w.data(), 1e-6f, mat(y, M, C), rs.data());
    FVec d0 = rng.normal(M * C), d = d0;
    be->rmsnorm_bwd(cmat(x, M, C), w.data(), rs.data(), cmat(dy, M, C), mat(d, M, C));
    FVec d1 = d;
    be->rmsnorm_bwd(cmat(x, M, C), w.data(), rs.data(), cmat(dy, M, C), mat(d, M, C));
    expect_doubled(d0, d1, d, "rmsnorm dx");
  }
  {
    AttnShape s = attn_shape(2, 9, 4, 2, 8);
    const int rows = 18, qc = 32, kc = 16;
    FVec q = rng.normal(rows * qc), k = rng.normal(rows * kc), v = rng.normal(rows * kc);
    FVec o(rows * qc), lse(4 * rows), dO = rng.normal(rows * qc);
    be->attention_fwd(s, cmat(q, rows, qc), cmat(k, rows, kc), cmat(v, rows, kc), mat(o, rows, qc),
                      lse.data());
    FVec q0 = rng.normal(rows * qc), k0 = rng.normal(rows * kc), v0 = rng.normal(rows * kc);
    FVec dq = q0, dk = k0, dv = v0;
    auto bwd = [&] {
      be->attention_bwd(s, cmat(q, rows, qc), cmat(k, rows, kc), cmat(v, rows, kc),
                        cmat(o, rows, qc), lse.data(), cmat(dO, rows, qc), mat(dq, rows, qc),
                        mat(dk, rows, kc), mat(dv, rows, kc));
    };
    bwd();
    FVec dq1 = dq, dk1 = dk, dv1 = dv;
    bwd();
    expect_doubled(q0, dq1, dq, "attention dq");
    expect_doubled(k0, dk1, dk, "attention dk");
    expect_doubled(v0, dv1, dv, "attention dv");
  }
  {
    const int V = 33, H = 8, M = 6;
    FVec head = rng.normal(V * H), h = rng.normal(M * H);
    QWeight qh = qweight_from_f32(&tr, head.data(), V, H, QuantKind::F32);
    std::vector<int32_t> t = {1, 5, -100, 32, 0, 7};
    FVec d0 = rng.normal(M * H), d = d0;
    int64_t n = 0;
    double l1 = be->linear_cross_entropy(qh, cmat(h, M, H), t.data(), -100, 1.f, mat(d, M, H), &n);
    FVec d1 = d;
    double l2 = be->linear_cross_entropy(qh, cmat(h, M, H), t.data(), -100, 1.f, mat(d, M, H), &n);
    EXPECT_EQ(l1, l2);
    EXPECT_EQ(n, 5);
    expect_doubled(d0, d1, d, "cross-entropy dh");
  }
}

TEST(BackendEquivalence, CrossEntropyEqualsLogitsPlusLogSoftmax) {
  MemoryTracker tr;
  auto be = make_cpu_backend(&tr);
  static_cast<cpu::CpuBackend&>(*be).tune.panel_max_rows = 40;  // several vocab panels
  Rng rng(103);
  const int V = 150, H = 16, M = 21;
  FVec head = rng.normal(V * H), h = rng.normal(M * H, 4.f);  // large logits: stability
  QWeight qh = qweight_from_f32(&tr, head.data(), V, H, QuantKind::F32);
  std::vector<int32_t> t(M);
  for (int i = 0; i < M; ++i) t[i] = i % 5 == 0 ? -1 : rng.uniform_int(0, V - 1);
  FVec logits(M * V);
  be->head_logits(qh, cmat(h, M, H), mat(logits, M, V));
  double want = 0;
  Vec g(M * H, 0.0);  // (softmax - onehot) head, from the materialized logits
  for (int i = 0; i < M; ++i) {
    if (t[i] == -1) continue;
    double m = -INFINITY, z = 0;
    for (int j = 0; j < V; ++j) m = std::max(m, double(logits[i * V + j]));
    for (int j = 0; j < V; ++j) z += std::exp(logits[i * V + j] - m);
    want += m + std::log(z) - logits[i * V + t[i]];
    for (int j = 0; j < V; ++j) {
      double p = std::exp(logits[i * V + j] - m) / z - (j == t[i]);
      for (int c = 0; c < H; ++c) g[i * H + c] += p * head[j * H + c];
    }
  }
  FVec dh(M * H, 0.f);
  int64_t n = 0;
  double got = be->linear_cross_entropy(qh, cmat(h, M, H), t.data(), -1, 1.f, mat(dh, M, H), &n);
  EXPECT_GT(want, 100.0);  // the logits are large; the loss is far from trivial
  EXPECT_NEAR(got, want, 1e-5 * want);
  EXPECT_LT(rel_err(dh, g), 1e-5);
}

TEST(BackendEquivalence, PackedAttentionEqualsOneCallPerDocument) {
  MemoryTracker tr;
  auto be = make_cpu_backend(&tr);
  static_cast<cpu::CpuBackend&>(*be).tune.attn_block_q = 6;
  Rng rng(104);
  const int T = 40, Hq = 4, KV = 2, D = 8, qc = Hq * D, kc = KV * D;
  // Documents 0..3 of lengths 7, 13, 1, 19 packed into one sequence.
  std::vector<int> lens = {7, 13, 1, 19};
  std::vector<int32_t> doc;
  for (int d = 0; d < 4; ++d) doc.insert(doc.end(), lens[d], d);
  ASSERT_EQ(int(doc.size()), T);
  FVec q = rng.normal(T * qc), k = rng.normal(T * kc), v = rng.normal(T * kc),
       dO = rng.normal(T * qc);
  AttnShape s = attn_shape(1, T, Hq, KV, D);
  s.doc_ids = doc.data();
  FVec o(T * qc), lse(Hq * T), dq(T * qc, 0.f), dk(T * kc, 0.f), dv(T * kc, 0.f);
  be->attention_fwd(s, cmat(q, T, qc), cmat(k, T, kc), cmat(v, T, kc), mat(o, T, qc), lse.data());
  be->attention_bwd(s, cmat(q, T, qc), cmat(k, T, kc), cmat(v, T, kc), cmat(o, T, qc), lse.data(),
                    cmat(dO, T, qc), mat(dq, T, qc), mat(dk, T, kc), mat(dv, T, kc));
  int start = 0;
  for (int L : lens) {
    AttnShape sd = attn_shape(1, L, Hq, KV, D);
    auto sub = [&](const FVec& a, int c) { return CMatF(a.data() + start * c, L, c); };
    FVec od(L * qc), ld(Hq * L), dqd(L * qc, 0.f), dkd(L * kc, 0.f), dvd(L * kc, 0.f);
    be->attention_fwd(sd, sub(q, qc), sub(k, kc), sub(v, kc), mat(od, L, qc), ld.data());
    be->attention_bwd(sd, sub(q, qc), sub(k, kc), sub(v, kc), cmat(od, L, qc), ld.data(),
                      sub(dO, qc), mat(dqd, L, qc), mat(dkd, L, kc), mat(dvd, L, kc));
    auto expect_rows = [&](const FVec& packed, const FVec& alone, int c, const char* what) {
      for (int i = 0; i < L * c; ++i)
        ASSERT_NEAR(packed[start * c + i], alone[i], 1e-5f * (1 + std::fabs(alone[i])))
            << what << " doc of length " << L << " element " << i;
    };
    expect_rows(o, od, qc, "out");
    expect_rows(dq, dqd, qc, "dq");
    expect_rows(dk, dkd, kc, "dk");
    expect_rows(dv, dvd, kc, "dv");
    for (int h = 0; h < Hq; ++h)
      for (int i = 0; i < L; ++i) ASSERT_NEAR(lse[h * T + start + i], ld[h * L + i], 1e-5f);
    start += L;
  }
}

namespace {
// Runs every op on shapes big enough for BLAS to use several threads; returns all outputs.
std::vector<FVec> run_everything(int threads) {
  set_num_threads(threads);
  MemoryTracker tr;
  auto be = make_cpu_backend(&tr);
  Rng rng(105);
  std::vector<FVec> res;
  const int M = 192, K = 256, N = 320, r = 8;
  FVec x = rng.normal(M * K), W = rng.normal(N * K, 0.1f), A = rng.normal(r * K, 0.1f),
       B = rng.normal(N * r, 0.1f), dy = rng.normal(M * N);
  QWeight qw = qweight_from_f32(&tr, W.data(), N, K, QuantKind::F32);
  LoraRef l{A.data(), B.data(), r, 2.f, 0.1f, 9};
  FVec y(M * N), xa(M * r), dx(M * K, 0.f), dA(r * K, 0.f), dB(N * r, 0.f);
  be->linear_fwd(qw, nullptr, &l, cmat(x, M, K), mat(y, M, N), xa.data());
  be->linear_bwd(qw, &l, cmat(x, M, K), xa.data(), cmat(dy, M, N), mat(dx, M, K), dA.data(),
                 dB.data());
  res.insert(res.end(), {y, xa, dx, dA, dB});
  AttnShape s = attn_shape(2, 96, 8, 4, 32);  // rows 192, q cols 256, kv cols 128
  FVec kv = rng.normal(M * 128), dO = rng.normal(M * K);
  FVec o(M * K), lse(8 * M), dq(M * K, 0.f), dk(M * 128, 0.f), dv(M * 128, 0.f);
  be->attention_fwd(s, cmat(x, M, K), cmat(kv, M, 128), cmat(kv, M, 128), mat(o, M, K), lse.data());
  be->attention_bwd(s, cmat(x, M, K), cmat(kv, M, 128), cmat(kv, M, 128), cmat(o, M, K), lse.data(),
                    cmat(dO, M, K), mat(dq, M, K), mat(dk, M, 128), mat(dv, M, 128));
  res.insert(res.end(), {o, lse, dq, dk, dv});
  std::vector<int32_t> t(M);
  for (int i = 0; i < M; ++i) t[i] = (i * 37) % N;
  FVec dh(M * K, 0.f);
  double loss =
      be->linear_cross_entropy(qw, cmat(x, M, K), t.data(), -100, 0.5f, mat(dh, M, K), nullptr);
  res.push_back(dh);
  res.push_back(FVec{float(loss), float(loss - double(float(loss)))});
  FVec w(K, 1.1f), yn(M * K), rs(M), dn(M * K, 0.f);
  be->rmsnorm_fwd(cmat(x, M, K), w.data(), 1e-5f, mat(yn, M, K), rs.data());
  be->rmsnorm_bwd(cmat(x, M, K), w.data(), rs.data(), cmat(dO, M, K), mat(dn, M, K));
  res.insert(res.end(), {yn, rs, dn});
  return res;
}
}  // namespace

// Run to run at one thread count every output is bit-identical (what resume relies on). Across
// thread counts qlft's own kernels (attention, norms, the cross-entropy's loss reduction) are
// bit-identical too; the outputs of library GEMMs (y, xa, dx, dA, dB, dh: OpenBLAS / oneDNN) are
// bit-identical only where the library's thread partition keeps its sums: OpenBLAS 0.3.21's Zen
// sgemm sums a column-split C differently in the last bits (measured on a Zen 3: ~1400 of 49152
// elements, 4e-6 apart), so those are held to 1e-5 relative instead.
TEST(BackendDeterminism, IdenticalAcrossRunsAndThreadCounts) {
  const int cores = available_cores();
  std::vector<FVec> a = run_everything(1), b = run_everything(1);
  std::vector<FVec> c = run_everything(std::max(2, cores));
  std::vector<FVec> d = run_everything(std::max(2, cores));
  set_num_threads(0);
  ASSERT_EQ(a.size(), c.size());
  const std::vector<size_t> library_gemm = {0, 1, 2, 3, 4, 10};  // y, xa, dx, dA, dB, dh
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(0, std::memcmp(a[i].data(), b[i].data(), a[i].size() * 4))
        << "output " << i << " run to run, 1 thread";
    EXPECT_EQ(0, std::memcmp(c[i].data(), d[i].data(), c[i].size() * 4))
        << "output " << i << " run to run, N threads";
    const bool same = std::memcmp(a[i].data(), c[i].data(), a[i].size() * 4) == 0;
    if (std::find(library_gemm.begin(), library_gemm.end(), i) == library_gemm.end()) {
      EXPECT_TRUE(same) << "output " << i << " 1 vs N threads";
    } else if (!same) {
      std::printf("output %zu: library GEMM sums differ across thread counts on this CPU\n", i);
      EXPECT_LT(qlft_test::max_rel_error(a[i].data(), c[i].data(), a[i].size()), 1e-5)
          << "output " << i;
    }
  }
}

TEST(BackendMemory, WorkspaceCountsAgainstTheLimit) {
  MemoryTracker tr;
  auto be = make_cpu_backend(&tr);
  Rng rng(106);
  const int M = 8, K = 512, N = 512;
  FVec x = rng.normal(M * K), W = rng.normal(N * K), y(M * N);
  QWeight qw = qweight_from_f32(&tr, W.data(), N, K, QuantKind::F32);
  // Room for the weight but not for a 256 x 512 float panel (512 KiB).
  tr.set_limit(tr.total_reserved() + 100 * 1024);
  EXPECT_EQ(status_of([&] {
              be->linear_fwd(qw, nullptr, nullptr, cmat(x, M, K), mat(y, M, N), nullptr);
            }),
            QLFT_ERR_OUT_OF_MEMORY);
  tr.set_limit(0);
  // Injected failure of the first workspace allocation in attention and cross-entropy.
  AttnShape s = attn_shape(1, 8, 1, 1, 8);
  FVec q(8 * 8, 0.1f), o(8 * 8), lse(8);
  tr.fail_nth_acquire(1);
  EXPECT_EQ(status_of([&] {
              be->attention_fwd(s, cmat(q, 8, 8), cmat(q, 8, 8), cmat(q, 8, 8), mat(o, 8, 8),
                                lse.data());
            }),
            QLFT_ERR_OUT_OF_MEMORY);
  std::vector<int32_t> t(M, 1);
  tr.fail_nth_acquire(1);
  EXPECT_EQ(status_of([&] {
              be->linear_cross_entropy(qw, cmat(x, M, K), t.data(), -100, 1.f, MatF(), nullptr);
            }),
            QLFT_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(tr.snapshot().reserved[int(MemCategory::Workspace)], 0u);
  // And the workspace shows up in the peak while the op runs.
  tr.reset_peaks();
  be->linear_fwd(qw, nullptr, nullptr, cmat(x, M, K), mat(y, M, N), nullptr);
  EXPECT_GE(tr.snapshot().peak[int(MemCategory::Workspace)], uint64_t(256) * K * 4);
}

TEST(BackendErrors, BadArgumentsAreInvalidArgument) {
  MemoryTracker tr;
  auto be = make_cpu_backend(&tr);
  FVec W(6 * 4, 1.f), x(3 * 4, 1.f), y(3 * 6), bad(3 * 5);
  QWeight qw = qweight_from_f32(&tr, W.data(), 6, 4, QuantKind::F32);
  EXPECT_EQ(status_of([&] {
              be->linear_fwd(qw, nullptr, nullptr, cmat(x, 3, 4), mat(bad, 3, 5), nullptr);
            }),
            QLFT_ERR_INVALID_ARGUMENT);
  std::vector<int32_t> t = {0, 6, 1};  // 6 is outside a vocab of 6
  EXPECT_EQ(status_of([&] {
              be->linear_cross_entropy(qw, cmat(x, 3, 4), t.data(), -100, 1.f, MatF(), nullptr);
            }),
            QLFT_ERR_INVALID_ARGUMENT);
  t[1] = -100;  // ignored: fine
  int64_t n = 0;
  EXPECT_EQ(status_of([&] {
              be->linear_cross_entropy(qw, cmat(x, 3, 4), t.data(), -100, 1.f, MatF(), &n);
            }),
            QLFT_OK);
  EXPECT_EQ(n, 2);
  AttnShape s = attn_shape(1, 3, 3, 2, 4);  // 3 heads do not share 2 KV heads
  FVec lse(9);
  EXPECT_EQ(status_of([&] {
              be->attention_fwd(s, cmat(x, 3, 4), cmat(x, 3, 4), cmat(x, 3, 4), mat(y, 3, 4),
                                lse.data());
            }),
            QLFT_ERR_INVALID_ARGUMENT);
  std::vector<int32_t> pos = {0, 1, 2};
  EXPECT_EQ(status_of([&] {
              be->rope(mat(y, 3, 6), pos.data(), 1, 5, RopeFreqs::plain(1e4f, 4), false, false);
            }),
            QLFT_ERR_INVALID_ARGUMENT);
  // Attention for inference: no lse to keep gives the same output.
  {
    AttnShape s2 = attn_shape(1, 3, 2, 1, 2);
    FVec o1(3 * 4), o2(3 * 4), l2(6);
    be->attention_fwd(s2, cmat(x, 3, 4), cmat(x, 3, 2), cmat(x, 3, 2), mat(o1, 3, 4), nullptr);
    be->attention_fwd(s2, cmat(x, 3, 4), cmat(x, 3, 2), cmat(x, 3, 2), mat(o2, 3, 4), l2.data());
    EXPECT_EQ(o1, o2);
    EXPECT_EQ(status_of([&] {
                be->attention_bwd(s2, cmat(x, 3, 4), cmat(x, 3, 2), cmat(x, 3, 2), cmat(o1, 3, 4),
                                  nullptr, cmat(o1, 3, 4), mat(o2, 3, 4), mat(l2, 3, 2),
                                  mat(l2, 3, 2));
              }),
              QLFT_ERR_INVALID_ARGUMENT);
  }
  LoraRef l{W.data(), W.data(), 1, 1.f, 1.0f, 0};  // dropout p must be < 1
  EXPECT_EQ(
      status_of([&] { be->linear_fwd(qw, nullptr, &l, cmat(x, 3, 4), mat(y, 3, 6), nullptr); }),
      QLFT_ERR_INVALID_ARGUMENT);
}

// The kernels never look at the storage kind: whatever dequantize_rows gives is what they use.
// Each kind that can be built here is checked against the double oracle on its dequantized
// values; every kind listed has a builder (QLFT_ERR_UNSUPPORTED fails).
class BackendQuantKinds : public ::testing::TestWithParam<QuantKind> {};

TEST_P(BackendQuantKinds, LinearAndHeadUseDequantizedPanels) {
  MemoryTracker tr;
  auto be = make_cpu_backend(&tr);
  static_cast<cpu::CpuBackend&>(*be).tune.panel_max_rows = 16;
  Rng rng(107);
  const int M = 9, K = 128, N = 70;
  FVec W = rng.normal(N * K), x = rng.normal(M * K), y(M * N), dy = rng.normal(M * N),
       dx(M * K, 0.f);
  QWeight qw = qweight_from_f32(&tr, W.data(), N, K, GetParam());
  FVec Wd(N * K);
  qw.dequantize_rows(0, N, Wd.data());
  be->linear_fwd(qw, nullptr, nullptr, cmat(x, M, K), mat(y, M, N), nullptr);
  Vec none;
  EXPECT_LT(rel_err(y, linear_oracle(to_d(x), Wd, nullptr, none, none, 0, 0, 0.f, 0, M, N, K)),
            2e-6);
  be->linear_bwd(qw, nullptr, cmat(x, M, K), nullptr, cmat(dy, M, N), mat(dx, M, K), nullptr,
                 nullptr);
  Vec dxo(M * K, 0.0);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j)
      for (int c = 0; c < K; ++c) dxo[i * K + c] += double(dy[i * N + j]) * Wd[j * K + c];
  EXPECT_LT(rel_err(dx, dxo), 2e-6);
  FVec emb(3 * K);
  std::vector<int32_t> tok = {N - 1, 0, 33};
  be->embedding_fwd(qw, tok.data(), mat(emb, 3, K));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(0, std::memcmp(&emb[i * K], &Wd[tok[i] * K], K * 4));
}
INSTANTIATE_TEST_SUITE_P(Kinds, BackendQuantKinds,
                         ::testing::Values(QuantKind::F32, QuantKind::F16, QuantKind::BF16,
                                           QuantKind::NF4, QuantKind::INT8));

TEST(BackendQuantKinds, GgmlF16Blocks) {
  MemoryTracker tr;
  auto be = make_cpu_backend(&tr);
  const int M = 4, K = 64, N = 20;
  Rng rng(108);
  FVec W = rng.normal(N * K), x = rng.normal(M * K), y(M * N);
  std::vector<uint16_t> h(N * K);
  for (int i = 0; i < N * K; ++i) h[i] = f32_to_f16(W[i]);
  QWeight qw = qweight_from_ggml(&tr, 1 /* GGML_TYPE_F16 */, h.data(), N, K);
  FVec Wd(N * K);
  for (int i = 0; i < N * K; ++i) Wd[i] = f16_to_f32(h[i]);
  be->linear_fwd(qw, nullptr, nullptr, cmat(x, M, K), mat(y, M, N), nullptr);
  Vec none;
  EXPECT_LT(rel_err(y, linear_oracle(to_d(x), Wd, nullptr, none, none, 0, 0, 0.f, 0, M, N, K)),
            2e-6);
}
