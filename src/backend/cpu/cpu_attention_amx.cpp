// Causal GQA attention at precision bf16 on AMX tiles (CpuTuning::attn_amx; amx_gemm.h).
//
// The same tasks, softmax passes and roundings as cpu_attention.cpp's bf16 path, with the tile
// products on amx_gemm_bf16 over operands packed once per head in the layouts the tiles read:
// Q and dO as rows [Tp, Dp]; K^T and V^T in the pair layout (B of Q K^T and dO V^T); K and V in
// the pair layout (B of dS K and P V); Q^T and dO^T as rows [Dp, Tp] (A of dK^T = Q^T dS and
// dV^T = dO^T P, whose B, dS and P, are paired per tile). Every buffer is padded with zeros to
// the tiles' multiples (rows of 32, head_dim of 32), so padded rows and keys add nothing.
// Causal blocks of 32 x 32 past the diagonal are skipped (AmxCausal). The score scale multiplies
// the scores in the softmax pass, dQ and dK on their way out.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <memory>

#include <immintrin.h>

#include "backend/cpu/amx_gemm.h"
#include "backend/cpu/attention_amx.h"
#include "backend/cpu/attention_tiles.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/vec_kernels.h"
#include "core/fp_env.h"
#include "core/half.h"
#include "core/profile.h"
#include "core/threads.h"

namespace qlft::cpu {

namespace {

using attn::Tile;

// 64-byte aligned pieces of one buffer, in order; with a null base it only counts the bytes.
class Carver {
 public:
  explicit Carver(void* base) : base_(static_cast<char*>(base)) {}
  template <class T>
  T* take(int64_t n) {
    T* p = base_ ? reinterpret_cast<T*>(base_ + off_) : nullptr;
    off_ += (size_t(n) * sizeof(T) + 63) / 64 * 64;
    return p;
  }
  size_t bytes() const { return off_; }

 private:
  char* base_;
  size_t off_ = 0;
};

struct FwdThread {
  float* S;     // scores, [nqp, Kp]; also the packing's staging rows [Tp, Dp] (bf16)
  uint16_t* P;  // probabilities as bf16, [nqp, Kp]
  float* O;     // output tile, [nqp, Dp]
};
FwdThread carve_fwd(const AmxAttnGeometry& g, void* base, size_t* bytes = nullptr) {
  Carver c(base);
  FwdThread t;
  t.S = c.take<float>(std::max(g.nqp * g.Tp, (g.Tp * g.Dp + 1) / 2));
  t.P = c.take<uint16_t>(g.nqp * g.Tp);
  t.O = c.take<float>(g.nqp * g.Dp);
  if (bytes) *bytes = c.bytes();
  return t;
}

struct BwdThread {
  uint16_t *kt, *vt, *kv;  // K^T, V^T (pair layout over head_dim), K (pair layout over keys)
  uint16_t *q, *dout;      // rows [Tp, Dp] (q: also the staging of the K and V packs)
  uint16_t *qt, *doutt;    // [Dp, Tp]
  float *S, *dS, *Dr;      // P and dP / dS in fp32 [nqp, Kp]; D per row
  uint16_t *P16, *dS16;    // bf16 rows [nqp, Kp]
  uint16_t *Pv, *dSv;      // pair layout over query rows [nqp / 2, 2 Kp]
  float *dQt, *dKt, *dVt;  // [nqp, Dp]; [Dp, Tp] each
  float* row;              // a row of Dp (outputs, D's operands)
  float* row2;
};
BwdThread carve_bwd(const AmxAttnGeometry& g, void* base, size_t* bytes = nullptr) {
  Carver c(base);
  BwdThread t;
  const int64_t pack = g.Tp * g.Dp, tile = g.nqp * g.Tp;
  t.kt = c.take<uint16_t>(pack);
  t.vt = c.take<uint16_t>(pack);
  t.kv = c.take<uint16_t>(pack);
  t.q = c.take<uint16_t>(pack);
  t.dout = c.take<uint16_t>(pack);
  t.qt = c.take<uint16_t>(pack);
  t.doutt = c.take<uint16_t>(pack);
  t.S = c.take<float>(tile);
  t.dS = c.take<float>(tile);
  t.Dr = c.take<float>(g.nqp);
  t.P16 = c.take<uint16_t>(tile);
  t.dS16 = c.take<uint16_t>(tile);
  t.Pv = c.take<uint16_t>(tile);
  t.dSv = c.take<uint16_t>(tile);
  t.dQt = c.take<float>(g.nqp * g.Dp);
  t.dKt = c.take<float>(g.Dp * g.Tp);
  t.dVt = c.take<float>(g.Dp * g.Tp);
  t.row = c.take<float>(g.Dp);
  t.row2 = c.take<float>(g.Dp);
  if (bytes) *bytes = c.bytes();
  return t;
}

// Head h of batch element b of m ([rows, heads * D]) as bf16 rows [Tp, Dp], zero-padded: m16's
// bits (row stride m.cols) when given, else m's values rounded.
void pack_rows(CMatF m, const uint16_t* m16, const AttnShape& s, int b, int h, int D,
               const AmxAttnGeometry& g, uint16_t* dst) {
  const int64_t T = s.seq;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t r = int64_t(b) * T + t;
    uint16_t* o = dst + t * g.Dp;
    if (m16)
      std::copy_n(m16 + r * m.cols + int64_t(h) * D, D, o);
    else
      f32_to_bf16_n(m.row(r) + int64_t(h) * D, o, size_t(D));
    std::fill(o + D, o + g.Dp, uint16_t(0));
  }
  std::fill(dst + T * g.Dp, dst + g.Tp * g.Dp, uint16_t(0));
}

// B = src ([rows, cols] bf16, row stride ld; rows even) in the pair layout: dst[(r / 2) 2 cols +
// 2 c + r % 2] = src[r][c] (row pairs interleaved).
void pairs_of_rows(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld, uint16_t* dst) {
  for (int64_t r = 0; r < rows; r += 2) {
    const uint16_t* a = src + r * ld;
    const uint16_t* b = a + ld;
    uint16_t* o = dst + r * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) {
      o[2 * c] = a[c];
      o[2 * c + 1] = b[c];
    }
  }
}

// B = src^T (src [rows, cols] bf16 dense; rows a multiple of 4, cols of 8) in the pair layout:
// pair p of row r (its columns 2p, 2p + 1) at dst[p 2 rows + 2 r], a transpose of 32-bit pairs,
// in 4 x 4 blocks of SSE2 registers (512 x 64 on a Zen 3: 9.8 us, scalar code 21 us).
void pairs_of_cols(const uint16_t* src, int64_t rows, int64_t cols, uint16_t* dst) {
  const int64_t np = cols / 2;
  for (int64_t r = 0; r < rows; r += 4)
    for (int64_t p = 0; p < np; p += 4) {
      __m128 x[4];
      for (int i = 0; i < 4; ++i)
        x[i] = _mm_loadu_ps(reinterpret_cast<const float*>(src + (r + i) * cols + 2 * p));
      _MM_TRANSPOSE4_PS(x[0], x[1], x[2], x[3]);
      for (int i = 0; i < 4; ++i)
        _mm_storeu_ps(reinterpret_cast<float*>(dst + (p + i) * 2 * rows + 2 * r), x[i]);
    }
}

// dst [cols, rows] = src^T (src [rows, cols] dense), in 16 x 16 blocks: 17 us for 512 x 64 on a
// Zen 3, as fast as 8 x 8 blocks of SSE2 shuffles there.
void transpose16(const uint16_t* src, int64_t rows, int64_t cols, uint16_t* dst) {
  constexpr int64_t kB = 16;
  for (int64_t r0 = 0; r0 < rows; r0 += kB)
    for (int64_t c0 = 0; c0 < cols; c0 += kB)
      for (int64_t r = r0; r < std::min(rows, r0 + kB); ++r)
        for (int64_t c = c0; c < std::min(cols, c0 + kB); ++c)
          dst[c * rows + r] = src[r * cols + c];
}

void zero_rows(uint16_t* p, int64_t r0, int64_t r1, int64_t ld) {
  std::fill(p + r0 * ld, p + r1 * ld, uint16_t(0));
}

}  // namespace

AmxAttnGeometry amx_attn_geometry(int batch, int seq, int n_heads, int n_kv_heads, int head_dim,
                                  int64_t block_q) {
  AmxAttnGeometry g;
  const int64_t bq = std::max<int64_t>(1, block_q);
  g.Tp = amx_pad(seq) + (bq % kAmxK ? kAmxK : 0);
  g.Dp = amx_pad(head_dim);
  g.nqp = amx_pad(std::min<int64_t>(bq, seq));
  g.heads = n_heads;
  g.kv_heads = n_kv_heads;
  g.batch = batch;
  g.q_blocks = (seq + bq - 1) / bq;
  return g;
}

int AmxAttnGeometry::fwd_team(int threads) const {
  return int(std::min<int64_t>(threads, batch * std::max(heads * q_blocks, heads + kv_heads)));
}
int AmxAttnGeometry::bwd_team(int threads) const {
  return int(std::min<int64_t>(threads, batch * kv_heads));
}

size_t AmxAttnGeometry::fwd_operands() const {
  return size_t(batch * (heads + 2 * kv_heads) * Tp * Dp) * 2;
}
size_t AmxAttnGeometry::fwd_thread() const {
  size_t n = 0;
  carve_fwd(*this, nullptr, &n);
  return n;
}
size_t AmxAttnGeometry::bwd_thread() const {
  size_t n = 0;
  carve_bwd(*this, nullptr, &n);
  return n;
}

std::optional<AmxExec> attn_amx_exec(const CpuTuning& t, bool bf16) {
  if (!bf16) return std::nullopt;
  if (t.attn_amx == CpuTuning::AttnAmx::Emulated) return AmxExec::Emulated;
  if (t.attn_amx == CpuTuning::AttnAmx::On && amx_hardware()) return AmxExec::Hardware;
  return std::nullopt;
}

void CpuBackend::attention_fwd_amx(const AttnShape& s, CMatF q, CMatF k, CMatF v, MatF out,
                                   float* lse, uint16_t* out16,
                                   const std::array<const uint16_t*, 3>& in16, AmxExec ex) {
  const int D = s.head_dim, H = s.n_heads, KV = s.n_kv_heads;
  const float scale = s.score_scale();
  const int64_t bq = std::max<int64_t>(1, tune.attn_block_q);
  const AmxAttnGeometry g = amx_attn_geometry(s.batch, s.seq, H, KV, D, bq);
  const int64_t nqb = g.q_blocks, ntasks = int64_t(s.batch) * H * nqb;
  const int64_t Tp = g.Tp, Dp = g.Dp, pack = Tp * Dp;
  Buffer first_buf = attn::first_same_doc(*this, s);
  const int32_t* first = first_buf.as<int32_t>();
  Buffer ops = scratch_buffer(g.fwd_operands(), "attention AMX operands");
  uint16_t* const Qp = static_cast<uint16_t*>(ops.data());
  uint16_t* const KTv = Qp + int64_t(s.batch) * H * pack;
  uint16_t* const Vv = KTv + int64_t(s.batch) * KV * pack;
  const int64_t npack = int64_t(s.batch) * (H + KV);
  const int nt = g.fwd_team(qlft::num_threads());
  const size_t per = g.fwd_thread();
  auto thread_body = [&](char* slab, TaskErrors& errs, attn::FwdTileTimes& gt) {
    const FwdThread w = carve_fwd(g, slab);
    // The packs: Q of every head as rows; K^T and V of every KV head in the pair layout.
#pragma omp for schedule(dynamic, 1)
    for (int64_t j = 0; j < npack; ++j)
      errs.run([&] {
        if (j < int64_t(s.batch) * H) {
          pack_rows(q, in16[0], s, int(j / H), int(j % H), D, g, Qp + j * pack);
          return;
        }
        const int64_t bk = j - int64_t(s.batch) * H;
        uint16_t* stage = reinterpret_cast<uint16_t*>(w.S);
        pack_rows(k, in16[1], s, int(bk / KV), int(bk % KV), D, g, stage);
        pairs_of_cols(stage, Tp, Dp, KTv + bk * pack);
        pack_rows(v, in16[2], s, int(bk / KV), int(bk % KV), D, g, stage);
        pairs_of_rows(stage, Tp, Dp, Dp, Vv + bk * pack);
      });
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < ntasks; ++task)
      errs.run([&] {
        // Latest query blocks first: they are the largest, which balances the dynamic schedule.
        const int64_t qb = nqb - 1 - task % nqb, bh = task / nqb;
        const Tile t = attn::make_tile(s, first, bq, int(bh / H), int(bh % H), qb, kAmxK);
        const int64_t nqp = amx_pad(t.nq), Kp = amx_pad(t.k1 - t.k0), d = t.diag();
        const int64_t hb = int64_t(t.b) * H + t.h, kb = int64_t(t.b) * KV + t.kh;
        int64_t g0 = gt.qk.start();
        amx_gemm_bf16(ex, nqp, Kp, Dp, Qp + hb * pack + t.q0 * Dp, Dp, KTv + kb * pack + 2 * t.k0,
                      2 * Tp, w.S, Kp, false, {AmxCausal::ColsUpToRow, d});
        gt.qk.add(attn::thread_id(), g0);
        attn::tile_softmax_rows(s, t, 0, Kp, scale, w.S, Kp, nullptr, lse, w.P);
        zero_rows(w.P, t.nq, nqp, Kp);
        g0 = gt.pv.start();
        amx_gemm_bf16(ex, nqp, Dp, Kp, w.P, Kp, Vv + kb * pack + t.k0 * Dp, 2 * Dp, w.O, Dp, false,
                      {AmxCausal::KUpToRow, d});
        gt.pv.add(attn::thread_id(), g0);
        const int64_t r0 = int64_t(t.b) * s.seq + t.q0;
        for (int64_t i = 0; i < t.nq; ++i) {
          const float* o = w.O + i * Dp;
          if (out16)
            f32_to_bf16_n(o, out16 + (r0 + i) * out.cols + int64_t(t.h) * D, size_t(D));
          else
            std::copy_n(o, D, out.row(r0 + i) + int64_t(t.h) * D);
        }
      });
  };
  attn::run_tile_team<attn::FwdTileTimes>(*this, nt, per, "attention AMX tiles",
                                          tune.flush_denormals, thread_body);
}

void CpuBackend::attention_bwd_amx(const AttnShape& s, CMatF q, CMatF k, CMatF v, CMatF out,
                                   const float* lse, CMatF dout, MatF dq, MatF dk, MatF dv,
                                   const RopeArgs* rope, View2<uint16_t> dq16, View2<uint16_t> dk16,
                                   View2<uint16_t> dv16, const std::array<const uint16_t*, 3>& in16,
                                   const uint16_t* out16, const uint16_t* dout16, AmxExec ex) {
  const int D = s.head_dim, H = s.n_heads, KV = s.n_kv_heads, group = H / KV;
  const float scale = s.score_scale();
  const int64_t bq = std::max<int64_t>(1, tune.attn_block_q);
  const AmxAttnGeometry g = amx_attn_geometry(s.batch, s.seq, H, KV, D, bq);
  const int64_t nqb = g.q_blocks, T = s.seq, Tp = g.Tp, Dp = g.Dp;
  // One task per (batch element, KV head): it alone writes that slice of dk / dv and the dq of
  // its query heads.
  const int64_t ntasks = int64_t(s.batch) * KV;
  Buffer first_buf = attn::first_same_doc(*this, s);
  const int32_t* first = first_buf.as<int32_t>();
  std::unique_ptr<RopeTable> rtab;
  if (rope) rtab = std::make_unique<RopeTable>(*this, rope->pos, q.rows, D, *rope->freqs, true);
  const int nt = g.bwd_team(qlft::num_threads());
  const size_t per = g.bwd_thread();
  auto thread_body = [&](char* slab, TaskErrors& errs, attn::BwdTileTimes& gt) {
    const BwdThread w = carve_bwd(g, slab);
    // Row `row` of a gradient from src (D values) times `mul`: added into the fp32 gradient
    // (zeroed by the caller), or with g16 given rotated back when `rot` and rounded there, as
    // attention_bwd, rope and to_16 would give it.
    auto put = [&](MatF g32, View2<uint16_t> g16, int64_t row, int64_t c0, const float* src,
                   float mul, bool rot) {
      if (!g16.data) {
        float* d = g32.row(row) + c0;
#pragma omp simd
        for (int e = 0; e < D; ++e) d[e] += mul * src[e];
        return;
      }
#pragma omp simd
      for (int e = 0; e < D; ++e) w.row2[e] = 0.f + mul * src[e];
      if (rot)
        vec_kernels().rope_row(w.row2, rtab->cos_of(row), rtab->sin_of(row), 1, D, rope->adjacent);
      f32_to_bf16_n(w.row2, g16.row(row) + c0, size_t(D));
    };
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < ntasks; ++task)
      errs.run([&] {
        const int b = int(task / KV), kh = int(task % KV);
        const int64_t base = int64_t(b) * T;
        pack_rows(k, in16[1], s, b, kh, D, g, w.q);  // (w.q as staging)
        pairs_of_cols(w.q, Tp, Dp, w.kt);
        pairs_of_rows(w.q, Tp, Dp, Dp, w.kv);
        pack_rows(v, in16[2], s, b, kh, D, g, w.q);
        pairs_of_cols(w.q, Tp, Dp, w.vt);
        std::fill(w.dKt, w.dKt + Dp * Tp, 0.f);
        std::fill(w.dVt, w.dVt + Dp * Tp, 0.f);
        for (int h = kh * group; h < (kh + 1) * group; ++h) {
          pack_rows(q, in16[0], s, b, h, D, g, w.q);
          transpose16(w.q, Tp, Dp, w.qt);
          // dO as the GEMMs take it: dout16's bits, or dout rounded
          pack_rows(dout, dout16, s, b, h, D, g, w.dout);
          transpose16(w.dout, Tp, Dp, w.doutt);
          for (int64_t qb = 0; qb < nqb; ++qb) {
            const Tile t = attn::make_tile(s, first, bq, b, h, qb, kAmxK);
            const int64_t nqp = amx_pad(t.nq), Kp = amx_pad(t.k1 - t.k0), d = t.diag();
            // P = exp(scale Q K^T - lse), in fp32 (w.S) and bf16 (w.P16)
            int64_t g0 = gt.qk.start();
            amx_gemm_bf16(ex, nqp, Kp, Dp, w.q + t.q0 * Dp, Dp, w.kt + 2 * t.k0, 2 * Tp, w.S, Kp,
                          false, {AmxCausal::ColsUpToRow, d});
            gt.qk.add(attn::thread_id(), g0);
            attn::tile_softmax_rows(s, t, 0, Kp, scale, w.S, Kp, lse, nullptr, w.P16);
            zero_rows(w.P16, t.nq, nqp, Kp);
            // dP = dO V^T
            g0 = gt.dp.start();
            amx_gemm_bf16(ex, nqp, Kp, Dp, w.dout + t.q0 * Dp, Dp, w.vt + 2 * t.k0, 2 * Tp, w.dS,
                          Kp, false, {AmxCausal::ColsUpToRow, d});
            gt.dp.add(attn::thread_id(), g0);
            // D_i = dO_i . O_i; dS = P (dP - D_i) as bf16 (w.dS16), masked keys 0
            for (int64_t i = 0; i < t.nq; ++i) {
              const int64_t r = base + t.q0 + i;
              bf16_to_f32_n(w.dout + (t.q0 + i) * Dp, w.row, size_t(D));
              const float* o = out.row(r) + int64_t(h) * D;
              if (out16) {  // the same values, widened (exact)
                bf16_to_f32_n(out16 + r * out.cols + int64_t(h) * D, w.row2, size_t(D));
                o = w.row2;
              }
              float acc = 0;
#pragma omp simd reduction(+ : acc)
              for (int e = 0; e < D; ++e) acc += w.row[e] * o[e];
              const int64_t jend = t.q0 + i + 1 - t.k0;
              if (s.softcap > 0) {  // the cap's backward before the rounding
                vec_kernels().softmax_bwd_row(w.dS + i * Kp, w.S + i * Kp, acc, jend);
                attn::softcap_bwd_row(w.dS + i * Kp, w.S + i * Kp, lse[int64_t(h) * q.rows + r],
                                      s.softcap, jend);
                f32_to_bf16_n(w.dS + i * Kp, w.dS16 + i * Kp, size_t(jend));
              } else {
                vec_kernels().softmax_bwd_row_bf16(w.dS + i * Kp, w.S + i * Kp, acc, jend,
                                                   w.dS16 + i * Kp);
              }
              std::fill(w.dS16 + i * Kp + jend, w.dS16 + (i + 1) * Kp, uint16_t(0));
            }
            zero_rows(w.dS16, t.nq, nqp, Kp);
            // dQ = scale dS K
            g0 = gt.dq.start();
            amx_gemm_bf16(ex, nqp, Dp, Kp, w.dS16, Kp, w.kv + t.k0 * Dp, 2 * Dp, w.dQt, Dp, false,
                          {AmxCausal::KUpToRow, d});
            gt.dq.add(attn::thread_id(), g0);
            for (int64_t i = 0; i < t.nq; ++i)
              put(dq, dq16, base + t.q0 + i, int64_t(h) * D, w.dQt + i * Dp, scale, rope);
            // dK^T += Q^T dS, dV^T += dO^T P (scaled on the way out)
            g0 = gt.dkdv.start();
            pairs_of_rows(w.dS16, nqp, Kp, Kp, w.dSv);
            pairs_of_rows(w.P16, nqp, Kp, Kp, w.Pv);
            amx_gemm_bf16(ex, Dp, Kp, nqp, w.qt + t.q0, Tp, w.dSv, 2 * Kp, w.dKt + t.k0, Tp, true,
                          {AmxCausal::KFromCol, d});
            amx_gemm_bf16(ex, Dp, Kp, nqp, w.doutt + t.q0, Tp, w.Pv, 2 * Kp, w.dVt + t.k0, Tp, true,
                          {AmxCausal::KFromCol, d});
            gt.dkdv.add(attn::thread_id(), g0);
          }
        }
        for (int64_t j = 0; j < T; ++j) {
          for (int e = 0; e < D; ++e) w.row[e] = w.dKt[e * Tp + j];
          put(dk, dk16, base + j, int64_t(kh) * D, w.row, scale, rope);
          for (int e = 0; e < D; ++e) w.row[e] = w.dVt[e * Tp + j];
          put(dv, dv16, base + j, int64_t(kh) * D, w.row, 1.f, false);
        }
      });
  };
  attn::run_tile_team<attn::BwdTileTimes>(*this, nt, per, "attention backward AMX tiles",
                                          tune.flush_denormals, thread_body);
}

}  // namespace qlft::cpu
