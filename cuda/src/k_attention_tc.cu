// Flash attention on tensor cores: bf16 q / k / v, fp32 accumulation, through the warp matrix
// API (nvcuda::wmma, 16x16x16 bf16 fragments), which nvcc compiles to mma.sync on sm_80..sm_90
// and the CPU emulator (cuda/emu/include/mma.h) executes exactly.
//
// Tiling: a block is 4 warps; each warp owns 16 rows (queries in the forward and dQ kernels,
// keys in the dK/dV kernel) of the block's 64 and walks the other side in tiles of 64, staged
// in shared memory by the whole block between two barriers. Products are 16x16x16 MMAs over
// head_dim / 16 steps. The layout of an accumulator fragment is unspecified, so everything done
// per row (masks, the online softmax, exp(S - lse), dS) goes through the warp's own
// shared-memory tiles: S is stored, each lane works on row elements, P / dS are written in bf16
// and loaded as matrix_a fragments. The forward's running output O is kept in shared memory too
// (fp32, loaded into an accumulator, P V added, stored), since rescaling it by the online
// softmax's exp(m_old - m_new) is per row; the backward's dK, dV, dQ never rescale and stay in
// accumulator fragments for the whole kernel.
//
// Masks: causal, packed documents, sliding window (attn_mask.cuh), GQA (kv head = head / group);
// scores scaled by AttnArgs::scale and soft-capped (attn_cap; dS times attn_cap_grad). A query tile
// starts its keys at the lowest document start of its rows (AttnArgs::first).
//
// Determinism: dK / dV belong to one block per key tile (it loops over the group's heads and
// every query tile), dQ to one block per query tile of a second kernel that recomputes S and
// dP; each is summed in a fixed order and written with a plain read-modify-write, so no fp32
// atomics and two runs give the same bits. The price is the dQ kernel's two extra products.
#include <cuda_bf16.h>
#include <mma.h>

#include "attn_mask.cuh"
#include "backend/softmax_math.h"
#include "check.h"
#include "core/half.h"
#include "kernels.h"
#include "reduce.cuh"

namespace qlft::cu {

namespace {

using namespace nvcuda;
using bf16 = __nv_bfloat16;
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
// B = X^T of a row-major tile X (rows of X are the columns of B).
using FragBt = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

constexpr int kRows = 64;  // rows a block owns (16 per warp)
constexpr int kTile = 64;  // rows of the other side per shared-memory tile
constexpr int kThreads = 128;
constexpr int LS = kTile + 4;  // fp32 score tiles' leading dimension
constexpr int LP = kTile + 8;  // bf16 P / dS tiles' leading dimension

// The dynamic shared memory's element: 128-byte aligned, so every carved region and fragment
// pointer below meets wmma's 256-bit alignment.
struct alignas(128) SmemLine {
  float f[32];
};

constexpr size_t al(size_t b) {  // fragment pointers need 256-bit alignment; 128 bytes here
  return (b + 127) / 128 * 128;
}

// Shared memory of the three kernels (byte offsets), for head_dim D.
template <int D>
struct Smem {
  static constexpr int LD = D + 8;  // bf16 q / k / v / dout tiles (16-byte multiple, skewed)
  static constexpr int LO = D + 4;  // fp32 [16][D] tiles
  static constexpr size_t tile = al(size_t(kTile) * LD * 2);
  // Forward: Q, K, V tiles; per warp S (fp32), P (bf16), O (fp32).
  static constexpr size_t f_s = 0, f_p = al(16 * LS * 4), f_o = f_p + al(16 * LP * 2);
  static constexpr size_t f_warp = f_o + al(16 * LO * 4);
  static constexpr size_t fwd = (3 * tile + 4 * f_warp + 255) / 256 * 256;
  // Backward: four tiles, lse and delta of the 64 rows; per warp S and dP (fp32), P and dS
  // (bf16), the region reused at the end for the fp32 [16][D] write-outs of dV and dK (two
  // tiles, so writing dK's never waits for dV's reads).
  static constexpr size_t b_rows = 4 * tile, b_warps = b_rows + al(2 * kRows * 4);
  static constexpr size_t b_s = 0, b_dp = al(16 * LS * 4), b_p = 2 * b_dp,
                          b_ds = b_p + al(16 * LP * 2);
  static constexpr size_t b_out = al(16 * LO * 4);
  static constexpr size_t b_warp = b_ds + al(16 * LP * 2) > 2 * b_out ? b_ds + al(16 * LP * 2)
                                                                      : 2 * b_out;
  static constexpr size_t bwd = (b_warps + 4 * b_warp + 255) / 256 * 256;
};

// A backward block's shared memory as Smem<D>'s b_* offsets lay it out: the four bf16 tiles
// (the kernel gives each its role), the 64 rows' lse and delta, and this warp's region with its
// S, dP (fp32), P and dS (bf16) scratch (the region reused at the end for the write-outs).
template <int D>
struct BwdShared {
  uint16_t* tile[4];
  float *lse, *delta;
  char* warp;
  float *S, *dP;
  uint16_t *P, *dS;
  __device__ explicit BwdShared(char* smem) {
    using L = Smem<D>;
    for (int t = 0; t < 4; ++t) tile[t] = reinterpret_cast<uint16_t*>(smem + t * L::tile);
    lse = reinterpret_cast<float*>(smem + L::b_rows);
    delta = lse + kRows;
    warp = smem + L::b_warps + (threadIdx.x >> 5) * L::b_warp;
    S = reinterpret_cast<float*>(warp + L::b_s);
    dP = reinterpret_cast<float*>(warp + L::b_dp);
    P = reinterpret_cast<uint16_t*>(warp + L::b_p);
    dS = reinterpret_cast<uint16_t*>(warp + L::b_ds);
  }
};

__device__ __forceinline__ const bf16* bfp(const uint16_t* p) {
  return reinterpret_cast<const bf16*>(p);
}

// Two bf16 as one 32-bit word, lo at the lower address (little-endian, as both targets are).
__device__ __forceinline__ uint32_t pack2(uint16_t lo, uint16_t hi) {
  return uint32_t(lo) | uint32_t(hi) << 16;
}

// dst[r][0..D) = src row (row0 + t0 + r), columns col..col+D, for r < kTile; zero where
// t0 + r >= limit (rows past the sequence or the tile's end are never read from global memory).
template <int D>
__device__ void stage(uint16_t* dst, const uint16_t* src, int64_t ld, int64_t row0, int t0,
                      int limit, int64_t col) {
  constexpr int W = D / 2;  // 32-bit words per row
  for (int idx = threadIdx.x; idx < kTile * W; idx += kThreads) {
    const int r = idx / W, w = idx - r * W, t = t0 + r;
    uint32_t v = 0;
    if (t < limit) v = reinterpret_cast<const uint32_t*>(src + (row0 + t) * ld + col)[w];
    reinterpret_cast<uint32_t*>(dst + r * (D + 8))[w] = v;
  }
}

// The first key any of rows q0..q0+kRows-1 sees (every thread computes the same value).
__device__ int first_key(const AttnArgs& a, int64_t base, int q0) {
  if (!a.first) return 0;
  int lo = q0;
  for (int r = threadIdx.x & 31; r < kRows; r += 32)
    if (q0 + r < a.seq) lo = min(lo, a.first[base + q0 + r]);
  for (int o = 16; o > 0; o >>= 1) lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
  return lo;
}

// S (fp32, [16][kTile], ld LS) = A B^T: A the warp's 16 rows at `a`, B the kTile rows at `bt`
// (both bf16 tiles [.][D], ld D + 8): the scores of the warp's rows against a tile, stored
// 16 columns at a time (one accumulator live, so the backward's dK / dV keep their registers).
template <int D>
__device__ void scores(const uint16_t* a, const uint16_t* bt, float* S) {
  constexpr int LD = D + 8;
#pragma unroll
  for (int n = 0; n < kTile / 16; ++n) {
    FragC acc;
    wmma::fill_fragment(acc, 0.f);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      FragA fa;
      FragBt fb;
      wmma::load_matrix_sync(fa, bfp(a + 16 * kk), LD);
      wmma::load_matrix_sync(fb, bfp(bt + 16 * n * LD + 16 * kk), LD);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(S + 16 * n, acc, LS, wmma::mem_row_major);
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    k_attn_tc_fwd(AttnArgs a, const uint16_t* q, const uint16_t* k, const uint16_t* v, float* out,
                  uint16_t* out16, float* lse) {
  using L = Smem<D>;
  constexpr int LD = L::LD, LO = L::LO;
  QLFT_DYNAMIC_SHARED(SmemLine, tc_smem);
  char* smem = reinterpret_cast<char*>(tc_smem);
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem);
  uint16_t* Ks = reinterpret_cast<uint16_t*>(smem + L::tile);
  uint16_t* Vs = reinterpret_cast<uint16_t*>(smem + 2 * L::tile);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  char* w = smem + 3 * L::tile + warp * L::f_warp;
  float* Sw = reinterpret_cast<float*>(w + L::f_s);
  uint16_t* Pw = reinterpret_cast<uint16_t*>(w + L::f_p);
  float* Ow = reinterpret_cast<float*>(w + L::f_o);

  const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * kRows;
  const int kh = h / (a.n_heads / a.n_kv_heads);
  const int64_t base = int64_t(b) * a.seq, rows = int64_t(a.batch) * a.seq;
  const float scale = attn_scale(a);
  const int r0 = q0 + 16 * warp;  // this warp's first query
  const bool live = r0 < a.seq;   // warp-uniform

  stage<D>(Qs, q, a.ldq, base, q0, a.seq, int64_t(h) * D);
  for (int i = lane; i < 16 * D; i += 32) Ow[(i / D) * LO + i % D] = 0.f;
  float m[16], l[16];  // each row's running max and sum, the same in every lane
#pragma unroll
  for (int r = 0; r < 16; ++r) m[r] = -INFINITY, l[r] = 0.f;
  const int k_lo = first_key(a, base, q0), k_hi = min(q0 + kRows, a.seq);

  for (int kt = k_lo; kt < k_hi; kt += kTile) {
    __syncthreads();  // the previous K / V tile is no longer read (and Q is staged)
    stage<D>(Ks, k, a.ldk, base, kt, k_hi, int64_t(kh) * D);
    stage<D>(Vs, v, a.ldv, base, kt, k_hi, int64_t(kh) * D);
    __syncthreads();
    if (!live || kt > r0 + 15) continue;  // no key of this tile is visible to the warp

    scores<D>(Qs + 16 * warp * LD, Ks, Sw);
    __syncwarp();
    // Online softmax, row by row: lane c takes keys 2c and 2c + 1 (one 32-bit store of P). P
    // is rounded to bf16 where it enters P V, and l sums the rounded values (so the
    // normalization matches the product).
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const int qi = r0 + r;
      float x[2], tmax = -INFINITY;
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        const int c = 2 * lane + t, kj = kt + c;
        x[t] =
            kj < k_hi && attends(a, base, qi, kj) ? attn_cap(a, Sw[r * LS + c] * scale) : -INFINITY;
        tmax = fmaxf(tmax, x[t]);
      }
      tmax = warp_max(tmax);
      const float m_new = fmaxf(m[r], tmax);
      uint16_t p[2];
#pragma unroll
      for (int t = 0; t < 2; ++t) p[t] = f32_to_bf16(m_new == -INFINITY ? 0.f : expf(x[t] - m_new));
      reinterpret_cast<uint32_t*>(Pw + r * LP)[lane] = pack2(p[0], p[1]);
      const float sum = warp_sum(bf16_to_f32(p[0]) + bf16_to_f32(p[1]));
      const float alpha = m_new == -INFINITY ? 1.f : expf(m[r] - m_new);
      m[r] = m_new;
      l[r] = l[r] * alpha + sum;
      for (int d = lane; d < D; d += 32) Ow[r * LO + d] *= alpha;
    }
    __syncwarp();  // P and the rescaled O are complete
#pragma unroll
    for (int dn = 0; dn < D / 16; ++dn) {
      FragC o;
      wmma::load_matrix_sync(o, Ow + 16 * dn, LO, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        FragA fp;
        FragB fv;
        wmma::load_matrix_sync(fp, bfp(Pw + 16 * kk), LP);
        wmma::load_matrix_sync(fv, bfp(Vs + 16 * kk * LD + 16 * dn), LD);
        wmma::mma_sync(o, fp, fv, o);
      }
      wmma::store_matrix_sync(Ow + 16 * dn, o, LO, wmma::mem_row_major);
    }
    __syncwarp();  // O is stored before the next tile rescales it (or it is written out)
  }
  if (!live) return;
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    const int qi = r0 + r;
    if (qi >= a.seq) break;
    const float inv = 1.f / l[r];  // every row sees at least itself
    const int64_t o = (base + qi) * a.ldo + int64_t(h) * D;
    for (int d = lane; d < D; d += 32) {
      const float y = Ow[r * LO + d] * inv;
      out[o + d] = y;
      if (out16) out16[o + d] = f32_to_bf16(y);
    }
    if (lse && lane == 0) lse[int64_t(h) * rows + base + qi] = m[r] + float(log(double(l[r])));
  }
}

// P and dS of one 16-row x kTile tile, rounded to bf16: element (i, j) of the warp's S / dP
// tiles is query qi(i, j), key kj(i, j); lse / delta indexed by the query's row in the block.
template <bool KeysAreRows>
__device__ void probs(const AttnArgs& a, int64_t base, int row0, int col0, const float* S,
                      const float* dP, const float* lse_s, const float* delta_s, int q_off,
                      float scale, uint16_t* P, uint16_t* dS) {
  constexpr int kPairs = kTile / 2;  // a lane takes two neighbours: one 32-bit store each
  for (int idx = threadIdx.x & 31; idx < 16 * kPairs; idx += 32) {
    const int i = idx / kPairs, j0 = 2 * (idx - i * kPairs);
    uint16_t p[2], ds[2];
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const int j = j0 + t;
      const int qi = KeysAreRows ? col0 + j : row0 + i, kj = KeysAreRows ? row0 + i : col0 + j;
      const int qr = qi - q_off;  // the query's row in lse_s / delta_s
      float pf = 0.f, dsf = 0.f;
      if (attends(a, base, qi, kj)) {
        const float c = attn_cap(a, S[i * LS + j] * scale);
        pf = softmax_prob(c, lse_s[qr]);
        dsf = pf * (dP[i * LS + j] - delta_s[qr]) * attn_cap_grad(a, c);
      }
      p[t] = f32_to_bf16(pf);
      ds[t] = f32_to_bf16(dsf);
    }
    if (P) reinterpret_cast<uint32_t*>(P + i * LP)[j0 / 2] = pack2(p[0], p[1]);
    reinterpret_cast<uint32_t*>(dS + i * LP)[j0 / 2] = pack2(ds[0], ds[1]);
  }
}

// Stores a warp's [16][D] accumulators through `buf` and adds them (times `mul`) into dst rows
// row0.. (those inside the sequence), columns col..col+D. buf's last readers (the S / dP row
// pass) are ordered before by the __syncwarp that follows that pass, and the P / dS fragment
// loads by the MMAs that consume them (mma_sync is executed by the converged warp).
template <int D>
__device__ void add_out(const FragC (&f)[D / 16], float* buf, float* dst, int64_t ld, int64_t base,
                        int row0, int seq, int64_t col, float mul) {
  constexpr int LO = D + 4;
#pragma unroll
  for (int dn = 0; dn < D / 16; ++dn)
    wmma::store_matrix_sync(buf + 16 * dn, f[dn], LO, wmma::mem_row_major);
  __syncwarp();
  for (int idx = threadIdx.x & 31; idx < 16 * D; idx += 32) {
    const int r = idx / D, d = idx - r * D;
    if (row0 + r < seq) dst[(base + row0 + r) * ld + col + d] += buf[r * LO + d] * mul;
  }
}

// add_out's tile written rounded to bf16 into dst16 instead (overwritten: the value 0 + sum
// rounds to).
template <int D>
__device__ void store_out16(const FragC (&f)[D / 16], float* buf, uint16_t* dst16, int64_t ld,
                            int64_t base, int row0, int seq, int64_t col) {
  constexpr int LO = D + 4;
#pragma unroll
  for (int dn = 0; dn < D / 16; ++dn)
    wmma::store_matrix_sync(buf + 16 * dn, f[dn], LO, wmma::mem_row_major);
  __syncwarp();
  for (int idx = threadIdx.x & 31; idx < 16 * D; idx += 32) {
    const int r = idx / D, d = idx - r * D;
    if (row0 + r < seq) dst16[(base + row0 + r) * ld + col + d] = f32_to_bf16(buf[r * LO + d]);
  }
}

// dK, dV: block (key tile, kv head, batch element); warp w owns keys k0 + 16w .. + 15. dv16 not
// null: dV written in bf16 there (dv not touched).
template <int D>
__global__ void __launch_bounds__(kThreads)
    k_attn_tc_bwd_kv(AttnArgs a, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                     const uint16_t* dout, const float* lse, const float* delta, float* dk,
                     float* dv, uint16_t* dv16) {
  using L = Smem<D>;
  constexpr int LD = L::LD;
  QLFT_DYNAMIC_SHARED(SmemLine, tc_smem);
  const BwdShared<D> sm(reinterpret_cast<char*>(tc_smem));
  uint16_t *const Ks = sm.tile[0], *const Vs = sm.tile[1], *const Qs = sm.tile[2],
                  *const dOs = sm.tile[3];
  const int warp = threadIdx.x >> 5;

  const int b = blockIdx.z, kh = blockIdx.y, k0 = blockIdx.x * kRows;
  const int group = a.n_heads / a.n_kv_heads;
  const int64_t base = int64_t(b) * a.seq, rows = int64_t(a.batch) * a.seq;
  const float scale = attn_scale(a);
  const int j0 = k0 + 16 * warp;
  const bool live = j0 < a.seq;

  stage<D>(Ks, k, a.ldk, base, k0, a.seq, int64_t(kh) * D);
  stage<D>(Vs, v, a.ldv, base, k0, a.seq, int64_t(kh) * D);
  FragC dK[D / 16], dV[D / 16];
#pragma unroll
  for (int dn = 0; dn < D / 16; ++dn) {
    wmma::fill_fragment(dK[dn], 0.f);
    wmma::fill_fragment(dV[dn], 0.f);
  }
  for (int h = kh * group; h < (kh + 1) * group; ++h) {
    for (int qt = k0; qt < a.seq; qt += kTile) {  // queries before k0 see none of these keys
      __syncthreads();                            // the previous Q / dO tile is no longer read
      stage<D>(Qs, q, a.ldq, base, qt, a.seq, int64_t(h) * D);
      stage<D>(dOs, dout, a.ldo, base, qt, a.seq, int64_t(h) * D);
      for (int i = threadIdx.x; i < kTile; i += kThreads) {
        const bool in = qt + i < a.seq;
        sm.lse[i] = in ? lse[int64_t(h) * rows + base + qt + i] : 0.f;
        sm.delta[i] = in ? delta[int64_t(h) * rows + base + qt + i] : 0.f;
      }
      __syncthreads();
      if (!live) continue;
      // S^T = K_w Q^T and dP^T = V_w dO^T: [16 keys][kTile queries].
      scores<D>(Ks + 16 * warp * LD, Qs, sm.S);
      scores<D>(Vs + 16 * warp * LD, dOs, sm.dP);
      __syncwarp();
      probs<true>(a, base, j0, qt, sm.S, sm.dP, sm.lse, sm.delta, qt, scale, sm.P, sm.dS);
      __syncwarp();
      // dV += P^T dO, dK += dS^T Q.
#pragma unroll
      for (int dn = 0; dn < D / 16; ++dn) {
#pragma unroll
        for (int kk = 0; kk < kTile / 16; ++kk) {
          FragA fp, fs;
          FragB fo, fq;
          wmma::load_matrix_sync(fp, bfp(sm.P + 16 * kk), LP);
          wmma::load_matrix_sync(fs, bfp(sm.dS + 16 * kk), LP);
          wmma::load_matrix_sync(fo, bfp(dOs + 16 * kk * LD + 16 * dn), LD);
          wmma::load_matrix_sync(fq, bfp(Qs + 16 * kk * LD + 16 * dn), LD);
          wmma::mma_sync(dV[dn], fp, fo, dV[dn]);
          wmma::mma_sync(dK[dn], fs, fq, dK[dn]);
        }
      }
    }
  }
  if (!live) return;
  // This block alone owns these keys of KV head kh: plain read-modify-write.
  if (dv16)
    store_out16<D>(dV, reinterpret_cast<float*>(sm.warp), dv16, a.ldv, base, j0, a.seq,
                   int64_t(kh) * D);
  else
    add_out<D>(dV, reinterpret_cast<float*>(sm.warp), dv, a.ldv, base, j0, a.seq, int64_t(kh) * D,
               1.f);
  add_out<D>(dK, reinterpret_cast<float*>(sm.warp + L::b_out), dk, a.ldk, base, j0, a.seq,
             int64_t(kh) * D, scale);
}

// dQ: block (query tile, head, batch element); warp w owns queries q0 + 16w .. + 15. S and dP
// are recomputed here so that dQ needs no atomics.
template <int D>
__global__ void __launch_bounds__(kThreads)
    k_attn_tc_bwd_q(AttnArgs a, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                    const uint16_t* dout, const float* lse, const float* delta, float* dq) {
  using L = Smem<D>;
  constexpr int LD = L::LD;
  QLFT_DYNAMIC_SHARED(SmemLine, tc_smem);
  const BwdShared<D> sm(reinterpret_cast<char*>(tc_smem));
  uint16_t *const Qs = sm.tile[0], *const dOs = sm.tile[1], *const Ks = sm.tile[2],
                  *const Vs = sm.tile[3];
  const int warp = threadIdx.x >> 5;

  const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * kRows;
  const int kh = h / (a.n_heads / a.n_kv_heads);
  const int64_t base = int64_t(b) * a.seq, rows = int64_t(a.batch) * a.seq;
  const float scale = attn_scale(a);
  const int r0 = q0 + 16 * warp;
  const bool live = r0 < a.seq;

  stage<D>(Qs, q, a.ldq, base, q0, a.seq, int64_t(h) * D);
  stage<D>(dOs, dout, a.ldo, base, q0, a.seq, int64_t(h) * D);
  for (int i = threadIdx.x; i < kRows; i += kThreads) {
    const bool in = q0 + i < a.seq;
    sm.lse[i] = in ? lse[int64_t(h) * rows + base + q0 + i] : 0.f;
    sm.delta[i] = in ? delta[int64_t(h) * rows + base + q0 + i] : 0.f;
  }
  FragC dQ[D / 16];
#pragma unroll
  for (int dn = 0; dn < D / 16; ++dn) wmma::fill_fragment(dQ[dn], 0.f);
  const int k_lo = first_key(a, base, q0), k_hi = min(q0 + kRows, a.seq);
  for (int kt = k_lo; kt < k_hi; kt += kTile) {
    __syncthreads();  // the previous K / V tile is no longer read (and Q, dO, lse are staged)
    stage<D>(Ks, k, a.ldk, base, kt, k_hi, int64_t(kh) * D);
    stage<D>(Vs, v, a.ldv, base, kt, k_hi, int64_t(kh) * D);
    __syncthreads();
    if (!live || kt > r0 + 15) continue;
    scores<D>(Qs + 16 * warp * LD, Ks, sm.S);
    scores<D>(dOs + 16 * warp * LD, Vs, sm.dP);
    __syncwarp();
    probs<false>(a, base, r0, kt, sm.S, sm.dP, sm.lse, sm.delta, q0, scale, nullptr, sm.dS);
    __syncwarp();
    // dQ += dS K.
#pragma unroll
    for (int dn = 0; dn < D / 16; ++dn) {
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        FragA fs;
        FragB fk;
        wmma::load_matrix_sync(fs, bfp(sm.dS + 16 * kk), LP);
        wmma::load_matrix_sync(fk, bfp(Ks + 16 * kk * LD + 16 * dn), LD);
        wmma::mma_sync(dQ[dn], fs, fk, dQ[dn]);
      }
    }
  }
  if (!live) return;
  add_out<D>(dQ, sm.S, dq, a.ldq, base, r0, a.seq, int64_t(h) * D, scale);
}

template <int D>
void fwd_d(const AttnArgs& a, const uint16_t* q, const uint16_t* k, const uint16_t* v, float* out,
           uint16_t* out16, float* lse, cudaStream_t s) {
  constexpr size_t smem = Smem<D>::fwd;
  QLFT_CUDA_CHECK(cudaFuncSetAttribute(k_attn_tc_fwd<D>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  dim3 grid((a.seq + kRows - 1) / kRows, a.n_heads, a.batch);
  launch(k_attn_tc_fwd<D>, grid, kThreads, smem, s, a, q, k, v, out, out16, lse);
}

template <int D>
void bwd_d(const AttnArgs& a, const uint16_t* q, const uint16_t* k, const uint16_t* v,
           const uint16_t* dout16, const float* lse, const float* delta, float* dq, float* dk,
           float* dv, uint16_t* dv16, cudaStream_t s) {
  constexpr size_t smem = Smem<D>::bwd;
  QLFT_CUDA_CHECK(cudaFuncSetAttribute(k_attn_tc_bwd_kv<D>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  QLFT_CUDA_CHECK(cudaFuncSetAttribute(k_attn_tc_bwd_q<D>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  dim3 kv_grid((a.seq + kRows - 1) / kRows, a.n_kv_heads, a.batch);
  launch(k_attn_tc_bwd_kv<D>, kv_grid, kThreads, smem, s, a, q, k, v, dout16, lse, delta, dk, dv,
         dv16);
  dim3 q_grid((a.seq + kRows - 1) / kRows, a.n_heads, a.batch);
  launch(k_attn_tc_bwd_q<D>, q_grid, kThreads, smem, s, a, q, k, v, dout16, lse, delta, dq);
}

void check_tc(const AttnArgs& a) {
  attention_check_args(a);
  QLFT_CHECK_ARG(attention_tc_supported(a.head_dim),
                 "cuda tensor-core attention: head_dim %d is not 64, 80, 96 or 128", a.head_dim);
  QLFT_CHECK_ARG(a.ldq % 8 == 0 && a.ldk % 8 == 0 && a.ldv % 8 == 0 && a.ldo % 8 == 0,
                 "cuda tensor-core attention: leading dimensions must be multiples of 8");
}

// The backward's two kernels for a.head_dim.
void bwd_dispatch(const AttnArgs& a, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                  const uint16_t* dout16, const float* lse, const float* delta, float* dq,
                  float* dk, float* dv, uint16_t* dv16, cudaStream_t s) {
  switch (a.head_dim) {
    case 64:
      return bwd_d<64>(a, q, k, v, dout16, lse, delta, dq, dk, dv, dv16, s);
    case 80:
      return bwd_d<80>(a, q, k, v, dout16, lse, delta, dq, dk, dv, dv16, s);
    case 96:
      return bwd_d<96>(a, q, k, v, dout16, lse, delta, dq, dk, dv, dv16, s);
    default:
      return bwd_d<128>(a, q, k, v, dout16, lse, delta, dq, dk, dv, dv16, s);
  }
}

}  // namespace

bool attention_tc_supported(int head_dim) {
  return head_dim == 64 || head_dim == 80 || head_dim == 96 || head_dim == 128;
}

void attention_tc_fwd(const AttnArgs& a, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                      float* out, uint16_t* out16, float* lse, cudaStream_t s) {
  check_tc(a);
  switch (a.head_dim) {
    case 64:
      return fwd_d<64>(a, q, k, v, out, out16, lse, s);
    case 80:
      return fwd_d<80>(a, q, k, v, out, out16, lse, s);
    case 96:
      return fwd_d<96>(a, q, k, v, out, out16, lse, s);
    default:
      return fwd_d<128>(a, q, k, v, out, out16, lse, s);
  }
}

void attention_tc_bwd(const AttnArgs& a, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                      const float* out, const uint16_t* dout16, const float* lse, float* dq,
                      float* dk, float* dv, float* delta, cudaStream_t s) {
  check_tc(a);
  attention_delta(a, out, dout16, delta, s);
  bwd_dispatch(a, q, k, v, dout16, lse, delta, dq, dk, dv, nullptr, s);
}

void attention_tc_bwd16(const AttnArgs& a, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                        const uint16_t* out16, const uint16_t* dout16, const float* lse, float* dq,
                        float* dk, float* dv, float* delta, cudaStream_t s, uint16_t* dv16) {
  check_tc(a);
  attention_delta16(a, out16, dout16, delta, s);
  bwd_dispatch(a, q, k, v, dout16, lse, delta, dq, dk, dv, dv16, s);
}

}  // namespace qlft::cu
