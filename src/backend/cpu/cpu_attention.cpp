// Causal (optionally document-masked) GQA attention, blocked over queries: each task takes a
// block of tune.attn_block_q query rows of one head and sees its whole key range at once, so memory
// is one [block, seq] score tile per thread (linear in sequence length) and only the log-sum-exp is
// saved. Backward recomputes the tiles. Tasks write disjoint outputs and each runs sequentially, so
// results do not depend on the thread count. Each tile's products skip most of the masked keys of
// its diagonal block in steps (for_stairs).
// Precision bf16 (as torch's bf16 SDPA): every GEMM takes bf16 operands with fp32 accumulation:
// q, k, v, dout rounded once per call, the probabilities P and the score gradients dS rounded
// where they enter P V, dQ, dK and dV. Scores, softmax statistics and outputs stay fp32.
// fp32 runs Q K^T, P V, dO V^T and dS K on oneDNN (CpuTuning::f32_attn_onednn), dK and dV on
// OpenBLAS. With CpuTuning::attn_amx, precision bf16 hands both directions to
// cpu_attention_amx.cpp (the same tasks and softmax passes on AMX tiles).
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/cpu/attention_tiles.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/op_checks.h"
#include "backend/cpu/vec_kernels.h"
#include "backend/cpu/vec_math.h"
#include "backend/softmax_math.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/fp_env.h"
#include "core/profile.h"
#include "core/threads.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace qlft::cpu {

namespace attn {

int thread_id() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

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

Tile make_tile(const AttnShape& s, const int32_t* first, int64_t bq, int b, int h, int64_t qb,
               int64_t key_align) {
  Tile t;
  t.b = b;
  t.h = h;
  t.kh = h / (s.n_heads / s.n_kv_heads);
  t.q0 = qb * bq;
  t.nq = std::min<int64_t>(bq, s.seq - t.q0);
  t.k1 = t.q0 + t.nq;  // causal
  int64_t base = int64_t(b) * s.seq;
  int64_t k0 = t.q0;
  for (int64_t i = 0; i < t.nq; ++i) {
    int64_t lo = first[base + t.q0 + i];
    if (s.window > 0) lo = std::max<int64_t>(lo, t.q0 + i - s.window + 1);  // the window's start
    k0 = std::min<int64_t>(k0, lo);
  }
  t.k0 = k0 / key_align * key_align;
  return t;
}

void tile_softmax_rows(const AttnShape& s, const Tile& t, int64_t step, int64_t pad_to,
                       float prescale, float* S, int64_t ld, const float* lse_in, float* lse_out,
                       uint16_t* pbf) {
  const int64_t base = int64_t(t.b) * s.seq;
  const int64_t rows = int64_t(s.batch) * s.seq;
  for (int64_t i = 0; i < t.nq; ++i) {
    const int64_t qi = t.q0 + i;
    float* sr = S + i * ld;
    const int64_t jend = qi + 1 - t.k0;  // keys after qi are masked (causal)
    const float neg_inf = -std::numeric_limits<float>::infinity();
    if (prescale != 1.f) {
#pragma omp simd
      for (int64_t j = 0; j < jend; ++j) sr[j] *= prescale;
    }
    if (s.softcap > 0) {  // Gemma 2's attn_logit_softcapping, on the scaled scores
      const float cap = s.softcap;
      for (int64_t j = 0; j < jend; ++j) sr[j] = cap * std::tanh(sr[j] / cap);
    }
    if (s.doc_ids) {
      const int32_t d = s.doc_ids[base + qi];
      const int32_t* dk = s.doc_ids + base + t.k0;
#pragma omp simd
      for (int64_t j = 0; j < jend; ++j) sr[j] = dk[j] == d ? sr[j] : neg_inf;
    }
    if (s.window > 0)  // sliding window: keys up to qi - window are masked (j > qi - window)
      std::fill(sr, sr + std::clamp<int64_t>(qi - s.window + 1 - t.k0, 0, jend), neg_inf);
    const int64_t lidx = int64_t(t.h) * rows + base + qi;
    const int64_t w = pad_to > 0 ? pad_to : t.row_width(i, step);  // masked from jend; read to w
    std::fill(sr + jend, sr + w, 0.f);
    uint16_t* pr = pbf ? pbf + i * ld : nullptr;
    if (pr) std::fill(pr + jend, pr + w, uint16_t(0));
    if (lse_in) {
      if (pr)
        vec_kernels().exp_shifted_bf16(sr, jend, lse_in[lidx], pr);
      else
        vec_kernels().exp_shifted(sr, jend, lse_in[lidx], 1.f);
      continue;
    }
    // One exp pass: e = exp(S - m) and its sum, then P = e / sum (= exp(S - lse) to rounding).
    const float m = vec_kernels().max_of(sr, jend);
    const double sum = vec_kernels().exp_sum_shifted(sr, jend, m);
    if (lse_out) {
      OnlineSoftmax<double> st;
      online_softmax_merge(st, m, sum);
      lse_out[lidx] = online_softmax_lse(st);
    }
    const float inv = float(1.0 / sum);
    if (pr) {
      vec_kernels().scale_to_bf16(sr, jend, inv, pr);
      continue;
    }
#pragma omp simd
    for (int64_t j = 0; j < jend; ++j) sr[j] *= inv;
  }
}

}  // namespace attn

namespace {

using attn::thread_id;
using attn::Tile;

int max_threads() {
  return qlft::num_threads();
}

// The causal staircase of a tile, the region its products run over. With step < nq: the keys
// before the diagonal block for all nq rows (one piece), then the diagonal block in steps of
// `step`: by rows, each step's rows to the key of its last row; by_column (for the products that
// sum over the rows: dS^T Q, P^T dO), each step's columns from its first row on. Keys past a row
// step's end are masked for all its rows and are neither computed nor read: two steps skip a
// quarter of the diagonal block, four three eighths. With step >= nq: the whole tile in one
// piece (the masked half of its diagonal block computed, then zeroed or ignored).
// fn(r0, nr, c0, nc): rows [r0, r0 + nr) x tile columns [c0, c0 + nc); products over the columns
// (P V, dS K) add the diagonal steps to what the first piece wrote.
// Each piece is a GEMM call: the steps pay where a call's fixed cost is small against its
// FLOPs (measured on a Zen 3, fp32 at SmolLM2's shape, attention_fwd|bwd/512: steps of 64 rows
// in 128-row tiles 3-4% faster than whole tiles, steps of 32 no faster).
template <class Fn>
void for_stairs(const Tile& t, int64_t step, bool by_column, Fn&& fn) {
  const int64_t d = t.diag();
  if (step >= t.nq) {
    fn(int64_t(0), t.nq, int64_t(0), d + t.nq);
    return;
  }
  if (d > 0) fn(int64_t(0), t.nq, int64_t(0), d);
  for (int64_t i = 0; i < t.nq; i += step) {
    const int64_t n = std::min(step, t.nq - i);
    if (by_column)
      fn(i, t.nq - i, d + i, n);
    else
      fn(i, n, d, i + n);
  }
}

// How both passes block the queries of a sequence of seq rows.
struct QueryBlocks {
  int64_t bq;   // query rows a tile
  int64_t nqb;  // blocks a sequence
  // oneDNN tiles: first keys rounded down to a multiple of bq (the keys added are other
  // documents', masked), so packed documents give the tile shapes of one document and oneDNN
  // few primitives to create; 1 elsewhere.
  int64_t align;
  bool fused;    // bf16 bits on oneDNN: the probabilities are rounded in the softmax pass itself
  int64_t step;  // the staircase step of the tiles: CpuTuning::attn_stair_rows on the fp32 GEMM
                 // engines, attn_stair_rows_bf16 on oneDNN's bf16 ones (<= 0: whole tiles)
};
QueryBlocks query_blocks(const CpuBackend& be, const OpGemm& mm, int64_t seq) {
  const CpuTuning& tune = be.tune;
  QueryBlocks b;
  b.bq = std::max<int64_t>(1, tune.attn_block_q);
  b.nqb = (seq + b.bq - 1) / b.bq;
  b.align = mm.tile_onednn() ? b.bq : 1;
  b.fused = mm.lp && be.bf16_onednn();
  const int64_t rows = b.fused ? tune.attn_stair_rows_bf16 : tune.attn_stair_rows;
  b.step = rows <= 0 ? b.bq : rows;
  return b;
}

// q, k, v or dout as the tile GEMMs read them: element (row, head, d) at
// p + head * head_stride + row * ld + d, in OpGemm's element type. fp32: the matrix itself
// (head_stride = head_dim, ld = its row stride). lp: a head-major dense bf16 copy (head_stride =
// rows * head_dim, ld = head_dim): oneDNN runs dense operands on its brgemm (AMX) kernels and
// strided ones on a much slower path.
struct Heads {
  Buffer own;
  const void* p = nullptr;
  int64_t ld = 0, head_stride = 0;
  const void* at(const OpGemm& mm, int64_t row, int head) const {
    return mm.at(p, head * head_stride + row * ld);
  }
};

// m16: m's values as bf16 (Backend::attention_inputs_16), read instead of m where given.
Heads heads_of(const OpGemm& mm, CMatF m, int n_heads, int D, const char* what,
               const uint16_t* m16 = nullptr) {
  Heads h;
  if (!mm.lp) {
    h.p = m.data;
    h.ld = m.stride;
    h.head_stride = D;
    return h;
  }
  const int64_t R = m.rows;
  const size_t eb = mm.elem_bytes();
  h.own = mm.be.scratch_buffer(size_t(R * n_heads * D) * eb, what);
  char* dst = static_cast<char*>(h.own.data());
  const int nt = R * n_heads * D >= 4096 ? qlft::num_threads() : 1;
  const int64_t C = int64_t(n_heads) * D;
  const bool lp16 = eb == 2;
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t r = 0; r < R; ++r)
    for (int hd = 0; hd < n_heads; ++hd) {
      char* to = dst + size_t((hd * R + r) * D) * eb;
      if (!m16)
        mm.convert(m.row(r) + int64_t(hd) * D, to, size_t(D));
      else if (lp16)  // the bits as they are
        std::copy_n(m16 + r * C + int64_t(hd) * D, D, reinterpret_cast<uint16_t*>(to));
      else  // sgemm's operands: widened (exact)
        bf16_to_f32_n(m16 + r * C + int64_t(hd) * D, reinterpret_cast<float*>(to), size_t(D));
    }
  h.p = dst;
  h.ld = D;
  h.head_stride = R * D;
  return h;
}

// S = scale * Q K^T over the tile, then the softmax passes (attn::tile_softmax_rows; inference
// may pass no lse_out). S is [nq, k1 - k0] contiguous; row i is written to t.row_width(i, step)
// (for_stairs), no further.
// gt: the Q K^T products' time is counted there (the op profile's tile_qk).
void tile_probs(const AttnShape& s, const Tile& t, int64_t step, const OpGemm& mm, const Heads& q,
                const Heads& k, float scale, float* S, const float* lse_in, float* lse_out,
                prof::TeamTimes& gt, uint16_t* pbf = nullptr) {
  const int D = s.head_dim;
  const int64_t base = int64_t(t.b) * s.seq, kw = t.k1 - t.k0;
  const int64_t g0 = gt.start();
  for_stairs(t, step, /*by_column=*/false, [&](int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
    mm.gemm_tile(true, nr, nc, D, scale, q.at(mm, base + t.q0 + r0, t.h), q.ld,
                 k.at(mm, base + t.k0 + c0, t.kh), k.ld, 0.f, S + r0 * kw + c0, kw);
  });
  gt.add(thread_id(), g0);
  attn::tile_softmax_rows(s, t, step, 0, 1.f, S, kw, lse_in, lse_out, pbf);
}

// p + off elements of mm's element type.
void* elem_at(const OpGemm& mm, void* p, int64_t off) {
  return static_cast<char*>(p) + off * int64_t(mm.elem_bytes());
}

// dst rows [r0, r0 + n) at columns [c0, c0 + D) += src [n, D] dense.
void add_rows(MatF dst, int64_t r0, int64_t c0, const float* src, int64_t n, int D) {
  for (int64_t i = 0; i < n; ++i) {
    float* d = dst.row(r0 + i) + c0;
    const float* x = src + i * D;
#pragma omp simd
    for (int e = 0; e < D; ++e) d[e] += x[e];
  }
}

}  // namespace

void CpuBackend::attention_fwd(const AttnShape& s, CMatF q, CMatF k, CMatF v, MatF out,
                               float* lse) {
  QLFT_PROFILE_SCOPE("attention_fwd");
  attention_fwd_impl(s, q, k, v, out, lse, nullptr);
}

void CpuBackend::attention_fwd_to_16(const AttnShape& s, CMatF q, CMatF k, CMatF v, MatF out,
                                     float* lse, DType t, uint16_t* out16) {
  QLFT_PROFILE_SCOPE("attention_fwd_to_16");
  if (!takes_input_16(t)) {
    Backend::attention_fwd_to_16(s, q, k, v, out, lse, t, out16);
    return;
  }
  attention_fwd_impl(s, q, k, v, out, lse, out16);
}

void CpuBackend::attention_fwd_impl(const AttnShape& s, CMatF q, CMatF k, CMatF v, MatF out,
                                    float* lse, uint16_t* out16) {
  // attention_inputs_16's copies are this call's alone.
  const std::array<const uint16_t*, 3> in16 = std::exchange(attn16_, {});
  op_checks::attention(s, q, k, v, "attention_fwd");
  op_checks::attention_fwd_out(s, q, out.as_const());
  if (const std::optional<AmxExec> ex = attn_amx_exec(tune, precision_ == DType::BF16)) {
    attention_fwd_amx(s, q, k, v, out, lse, out16, in16, *ex);
    return;
  }
  const int D = s.head_dim;
  const float scale = s.score_scale();
  const OpGemm mm{*this, precision_ == DType::BF16};
  const QueryBlocks qb = query_blocks(*this, mm, s.seq);
  const int64_t bq = qb.bq, nqb = qb.nqb, align = qb.align, step = qb.step;
  const bool fused = qb.fused;
  const int64_t ntasks = int64_t(s.batch) * s.n_heads * nqb;
  Buffer first_buf = attn::first_same_doc(*this, s);
  const int32_t* first = first_buf.as<int32_t>();
  const Heads qh = heads_of(mm, q, s.n_heads, D, "bf16 attention q", in16[0]),
              kh = heads_of(mm, k, s.n_kv_heads, D, "bf16 attention k", in16[1]),
              vh = heads_of(mm, v, s.n_kv_heads, D, "bf16 attention v", in16[2]);
  QLFT_CHECK_ARG(!out16 || mm.lp, "attention_fwd_to_16: precision bf16 only");
  const int nt = int(std::min<int64_t>(max_threads(), ntasks));
  const int64_t tile = bq * int64_t(s.seq);
  // Per thread: the fp32 score tile; with lp also the probabilities in the GEMM's element type
  // and a dense output tile (a dense C keeps oneDNN on its fast kernels).
  const int64_t per = tile * 4 + (mm.lp ? tile * int64_t(mm.elem_bytes()) + bq * D * 4 : 0);
  // Each team thread (attn::run_tile_team): its slab carved, then its share of the tasks.
  auto thread_body = [&](char* mine, TaskErrors& errs, attn::FwdTileTimes& gt) {
    float* S = reinterpret_cast<float*>(mine);
    void* P = mm.lp ? mine + tile * 4 : static_cast<void*>(S);
    float* O =
        mm.lp ? reinterpret_cast<float*>(mine + tile * (4 + int64_t(mm.elem_bytes()))) : nullptr;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < ntasks; ++task)
      errs.run([&] {
        // Latest query blocks first: they are the largest, which balances the dynamic schedule.
        int64_t qb = nqb - 1 - task % nqb;
        int64_t bh = task / nqb;
        Tile t = attn::make_tile(s, first, bq, int(bh / s.n_heads), int(bh % s.n_heads), qb, align);
        tile_probs(s, t, step, mm, qh, kh, scale, S, nullptr, lse, gt.qk,
                   fused ? static_cast<uint16_t*>(P) : nullptr);
        const int64_t base = int64_t(t.b) * s.seq, kw = t.k1 - t.k0;
        float* o = out.row(base + t.q0) + int64_t(t.h) * D;
        if (mm.lp && !fused)
          for (int64_t i = 0; i < t.nq; ++i)
            mm.convert(S + i * kw, elem_at(mm, P, i * kw), size_t(t.row_width(i, step)));
        // O = P V over the staircase (lp: into the dense tile O); the diagonal steps add to the
        // first piece's rows.
        float* const od = mm.lp ? O : o;
        const int64_t ldo = mm.lp ? D : out.stride;
        const int64_t g0 = gt.pv.start();
        for_stairs(t, step, /*by_column=*/false,
                   [&](int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
                     mm.gemm_tile(false, nr, D, nc, 1.f, mm.at(P, r0 * kw + c0), kw,
                                  vh.at(mm, base + t.k0 + c0, t.kh), vh.ld, c0 > 0 ? 1.f : 0.f,
                                  od + r0 * ldo, ldo);
                   });
        gt.pv.add(thread_id(), g0);
        if (!mm.lp) return;
        if (out16) {  // (dense: the row stride is out's columns)
          uint16_t* o16 = out16 + (base + t.q0) * out.cols + int64_t(t.h) * D;
          for (int64_t i = 0; i < t.nq; ++i)
            f32_to_bf16_n(O + i * D, o16 + i * out.cols, size_t(D));
          return;
        }
        for (int64_t i = 0; i < t.nq; ++i)
          std::copy(O + i * D, O + (i + 1) * D, o + i * out.stride);
      });
  };
  attn::run_tile_team<attn::FwdTileTimes>(*this, nt, size_t(per), "attention score tiles",
                                          tune.flush_denormals, thread_body);
}

void CpuBackend::attention_bwd(const AttnShape& s, CMatF q, CMatF k, CMatF v, CMatF out,
                               const float* lse, CMatF dout, MatF dq, MatF dk, MatF dv) {
  QLFT_PROFILE_SCOPE("attention_bwd");
  attention_bwd_impl(s, q, k, v, out, lse, dout, dq, dk, dv, nullptr, {}, {}, {});
}

// Precision bf16: each task's dense fp32 dQ tile and dK, dV rows are what attention_bwd adds
// into zeroed dq, dk, dv; here they are rotated back (RoPE inverse, rope's tables and row
// kernel, head by head) and rounded into dq16 / dk16 / dv16, so the values are the bits of
// attention_bwd, rope and to_16 in turn. Other precisions: the separate ops.
void CpuBackend::attention_bwd_16(const AttnShape& s, CMatF q, CMatF k, CMatF v, CMatF out,
                                  const float* lse, CMatF dout, const RopeArgs& rope, DType t,
                                  View2<uint16_t> dq16, View2<uint16_t> dk16,
                                  View2<uint16_t> dv16) {
  QLFT_PROFILE_SCOPE("attention_bwd_16");
  if (!takes_input_16(t)) {
    attn16_ = {};
    Backend::attention_bwd_16(s, q, k, v, out, lse, dout, rope, t, dq16, dk16, dv16);
    return;
  }
  auto fits = [](View2<uint16_t> g, CMatF m) {
    return g.data && g.rows == m.rows && g.cols == m.cols && g.stride >= g.cols;
  };
  QLFT_CHECK_ARG(fits(dq16, q) && fits(dk16, k) && fits(dv16, v),
                 "attention_bwd_16: dq16 / dk16 / dv16 must have q's / k's / v's shapes");
  QLFT_CHECK_ARG(rope.freqs, "attention_bwd_16: RopeArgs.freqs is required");
  op_checks::rope(q.cols, s.n_heads, s.head_dim, *rope.freqs);
  op_checks::rope(k.cols, s.n_kv_heads, s.head_dim, *rope.freqs);
  attention_bwd_impl(s, q, k, v, out, lse, dout, MatF(nullptr, q.rows, q.cols),
                     MatF(nullptr, k.rows, k.cols), MatF(nullptr, v.rows, v.cols), &rope, dq16,
                     dk16, dv16);
}

void CpuBackend::attention_bwd_impl(const AttnShape& s, CMatF q, CMatF k, CMatF v, CMatF out,
                                    const float* lse, CMatF dout, MatF dq, MatF dk, MatF dv,
                                    const RopeArgs* rope, View2<uint16_t> dq16,
                                    View2<uint16_t> dk16, View2<uint16_t> dv16) {
  // attention_inputs_16's copies and attention_out_16's out are this call's alone.
  const std::array<const uint16_t*, 3> in16 = std::exchange(attn16_, {});
  // (plain variables, not a structured binding: the tile lambda below captures them, which
  // clang before 16 refuses for bindings)
  const std::array<const uint16_t*, 2> out16s = std::exchange(attn_out16_, {});
  const uint16_t* const out16 = out16s[0];
  const uint16_t* const dout16 = out16s[1];
  op_checks::attention(s, q, k, v, "attention_bwd");
  if (!rope)
    op_checks::attention_bwd_grads(q, k, v, out, dout, dq.as_const(), dk.as_const(), dv.as_const(),
                                   lse);
  if (const std::optional<AmxExec> ex = attn_amx_exec(tune, precision_ == DType::BF16)) {
    attention_bwd_amx(s, q, k, v, out, lse, dout, dq, dk, dv, rope, dq16, dk16, dv16, in16, out16,
                      dout16, *ex);
    return;
  }
  const int D = s.head_dim;
  const float scale = s.score_scale();
  const int group = s.n_heads / s.n_kv_heads;
  const OpGemm mm{*this, precision_ == DType::BF16};
  const QueryBlocks qb = query_blocks(*this, mm, s.seq);
  const int64_t bq = qb.bq, nqb = qb.nqb, align = qb.align, step = qb.step;
  // The soft-cap scales dS between the softmax backward and its rounding: not fused.
  const bool fused = qb.fused && s.softcap == 0.f;
  // One task per (batch element, KV head): it alone writes that slice of dk/dv and the dq of
  // its query heads, so no two tasks touch the same output.
  const int64_t ntasks = int64_t(s.batch) * s.n_kv_heads;
  Buffer first_buf = attn::first_same_doc(*this, s);
  const int32_t* first = first_buf.as<int32_t>();
  // attention_bwd_16 (precision bf16 only): the tiles rotated and rounded into dq16 etc.
  std::unique_ptr<RopeTable> rtab;
  if (rope) {
    QLFT_CHECK_ARG(mm.lp, "attention_bwd_16: precision bf16 only");
    rtab = std::make_unique<RopeTable>(*this, rope->pos, q.rows, D, *rope->freqs, true);
  }
  // n rows of src [n, D] dense from row r0 into g's columns [c0, c0 + D): 0 + src (as added
  // into zeroed fp32), rotated back when `rot`, rounded.
  auto put16 = [&](View2<uint16_t> g, int64_t r0, int64_t c0, const float* src, int64_t n, bool rot,
                   float* tmp) {
    for (int64_t i = 0; i < n; ++i) {
      const float* x = src + i * D;
#pragma omp simd
      for (int e = 0; e < D; ++e) tmp[e] = 0.f + x[e];
      if (rot)
        vec_kernels().rope_row(tmp, rtab->cos_of(r0 + i), rtab->sin_of(r0 + i), 1, D,
                               rope->adjacent);
      f32_to_bf16_n(tmp, g.row(r0 + i) + c0, size_t(D));
    }
  };
  const Heads qh = heads_of(mm, q, s.n_heads, D, "bf16 attention q", in16[0]),
              kh_ = heads_of(mm, k, s.n_kv_heads, D, "bf16 attention k", in16[1]),
              vh = heads_of(mm, v, s.n_kv_heads, D, "bf16 attention v", in16[2]),
              doh = heads_of(mm, dout, s.n_heads, D, "bf16 attention dout", dout16);
  const int nt = int(std::min<int64_t>(max_threads(), ntasks));
  const int64_t tile = bq * int64_t(s.seq), T = s.seq;
  // Per thread: P and dS in fp32 and D (one float per query row); with lp also P and dS in the
  // GEMMs' element type and dense fp32 accumulators of the task's dQ tile and its dK, dV rows
  // (dense C keeps oneDNN on its fast kernels).
  const int64_t lpb = mm.lp ? 2 * tile * int64_t(mm.elem_bytes()) + (bq + 2 * T) * D * 4 : 0;
  const int64_t per = (2 * tile + bq) * 4 + lpb;
  auto thread_body = [&](char* mine, TaskErrors& errs, attn::BwdTileTimes& gt) {
    float* P = reinterpret_cast<float*>(mine);
    float* dS = P + tile;
    float* Dr = dS + tile;
    char* lpm = mine + (2 * tile + bq) * 4;
    void* Pl = mm.lp ? lpm : static_cast<void*>(P);
    void* dSl = mm.lp ? lpm + tile * int64_t(mm.elem_bytes()) : static_cast<void*>(dS);
    float* dQt =
        mm.lp ? reinterpret_cast<float*>(lpm + 2 * tile * int64_t(mm.elem_bytes())) : nullptr;
    float* dKt = mm.lp ? dQt + bq * D : nullptr;
    float* dVt = mm.lp ? dKt + T * D : nullptr;
    std::vector<float> dOr(static_cast<size_t>(D)), Or(out16 ? static_cast<size_t>(D) : 0);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < ntasks; ++task)
      errs.run([&] {
        const int b = int(task / s.n_kv_heads), kh = int(task % s.n_kv_heads);
        const int64_t base = int64_t(b) * s.seq;
        if (mm.lp) {
          std::fill(dKt, dKt + T * D, 0.f);
          std::fill(dVt, dVt + T * D, 0.f);
        }
        for (int h = kh * group; h < (kh + 1) * group; ++h) {
          for (int64_t qb = 0; qb < nqb; ++qb) {
            Tile t = attn::make_tile(s, first, bq, b, h, qb, align);
            const int64_t kw = t.k1 - t.k0;
            tile_probs(s, t, step, mm, qh, kh_, scale, P, lse, nullptr, gt.qk,
                       fused ? static_cast<uint16_t*>(Pl) : nullptr);
            const int64_t qoff = base + t.q0, koff = base + t.k0;
            // dP = dO V^T
            int64_t g0 = gt.dp.start();
            for_stairs(t, step, /*by_column=*/false,
                       [&](int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
                         mm.gemm_tile(true, nr, nc, D, 1.f, doh.at(mm, qoff + r0, h), doh.ld,
                                      vh.at(mm, koff + c0, kh), vh.ld, 0.f, dS + r0 * kw + c0, kw);
                       });
            gt.dp.add(thread_id(), g0);
            // D_i = dO_i . O_i (dO as the GEMMs take it); dS = P (dP - D_i)
            for (int64_t i = 0; i < t.nq; ++i) {
              const float* a = dout.row(qoff + i) + int64_t(h) * D;
              if (dout16) {  // the rounded values as they are, widened
                bf16_to_f32_n(dout16 + (qoff + i) * dout.cols + int64_t(h) * D, dOr.data(),
                              size_t(D));
                a = dOr.data();
              } else if (mm.lp) {
                round_through_n(DType::BF16, a, dOr.data(), size_t(D));
                a = dOr.data();
              }
              const float* o = out.row(qoff + i) + int64_t(h) * D;
              if (out16) {  // the same values, widened (exact), through the same sum below
                bf16_to_f32_n(out16 + (qoff + i) * out.cols + int64_t(h) * D, Or.data(), size_t(D));
                o = Or.data();
              }
              float acc = 0;
#pragma omp simd reduction(+ : acc)
              for (int d = 0; d < D; ++d) acc += a[d] * o[d];
              Dr[i] = acc;
            }
            for (int64_t i = 0; i < t.nq; ++i) {
              const int64_t w = t.row_width(i, step);
              if (fused)
                vec_kernels().softmax_bwd_row_bf16(dS + i * kw, P + i * kw, Dr[i], w,
                                                   static_cast<uint16_t*>(dSl) + i * kw);
              else
                vec_kernels().softmax_bwd_row(dS + i * kw, P + i * kw, Dr[i], w);
              if (s.softcap > 0)
                attn::softcap_bwd_row(dS + i * kw, P + i * kw, lse[int64_t(h) * q.rows + qoff + i],
                                      s.softcap, w);
              if (mm.lp && !fused) {
                mm.convert(P + i * kw, elem_at(mm, Pl, i * kw), size_t(w));
                mm.convert(dS + i * kw, elem_at(mm, dSl, i * kw), size_t(w));
              }
            }
            // dQ += scale dS K over the staircase (lp: into the task's dQ tile, the diagonal
            // steps adding to the first piece's rows; fp32: into dq, zeroed by the caller)
            float* const dqd = mm.lp ? dQt : dq.row(qoff) + int64_t(h) * D;
            const int64_t ldq = mm.lp ? D : dq.stride;
            g0 = gt.dq.start();
            for_stairs(t, step, /*by_column=*/false,
                       [&](int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
                         mm.gemm_tile(false, nr, D, nc, scale, mm.at(dSl, r0 * kw + c0), kw,
                                      kh_.at(mm, koff + c0, kh), kh_.ld,
                                      mm.lp && c0 == 0 ? 0.f : 1.f, dqd + r0 * ldq, ldq);
                       });
            gt.dq.add(thread_id(), g0);
            if (mm.lp) {
              if (rope)
                put16(dq16, qoff, int64_t(h) * D, dQt, t.nq, true, dOr.data());
              else
                add_rows(dq, qoff, int64_t(h) * D, dQt, t.nq, D);
            }
            // dK += scale dS^T Q ; dV += P^T dO, by the staircase's columns
            g0 = gt.dkdv.start();
            for_stairs(
                t, step, /*by_column=*/true, [&](int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
                  const void* qt = qh.at(mm, qoff + r0, h);
                  const void* dot = doh.at(mm, qoff + r0, h);
                  float* dkr = mm.lp ? dKt + (t.k0 + c0) * D : dk.row(koff + c0) + int64_t(kh) * D;
                  float* dvr = mm.lp ? dVt + (t.k0 + c0) * D : dv.row(koff + c0) + int64_t(kh) * D;
                  const int64_t ldk = mm.lp ? D : dk.stride, ldv = mm.lp ? D : dv.stride;
                  mm.gemm(true, false, nc, D, nr, scale, mm.at(dSl, r0 * kw + c0), kw, qt, qh.ld,
                          1.f, dkr, ldk);
                  mm.gemm(true, false, nc, D, nr, 1.f, mm.at(Pl, r0 * kw + c0), kw, dot, doh.ld,
                          1.f, dvr, ldv);
                });
            gt.dkdv.add(thread_id(), g0);
          }
        }
        if (rope) {
          put16(dk16, base, int64_t(kh) * D, dKt, T, true, dOr.data());
          put16(dv16, base, int64_t(kh) * D, dVt, T, false, dOr.data());
        } else if (mm.lp) {
          add_rows(dk, base, int64_t(kh) * D, dKt, T, D);
          add_rows(dv, base, int64_t(kh) * D, dVt, T, D);
        }
      });
  };
  attn::run_tile_team<attn::BwdTileTimes>(*this, nt, size_t(per), "attention backward tiles",
                                          tune.flush_denormals, thread_body);
}

}  // namespace qlft::cpu
