// The tensor-core (wmma bf16) flash attention, forward and backward, through CudaBackend at
// precision bf16 with autocast (the path cuda_attention_tensor_cores names), against an fp64
// reference computed here from the same bf16 inputs with plain loops: causal, GQA groups 1 / 2 /
// 4, packed documents, batch > 1, sequence lengths that are not multiples of the 64-row tiles,
// head_dim 64 / 80 / 96 / 128.
//
// Bounds, from bf16 rounding (u = 2^-8, the unit roundoff of an 8-bit significand): the kernels
// round P (and dS) to bf16 where they enter a product and accumulate in fp32, so each output
// element differs from the exact value by a few u times the sum of the magnitudes of its terms:
//   out[i][d]:  4u * sum_j P_ij |v_jd|                 (P rounded; normalized by the rounded sum)
//   lse[i]:     4u                                      (log of that sum)
//   dV[j][d]:   8u * sum_i P_ij |dO_id|                 (P from the kernel's lse, rounded)
//   dQ, dK:     8u * scale * sum P_ij (|dP_ij| + |delta_i| + m_i) |k_jd| (resp. |q_id|)
//               where m_i = sum_d |dO_id| sum_j P_ij |v_jd| bounds delta's error through out
// plus 1e-6 absolute. fp32 summation order (the GPU's MMA order is unspecified) moves results by
// ~1e-7 relative, far inside these. Anything structurally wrong (a mask, a tile edge, a GQA head,
// a skipped fragment load: NaN) is off by O(1) of the same magnitudes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/autocast_backend.h"
#include "backend/backend.h"
#include "backend/cuda_entry.h"
#include "core/half.h"
#include "cuda_test_util.h"
#include "model/llama.h"
#include "model/lora.h"
#include "model/model.h"
#include "quant/qweight.h"

namespace {

using FVec = std::vector<float>;
constexpr double kU = 1.0 / 256;  // bf16 unit roundoff

struct Case {
  int batch, seq, heads, kv, dim;
  bool docs;
};

// Values drawn N(0, sd) and rounded to bf16, so the device's conversion is exact.
FVec bf16_normal(std::mt19937_64& g, size_t n, float sd) {
  std::normal_distribution<float> d(0.f, sd);
  FVec v(n);
  for (auto& x : v) x = qlft::bf16_to_f32(qlft::f32_to_bf16(d(g)));
  return v;
}

struct Ref {
  std::vector<double> out, lse, dq, dk, dv;     // exact
  std::vector<double> out_m, dq_m, dk_m, dv_m;  // magnitudes (the bounds above, without c u)
};

// fp64 attention forward and backward of the given bf16-valued inputs.
Ref reference(const Case& c, const FVec& q, const FVec& k, const FVec& v, const FVec& dout,
              const std::vector<int32_t>& doc) {
  const int64_t rows = int64_t(c.batch) * c.seq, Wq = int64_t(c.heads) * c.dim,
                Wk = int64_t(c.kv) * c.dim;
  const int D = c.dim, group = c.heads / c.kv;
  const double scale = 1.0 / std::sqrt(double(D));
  Ref r;
  r.out.assign(size_t(rows * Wq), 0);
  r.out_m = r.dq = r.dq_m = r.out;
  r.lse.assign(size_t(c.heads * rows), 0);
  r.dk.assign(size_t(rows * Wk), 0);
  r.dv = r.dk_m = r.dv_m = r.dk;
  std::vector<double> P(size_t(c.seq)), dP(size_t(c.seq));
  for (int b = 0; b < c.batch; ++b)
    for (int h = 0; h < c.heads; ++h) {
      const int kh = h / group;
      for (int i = 0; i < c.seq; ++i) {
        const int64_t ri = int64_t(b) * c.seq + i;
        auto sees = [&](int j) {
          return j <= i && (!c.docs || doc[size_t(ri - i + j)] == doc[size_t(ri)]);
        };
        double mx = -INFINITY;
        for (int j = 0; j < c.seq; ++j) {
          if (!sees(j)) continue;
          const int64_t rj = int64_t(b) * c.seq + j;
          double s = 0;
          for (int d = 0; d < D; ++d)
            s += double(q[size_t(ri * Wq + h * D + d)]) * k[size_t(rj * Wk + kh * D + d)];
          P[size_t(j)] = s * scale;
          mx = std::max(mx, P[size_t(j)]);
        }
        double sum = 0;
        for (int j = 0; j < c.seq; ++j)
          if (sees(j)) sum += std::exp(P[size_t(j)] - mx);
        const double lse = mx + std::log(sum);
        r.lse[size_t(h * rows + ri)] = lse;
        for (int j = 0; j < c.seq; ++j) P[size_t(j)] = sees(j) ? std::exp(P[size_t(j)] - lse) : 0;
        const size_t o = size_t(ri * Wq + h * D);
        double delta = 0, m = 0;
        for (int d = 0; d < D; ++d) {
          double y = 0, ym = 0;
          for (int j = 0; j < c.seq; ++j) {
            const double vj = v[size_t((int64_t(b) * c.seq + j) * Wk + kh * D + d)];
            y += P[size_t(j)] * vj;
            ym += P[size_t(j)] * std::fabs(vj);
          }
          r.out[o + d] = y;
          r.out_m[o + d] = ym;
          delta += double(dout[o + d]) * y;
          m += std::fabs(double(dout[o + d])) * ym;
        }
        for (int j = 0; j < c.seq; ++j) {
          if (!sees(j)) continue;
          const int64_t rj = int64_t(b) * c.seq + j;
          double dp = 0;
          for (int d = 0; d < D; ++d) dp += double(dout[o + d]) * v[size_t(rj * Wk + kh * D + d)];
          const double ds = P[size_t(j)] * (dp - delta);
          const double dsm = P[size_t(j)] * (std::fabs(dp) + std::fabs(delta) + m);
          for (int d = 0; d < D; ++d) {
            const size_t kj = size_t(rj * Wk + kh * D + d);
            r.dq[o + d] += scale * ds * k[kj];
            r.dq_m[o + d] += scale * dsm * std::fabs(double(k[kj]));
            r.dk[kj] += scale * ds * q[o + d];
            r.dk_m[kj] += scale * dsm * std::fabs(double(q[o + d]));
            r.dv[kj] += P[size_t(j)] * dout[o + d];
            r.dv_m[kj] += P[size_t(j)] * std::fabs(double(dout[o + d]));
          }
        }
      }
    }
  return r;
}

// Every element within c * u * magnitude + 1e-6 of the reference (NaN fails); returns the
// largest error as a fraction of its bound, for the log.
double check_within(const char* what, const FVec& got, const std::vector<double>& want,
                    const std::vector<double>& mag, double c) {
  EXPECT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  int reported = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double tol = c * kU * mag[i] + 1e-6, err = std::fabs(double(got[i]) - want[i]);
    if (!(err <= tol) && reported++ < 5)
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", fp64 " << want[i] << ", bound "
                    << tol;
    worst = std::max(worst, err / tol);
  }
  return worst;
}

std::unique_ptr<qlft::Backend> bf16_backend(qlft::MemoryTracker* t) {
  qlft::CudaBackendOptions o;
  o.spec.precision = qlft::Precision::BF16;
  o.autocast = true;  // as make_backend sets it for train.precision=bf16
  return qlft::make_cuda_backend(t, o);
}

}  // namespace

TEST(CudaAttentionTc, ForwardAndBackwardEqualFp64WithinBf16Bounds) {
  QLFT_NEED_GPU();
  qlft::MemoryTracker tracker;
  auto gpu = bf16_backend(&tracker);
  std::mt19937_64 g(45);
  const Case cases[] = {
      {2, 77, 4, 2, 64, true},    // GQA 2, packed, two query tiles (the second ragged)
      {1, 100, 4, 1, 80, false},  // GQA 4, causal only
      {2, 37, 2, 2, 96, true},    // no grouping, packed, one ragged tile
      {1, 70, 4, 2, 128, true},   // GQA 2, packed
      {3, 9, 2, 1, 64, false},    // fewer rows than one warp's 16
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message()
                 << "batch " << c.batch << " seq " << c.seq << " heads " << c.heads << "/" << c.kv
                 << " dim " << c.dim << " docs " << c.docs);
    ASSERT_TRUE(qlft::cuda_attention_tensor_cores(qlft::Precision::BF16, true, c.dim))
        << "this test is for the tensor-core path";
    const int64_t rows = int64_t(c.batch) * c.seq, Wq = int64_t(c.heads) * c.dim,
                  Wk = int64_t(c.kv) * c.dim;
    const FVec q = bf16_normal(g, size_t(rows * Wq), 1.f),
               k = bf16_normal(g, size_t(rows * Wk), 1.f),
               v = bf16_normal(g, size_t(rows * Wk), 1.f),
               dout = bf16_normal(g, size_t(rows * Wq), 1.f);
    // Documents of drawn lengths 5..40 per batch element (the last one cut by the sequence end).
    std::vector<int32_t> doc(static_cast<size_t>(rows));
    for (int b = 0; b < c.batch; ++b) {
      int id = 0, left = 0;
      for (int t = 0; t < c.seq; ++t) {
        if (left == 0) left = std::uniform_int_distribution<int>(5, 40)(g), ++id;
        doc[size_t(b * c.seq + t)] = id;
        --left;
      }
    }
    qlft::AttnShape s;
    s.batch = c.batch;
    s.seq = c.seq;
    s.n_heads = c.heads;
    s.n_kv_heads = c.kv;
    s.head_dim = c.dim;
    s.doc_ids = c.docs ? doc.data() : nullptr;
    const Ref r = reference(c, q, k, v, dout, doc);

    FVec out(q.size()), lse(size_t(c.heads * rows));
    gpu->attention_fwd(s, {q.data(), rows, Wq, Wq}, {k.data(), rows, Wk, Wk},
                       {v.data(), rows, Wk, Wk}, {out.data(), rows, Wq, Wq}, lse.data());
    const std::vector<double> lse_m(lse.size(), 1.0);
    const double w_out = check_within("out", out, r.out, r.out_m, 4);
    const double w_lse = check_within("lse", lse, r.lse, lse_m, 4);

    // Backward from the device's own forward (as training runs it), into non-zero gradients:
    // the kernels accumulate.
    FVec dq(q.size(), 0.5f), dk(k.size(), 0.5f), dv(v.size(), 0.5f);
    gpu->attention_bwd(s, {q.data(), rows, Wq, Wq}, {k.data(), rows, Wk, Wk},
                       {v.data(), rows, Wk, Wk}, {out.data(), rows, Wq, Wq}, lse.data(),
                       {dout.data(), rows, Wq, Wq}, {dq.data(), rows, Wq, Wq},
                       {dk.data(), rows, Wk, Wk}, {dv.data(), rows, Wk, Wk});
    for (auto& x : dq) x -= 0.5f;
    for (auto& x : dk) x -= 0.5f;
    for (auto& x : dv) x -= 0.5f;
    const double w_dq = check_within("dq", dq, r.dq, r.dq_m, 8);
    const double w_dk = check_within("dk", dk, r.dk, r.dk_m, 8);
    const double w_dv = check_within("dv", dv, r.dv, r.dv_m, 8);
    std::printf("dim %3d seq %3d: worst error / bound: out %.3f lse %.3f dq %.3f dk %.3f dv %.3f\n",
                c.dim, c.seq, w_out, w_lse, w_dq, w_dk, w_dv);
  }
}

// dQ is summed without atomics (a second kernel walks each query tile's keys in order), so two
// runs give the same bits. On a GPU with fp32 atomics for dQ (the fp32 kernel) they would not in
// general; the emulator runs blocks one after another, so there this holds either way and the
// test's force is on a device.
TEST(CudaAttentionTc, BackwardIsBitwiseDeterministic) {
  QLFT_NEED_GPU();
  qlft::MemoryTracker tracker;
  auto gpu = bf16_backend(&tracker);
  std::mt19937_64 g(46);
  const Case c{2, 90, 4, 1, 64, true};
  const int64_t rows = int64_t(c.batch) * c.seq, Wq = int64_t(c.heads) * c.dim,
                Wk = int64_t(c.kv) * c.dim;
  const FVec q = bf16_normal(g, size_t(rows * Wq), 1.f), k = bf16_normal(g, size_t(rows * Wk), 1.f),
             v = bf16_normal(g, size_t(rows * Wk), 1.f),
             dout = bf16_normal(g, size_t(rows * Wq), 1.f);
  std::vector<int32_t> doc(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) doc[size_t(i)] = int32_t((i % c.seq) / 31);
  qlft::AttnShape s;
  s.batch = c.batch;
  s.seq = c.seq;
  s.n_heads = c.heads;
  s.n_kv_heads = c.kv;
  s.head_dim = c.dim;
  s.doc_ids = doc.data();
  FVec out(q.size()), lse(size_t(c.heads * rows));
  gpu->attention_fwd(s, {q.data(), rows, Wq, Wq}, {k.data(), rows, Wk, Wk},
                     {v.data(), rows, Wk, Wk}, {out.data(), rows, Wq, Wq}, lse.data());
  FVec dq[2], dk[2], dv[2];
  for (int run = 0; run < 2; ++run) {
    dq[run].assign(q.size(), 0.f);
    dk[run].assign(k.size(), 0.f);
    dv[run].assign(v.size(), 0.f);
    gpu->attention_bwd(s, {q.data(), rows, Wq, Wq}, {k.data(), rows, Wk, Wk},
                       {v.data(), rows, Wk, Wk}, {out.data(), rows, Wq, Wq}, lse.data(),
                       {dout.data(), rows, Wq, Wq}, {dq[run].data(), rows, Wq, Wq},
                       {dk[run].data(), rows, Wk, Wk}, {dv[run].data(), rows, Wk, Wk});
  }
  EXPECT_EQ(std::memcmp(dq[0].data(), dq[1].data(), dq[0].size() * 4), 0);
  EXPECT_EQ(std::memcmp(dk[0].data(), dk[1].data(), dk[0].size() * 4), 0);
  EXPECT_EQ(std::memcmp(dv[0].data(), dv[1].data(), dv[0].size() * 4), 0);
  double n = 0;
  for (float x : dq[0]) n += double(x) * x;
  EXPECT_GT(n, 0.0);  // and it is not all zeros
}

// Document starts are derived once per batch and kept while the device doc ids are unchanged
// (CudaBackend::doc_starts): a new batch's ids written into the same device buffer (as the
// runner writes each batch) must be seen, in both attention paths. Checked against the CPU
// backend on the same inputs.
TEST(CudaAttentionTc, DocumentStartsFollowEachBatchInTheSameBuffer) {
  QLFT_NEED_GPU();
  qlft::MemoryTracker tracker;
  auto gpu = bf16_backend(&tracker);
  auto cpu = qlft::make_cpu_backend(&tracker);
  std::mt19937_64 g(47);
  for (int dim : {8, 64}) {  // the fp32 kernels and the tensor-core ones
    SCOPED_TRACE(testing::Message() << "dim " << dim);
    ASSERT_EQ(qlft::cuda_attention_tensor_cores(qlft::Precision::BF16, true, dim), dim == 64);
    const Case c{2, 70, 2, 1, dim, true};
    const int64_t rows = int64_t(c.batch) * c.seq, Wq = int64_t(c.heads) * c.dim,
                  Wk = int64_t(c.kv) * c.dim;
    const FVec q = bf16_normal(g, size_t(rows * Wq), 1.f),
               k = bf16_normal(g, size_t(rows * Wk), 1.f),
               v = bf16_normal(g, size_t(rows * Wk), 1.f);
    qlft::Buffer docs = gpu->alloc(qlft::MemCategory::Activations, size_t(rows) * 4, "doc ids");
    qlft::AttnShape s;
    s.batch = c.batch;
    s.seq = c.seq;
    s.n_heads = c.heads;
    s.n_kv_heads = c.kv;
    s.head_dim = c.dim;
    // Batch 1: documents of 20; batch 2: of 45, then 7 (starts move both ways).
    for (int len : {20, 45, 7}) {
      std::vector<int32_t> ids(static_cast<size_t>(rows));
      for (int64_t i = 0; i < rows; ++i) ids[size_t(i)] = int32_t((i % c.seq) / len);
      docs.copy_from_host(ids.data(), size_t(rows) * 4);
      FVec o_gpu(q.size()), o_cpu(q.size()), l_gpu(size_t(c.heads * rows)), l_cpu(l_gpu.size());
      for (int call = 0; call < 2; ++call) {  // the second call reuses the starts
        s.doc_ids = docs.as<int32_t>();
        gpu->attention_fwd(s, {q.data(), rows, Wq, Wq}, {k.data(), rows, Wk, Wk},
                           {v.data(), rows, Wk, Wk}, {o_gpu.data(), rows, Wq, Wq}, l_gpu.data());
        s.doc_ids = ids.data();
        cpu->attention_fwd(s, {q.data(), rows, Wq, Wq}, {k.data(), rows, Wk, Wk},
                           {v.data(), rows, Wk, Wk}, {o_cpu.data(), rows, Wq, Wq}, l_cpu.data());
        // bf16 products on the device (a few bf16 steps), fp32 on this CPU backend.
        EXPECT_LT(qlft_cuda_test::norm_err(o_gpu, o_cpu), 2e-2) << "documents of " << len;
        EXPECT_LT(qlft_cuda_test::norm_err(l_gpu, l_cpu), 2e-2) << "documents of " << len;
      }
    }
  }
}

namespace {

// A two-layer llama of head_dim 64 (two query heads, one KV head) with random fp32 weights.
std::unique_ptr<qlft::Model> head64_model(qlft::MemoryTracker* t) {
  using namespace qlft;
  auto m = std::make_unique<Model>();
  ModelConfig& c = m->cfg;
  c.arch = "llama";
  c.n_layers = 2;
  c.dim = 128;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 64;
  c.ffn_dim = 96;
  c.vocab = 96;
  c.context_length = 4096;
  c.tied_embeddings = true;
  m->shapes = model_shapes(c);
  std::mt19937_64 g(48);
  auto weight = [&](int64_t rows, int64_t cols) {
    std::normal_distribution<float> d(0.f, 0.08f);
    std::vector<float> w(size_t(rows * cols));
    for (float& x : w) x = d(g);
    return qweight_from_f32(t, w.data(), rows, cols, QuantKind::F32);
  };
  auto ones = [&](int n) {
    Buffer b(t, MemCategory::Weights, size_t(n) * 4, "norm");
    for (int i = 0; i < n; ++i) b.as<float>()[i] = 1.f;
    return b;
  };
  m->tok_embd = weight(c.vocab, c.dim);
  m->output_norm = ones(c.dim);
  const int64_t qd = 128, kvd = 64;
  const int64_t shape[kProjCount][2] = {{qd, c.dim},       {kvd, c.dim},       {kvd, c.dim},
                                        {c.dim, qd},       {c.ffn_dim, c.dim}, {c.ffn_dim, c.dim},
                                        {c.dim, c.ffn_dim}};
  m->layers.resize(size_t(c.n_layers));
  for (LayerWeights& L : m->layers) {
    L.attn_norm = ones(c.dim);
    L.ffn_norm = ones(c.dim);
    for (int p = 0; p < kProjCount; ++p) L.proj[p] = weight(shape[p][0], shape[p][1]);
  }
  return m;
}

}  // namespace

// The runner's bf16 step (16-bit stored activations, packed documents, batch 2) with attention on
// the tensor-core kernels against the CPU backend's native bf16 step: loss and every LoRA
// gradient. Both round the same operands to bf16 and accumulate in fp32; they differ where a
// different fp32 summation order flips a bf16 rounding (bounds as test_cuda_ops' bf16 ones).
TEST(CudaAttentionTc, Bf16TrainingStepFollowsCpu) {
  QLFT_NEED_GPU();
  using namespace qlft;
  MemoryTracker tr;
  auto m = head64_model(&tr);
  ASSERT_TRUE(cuda_attention_tensor_cores(Precision::BF16, true, m->cfg.head_dim));
  const int B = 2, S = 75;
  std::vector<int32_t> tok(size_t(B * S)), tgt(tok.size()), pos(tok.size()), doc(tok.size());
  std::mt19937_64 g(49);
  for (int i = 0; i < B * S; ++i) {
    const int t = i % S, d = t < 30 ? 0 : t < 62 ? 1 : 2;  // documents of 30, 32, 13
    tok[size_t(i)] = int32_t(g() % 96);
    doc[size_t(i)] = d;
    pos[size_t(i)] = t - (d == 0 ? 0 : d == 1 ? 30 : 62);
  }
  for (int i = 0; i < B * S; ++i)
    tgt[size_t(i)] =
        i % S + 1 < S && doc[size_t(i) + 1] == doc[size_t(i)] ? tok[size_t(i) + 1] : kIgnoreIndex;
  TokenBatch b;
  b.batch = B;
  b.seq = S;
  b.tokens = tok.data();
  b.targets = tgt.data();
  b.positions = pos.data();
  b.doc_ids = doc.data();
  struct Out {
    double loss;
    std::vector<float> grads;
  };
  // ckpt: the checkpointed layer (-1: none). One checkpointed layer beside a stored one runs
  // both hand-overs of the residual gradient's bf16 copy between layers (LlamaRunner::bwd_direct):
  // from a stored layer to a recomputed one and back.
  auto step = [&](Backend& be, int ckpt) {
    LoraConfig lc;
    lc.r = 8;
    lc.alpha = 16;
    LoraAdapter lora(&tr, m->shapes, lc);
    std::mt19937_64 gl(50);  // B non-zero so every dA is too
    for (int l = 0; l < m->cfg.n_layers; ++l)
      for (int p = 0; p < kProjCount; ++p) {
        std::vector<float> A = lora.get_hf(l, Proj(p), LoraAdapter::Part::A),
                           Bm = lora.get_hf(l, Proj(p), LoraAdapter::Part::B);
        std::normal_distribution<float> d(0.f, 0.05f);
        for (float& x : Bm) x = d(gl);
        lora.set_hf(l, Proj(p), A.data(), int64_t(A.size()), Bm.data(), int64_t(Bm.size()));
      }
    LlamaRunner run(*m, be, &lora);
    run.set_activation_dtype(activation_dtype(Precision::BF16));
    if (ckpt >= 0) run.set_checkpoint(ckpt, true);
    Out o;
    o.loss = run.forward(b).mean();
    run.backward();
    for (int l = 0; l < m->cfg.n_layers; ++l)
      for (int p = 0; p < kProjCount; ++p)
        for (LoraAdapter::Part part : {LoraAdapter::Part::dA, LoraAdapter::Part::dB}) {
          const std::vector<float> v = lora.get_hf(l, Proj(p), part);
          o.grads.insert(o.grads.end(), v.begin(), v.end());
        }
    return o;
  };
  auto cpu = make_autocast_backend(make_cpu_backend(&tr), DType::BF16);
  auto gpu = bf16_backend(&tr);
  for (int ckpt : {-1, 0, 1}) {
    SCOPED_TRACE(ckpt);
    const Out c = step(*cpu, ckpt), d = step(*gpu, ckpt);
    const double gerr = qlft_cuda_test::norm_err(d.grads, c.grads);
    std::printf("bf16 step (checkpointed layer %d): loss cpu %.7f cuda %.7f, LoRA gradients %.3g\n",
                ckpt, c.loss, d.loss, gerr);
    EXPECT_NEAR(d.loss, c.loss, 2e-3 * std::fabs(c.loss));
    EXPECT_LT(gerr, 2e-2);
  }
}
