// Causal (optionally document-masked) GQA attention, blocked over queries: each task takes a
// block of tune.attn_block_q query rows of one head and sees its whole key range at once, so memory
// is one [block, seq] score tile per thread (linear in sequence length) and only the log-sum-exp is
// saved. Backward recomputes the tiles. Tasks write disjoint outputs and each runs sequentially, so
// results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

#include "backend/cpu/cpu_backend.h"
#include "backend/op_checks.h"
#include "backend/cpu/vec_kernels.h"
#include "backend/cpu/vec_math.h"
#include "backend/softmax_math.h"
#include "core/error.h"
#include "core/threads.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace qlft::cpu {

namespace {

int max_threads() {
  return qlft::num_threads();
}
int thread_id() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

// first[row] = the first position j of the same batch element with doc[j] == doc[row]: no key
// before it can be attended by this row, which bounds each tile's key range.
Buffer first_same_doc(const CpuBackend& be, const AttnShape& s) {
  const int64_t rows = int64_t(s.batch) * s.seq;
  Buffer buf = be.workspace(size_t(rows) * sizeof(int32_t), "attention doc starts");
  int32_t* first = buf.as<int32_t>();
  for (int b = 0; b < s.batch; ++b) {
    std::unordered_map<int32_t, int32_t> seen;
    for (int t = 0; t < s.seq; ++t) {
      int64_t row = int64_t(b) * s.seq + t;
      if (!s.doc_ids) {
        first[row] = 0;
        continue;
      }
      auto it = seen.emplace(s.doc_ids[row], t).first;
      first[row] = it->second;
    }
  }
  return buf;
}

// One task's geometry: batch element b, head h, queries [q0, q0 + nq), keys [k0, k1).
struct Tile {
  int b, h, kh;
  int64_t q0, nq, k0, k1;
};

Tile make_tile(const AttnShape& s, const int32_t* first, int64_t bq, int b, int h, int64_t qb) {
  Tile t;
  t.b = b;
  t.h = h;
  t.kh = h / (s.n_heads / s.n_kv_heads);
  t.q0 = qb * bq;
  t.nq = std::min<int64_t>(bq, s.seq - t.q0);
  t.k1 = t.q0 + t.nq;  // causal
  int64_t base = int64_t(b) * s.seq;
  int64_t k0 = t.q0;
  for (int64_t i = 0; i < t.nq; ++i) k0 = std::min<int64_t>(k0, first[base + t.q0 + i]);
  t.k0 = k0;
  return t;
}

// S = scale * Q K^T over the tile, then probabilities exp(S - lse) with masked entries 0.
// With lse_in == nullptr the row log-sum-exps are computed (and stored in lse_out when it is
// given: inference may pass none); otherwise lse_in is used. S is [nq, k1 - k0] contiguous.
void tile_probs(const AttnShape& s, const Tile& t, CMatF q, CMatF k, float scale, float* S,
                const float* lse_in, float* lse_out) {
  const int D = s.head_dim;
  const int64_t base = int64_t(t.b) * s.seq, kw = t.k1 - t.k0;
  const int64_t rows = int64_t(s.batch) * s.seq;
  sgemm(false, true, t.nq, kw, D, scale, q.row(base + t.q0) + int64_t(t.h) * D, q.stride,
        k.row(base + t.k0) + int64_t(t.kh) * D, k.stride, 0.f, S, kw);
  for (int64_t i = 0; i < t.nq; ++i) {
    const int64_t qi = t.q0 + i;
    float* sr = S + i * kw;
    const int64_t jend = qi + 1 - t.k0;  // keys after qi are masked (causal)
    const float neg_inf = -std::numeric_limits<float>::infinity();
#pragma omp simd
    for (int64_t j = jend; j < kw; ++j) sr[j] = neg_inf;
    if (s.doc_ids) {
      const int32_t d = s.doc_ids[base + qi];
      const int32_t* dk = s.doc_ids + base + t.k0;
#pragma omp simd
      for (int64_t j = 0; j < jend; ++j) sr[j] = dk[j] == d ? sr[j] : neg_inf;
    }
    float L;
    const int64_t lidx = int64_t(t.h) * rows + base + qi;
    if (!lse_in) {
      const float m = vec_kernels().max_of(sr, jend);
      const double sum = vec_kernels().sum_exp_shifted(sr, jend, m);
      OnlineSoftmax<double> st;
      online_softmax_merge(st, m, sum);
      L = online_softmax_lse(st);
      if (lse_out) lse_out[lidx] = L;
    } else {
      L = lse_in[lidx];
    }
    vec_kernels().exp_shifted(sr, kw, L, 1.f);
  }
}

}  // namespace

void CpuBackend::attention_fwd(const AttnShape& s, CMatF q, CMatF k, CMatF v, MatF out,
                               float* lse) {
  op_checks::attention(s, q, k, v, "attention_fwd");
  op_checks::attention_fwd_out(s, q, out.as_const());
  const int D = s.head_dim;
  const float scale = 1.0f / std::sqrt(float(D));
  const int64_t bq = std::max<int64_t>(1, tune.attn_block_q);
  const int64_t nqb = (s.seq + bq - 1) / bq;
  const int64_t ntasks = int64_t(s.batch) * s.n_heads * nqb;
  Buffer first_buf = first_same_doc(*this, s);
  const int32_t* first = first_buf.as<int32_t>();
  const int nt = int(std::min<int64_t>(max_threads(), ntasks));
  const int64_t tile = bq * int64_t(s.seq);
  Buffer ws = workspace(size_t(nt) * tile * 4, "attention score tiles");
#pragma omp parallel num_threads(nt)
  {
    float* S = ws.as<float>() + thread_id() * tile;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < ntasks; ++task) {
      // Latest query blocks first: they are the largest, which balances the dynamic schedule.
      int64_t qb = nqb - 1 - task % nqb;
      int64_t bh = task / nqb;
      Tile t = make_tile(s, first, bq, int(bh / s.n_heads), int(bh % s.n_heads), qb);
      tile_probs(s, t, q, k, scale, S, nullptr, lse);
      const int64_t base = int64_t(t.b) * s.seq, kw = t.k1 - t.k0;
      sgemm(false, false, t.nq, D, kw, 1.f, S, kw, v.row(base + t.k0) + int64_t(t.kh) * D, v.stride,
            0.f, out.row(base + t.q0) + int64_t(t.h) * D, out.stride);
    }
  }
}

void CpuBackend::attention_bwd(const AttnShape& s, CMatF q, CMatF k, CMatF v, CMatF out,
                               const float* lse, CMatF dout, MatF dq, MatF dk, MatF dv) {
  op_checks::attention(s, q, k, v, "attention_bwd");
  op_checks::attention_bwd_grads(q, k, v, out, dout, dq.as_const(), dk.as_const(), dv.as_const(),
                                 lse);
  const int D = s.head_dim;
  const float scale = 1.0f / std::sqrt(float(D));
  const int group = s.n_heads / s.n_kv_heads;
  const int64_t bq = std::max<int64_t>(1, tune.attn_block_q);
  const int64_t nqb = (s.seq + bq - 1) / bq;
  // One task per (batch element, KV head): it alone writes that slice of dk/dv and the dq of
  // its query heads, so no two tasks touch the same output.
  const int64_t ntasks = int64_t(s.batch) * s.n_kv_heads;
  Buffer first_buf = first_same_doc(*this, s);
  const int32_t* first = first_buf.as<int32_t>();
  const int nt = int(std::min<int64_t>(max_threads(), ntasks));
  const int64_t tile = bq * int64_t(s.seq);
  Buffer ws = workspace(size_t(nt) * (2 * tile + bq) * 4, "attention backward tiles");
#pragma omp parallel num_threads(nt)
  {
    float* P = ws.as<float>() + thread_id() * (2 * tile + bq);
    float* dS = P + tile;
    float* Dr = dS + tile;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < ntasks; ++task) {
      const int b = int(task / s.n_kv_heads), kh = int(task % s.n_kv_heads);
      const int64_t base = int64_t(b) * s.seq;
      for (int h = kh * group; h < (kh + 1) * group; ++h) {
        for (int64_t qb = 0; qb < nqb; ++qb) {
          Tile t = make_tile(s, first, bq, b, h, qb);
          const int64_t kw = t.k1 - t.k0;
          tile_probs(s, t, q, k, scale, P, lse, nullptr);
          const float* dO = dout.row(base + t.q0) + int64_t(h) * D;
          const float* O = out.row(base + t.q0) + int64_t(h) * D;
          const float* Vt = v.row(base + t.k0) + int64_t(kh) * D;
          const float* Kt = k.row(base + t.k0) + int64_t(kh) * D;
          const float* Qt = q.row(base + t.q0) + int64_t(h) * D;
          // dP = dO V^T
          sgemm(false, true, t.nq, kw, D, 1.f, dO, dout.stride, Vt, v.stride, 0.f, dS, kw);
          // D_i = dO_i . O_i ; dS = P (dP - D_i)
          for (int64_t i = 0; i < t.nq; ++i) {
            const float* a = dO + i * dout.stride;
            const float* o = O + i * out.stride;
            double acc = 0;
            for (int d = 0; d < D; ++d) acc += double(a[d]) * o[d];
            Dr[i] = float(acc);
          }
          for (int64_t i = 0; i < t.nq; ++i) {
            float* ds = dS + i * kw;
            const float* p = P + i * kw;
            const float di = Dr[i];
            vec_kernels().softmax_bwd_row(ds, p, di, kw);
          }
          // dQ += scale dS K ; dK += scale dS^T Q ; dV += P^T dO
          sgemm(false, false, t.nq, D, kw, scale, dS, kw, Kt, k.stride, 1.f,
                dq.row(base + t.q0) + int64_t(h) * D, dq.stride);
          sgemm(true, false, kw, D, t.nq, scale, dS, kw, Qt, q.stride, 1.f,
                dk.row(base + t.k0) + int64_t(kh) * D, dk.stride);
          sgemm(true, false, kw, D, t.nq, 1.f, P, kw, dO, dout.stride, 1.f,
                dv.row(base + t.k0) + int64_t(kh) * D, dv.stride);
        }
      }
    }
  }
}

}  // namespace qlft::cpu
