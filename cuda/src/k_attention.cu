// Flash attention forward / backward in fp32: tiled over keys with an online softmax, causal,
// GQA, packed-document masks; the forward saves only the log-sum-exp per (head, row) and the
// backward recomputes probabilities from it (FlashAttention-2 structure: one CUDA block per key
// tile accumulates dK / dV in registers, dQ is accumulated with atomics).
// Scores scaled by AttnArgs::scale and soft-capped (attn_mask.cuh: attn_cap, attn_cap_grad).
//
// Head dims up to 128 (NC = ceil(head_dim / 32) chunks per lane). Register budget per thread is
// small by construction (forward: 4 rows x NC accumulators; backward: 8 keys x NC x 2), so no
// variant spills (see docs/PERFORMANCE.md, "CUDA kernels: resource usage").
// Shared math: online_softmax_merge / online_softmax_lse / softmax_prob (softmax_math.h).
#include "attn_mask.cuh"
#include "backend/softmax_math.h"
#include "check.h"
#include "core/half.h"
#include "kernels.h"
#include "reduce.cuh"

namespace qlft::cu {

namespace {

constexpr int kFwdRows = 16;  // query rows per forward block (4 per warp)
constexpr int kKeys = 32;     // keys per tile (one per lane)
constexpr int kBwdRows = 32;  // query rows per backward inner tile (8 per warp)

template <int NC>
__global__ void __launch_bounds__(128)
    k_attn_fwd(AttnArgs a, const float* q, const float* k, const float* v, float* out, float* lse) {
  QLFT_DYNAMIC_SHARED(float, smem);
  const int D = a.head_dim, Dp = D + 1;
  float* Qs = smem;                // [kFwdRows][Dp], pre-scaled by the scores' scale
  float* Ks = Qs + kFwdRows * Dp;  // [kKeys][Dp]
  float* Vs = Ks + kKeys * Dp;     // [kKeys][Dp]
  __shared__ int k_lo_s;

  const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * kFwdRows;
  const int kh = h / (a.n_heads / a.n_kv_heads);
  const int64_t base = int64_t(b) * a.seq, rows = int64_t(a.batch) * a.seq;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float scale = attn_scale(a);

  for (int idx = threadIdx.x; idx < kFwdRows * D; idx += blockDim.x) {
    const int r = idx / D, d = idx - r * D, qi = q0 + r;
    Qs[r * Dp + d] = qi < a.seq ? q[(base + qi) * a.ldq + int64_t(h) * D + d] * scale : 0.f;
  }
  if (threadIdx.x == 0) {
    int lo = q0;
    for (int r = 0; r < kFwdRows && q0 + r < a.seq; ++r)
      lo = min(lo, a.first ? a.first[base + q0 + r] : 0);
    k_lo_s = lo;
  }
  __syncthreads();
  const int k_lo = k_lo_s, k_hi = min(q0 + kFwdRows, a.seq);

  OnlineSoftmax<float> st[4];
  float acc[4][NC];
#pragma unroll
  for (int rr = 0; rr < 4; ++rr)
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[rr][c] = 0.f;

  for (int kt = k_lo; kt < k_hi; kt += kKeys) {
    __syncthreads();  // the previous tile is no longer read
    for (int idx = threadIdx.x; idx < kKeys * D; idx += blockDim.x) {
      const int j = idx / D, d = idx - j * D, kj = kt + j;
      const bool in = kj < k_hi;
      Ks[j * Dp + d] = in ? k[(base + kj) * a.ldk + int64_t(kh) * D + d] : 0.f;
      Vs[j * Dp + d] = in ? v[(base + kj) * a.ldv + int64_t(kh) * D + d] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      const int r = warp * 4 + rr, qi = q0 + r;
      if (qi >= a.seq) continue;  // warp-uniform
      const int kj = kt + lane;
      const bool ok = kj < k_hi && attends(a, base, qi, kj);
      float s = -INFINITY;
      if (ok) {
        s = 0.f;
        for (int d = 0; d < D; ++d) s += Qs[r * Dp + d] * Ks[lane * Dp + d];
        s = attn_cap(a, s);
      }
      const float tmax = warp_max(s);
      if (tmax == -INFINITY) continue;  // nothing visible in this tile (warp-uniform)
      const float p = ok ? expf(s - tmax) : 0.f;
      const float psum = warp_sum(p);
      const float m_old = st[rr].m;
      online_softmax_merge(st[rr], tmax, psum);
      const float a_old = expf(m_old - st[rr].m);  // 0 for the first visible tile
      const float a_new = expf(tmax - st[rr].m);
      float pv[NC];
#pragma unroll
      for (int c = 0; c < NC; ++c) pv[c] = 0.f;
      for (int j = 0; j < kKeys; ++j) {
        const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          const int d = lane + 32 * c;
          pv[c] += pj * (d < D ? Vs[j * Dp + d] : 0.f);
        }
      }
#pragma unroll
      for (int c = 0; c < NC; ++c) acc[rr][c] = acc[rr][c] * a_old + a_new * pv[c];
    }
  }

#pragma unroll
  for (int rr = 0; rr < 4; ++rr) {
    const int qi = q0 + warp * 4 + rr;
    if (qi >= a.seq) continue;
    const float inv = 1.f / st[rr].s;  // every row sees at least itself
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int d = lane + 32 * c;
      if (d < D) out[(base + qi) * a.ldo + int64_t(h) * D + d] = acc[rr][c] * inv;
    }
    if (lse && lane == 0) lse[int64_t(h) * rows + base + qi] = online_softmax_lse(st[rr]);
  }
}

__device__ inline float attn_load(const float* p, int64_t i) {
  return p[i];
}
__device__ inline float attn_load(const uint16_t* p, int64_t i) {  // bf16
  return bf16_to_f32(p[i]);
}

// delta[h * rows + row] = dout_row . out_row for head h: one warp per (row, head), grid-stride
// over the warps (whole warps leave the loop together). TO / TG: float, or uint16_t for bf16
// out / dout (the runner's stored copies, or dout's bf16 copy: their values, widened).
template <class TO, class TG>
__global__ void __launch_bounds__(256)
    k_attn_delta(AttnArgs a, const TO* out, const TG* dout, float* delta) {
  const int64_t rows = int64_t(a.batch) * a.seq;
  const int lane = threadIdx.x & 31;
  for (int64_t w = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5; w < rows * a.n_heads;
       w += (int64_t(gridDim.x) * blockDim.x) >> 5) {
    const int h = int(w / rows);
    const int64_t row = w - int64_t(h) * rows;
    const TO* o = out + row * a.ldo + int64_t(h) * a.head_dim;
    const TG* g = dout + row * a.ldo + int64_t(h) * a.head_dim;
    float s = 0.f;
    for (int d = lane; d < a.head_dim; d += 32) s += attn_load(o, d) * attn_load(g, d);
    s = warp_sum(s);
    if (lane == 0) delta[w] = s;
  }
}

template <int NC>
__global__ void __launch_bounds__(128)
    k_attn_bwd(AttnArgs a, const float* q, const float* k, const float* v, const float* lse,
               const float* delta, const float* dout, float* dq, float* dk, float* dv) {
  QLFT_DYNAMIC_SHARED(float, smem);
  const int D = a.head_dim, Dp = D + 1;
  float* Ks = smem;                 // [kKeys][Dp]
  float* Vs = Ks + kKeys * Dp;      // [kKeys][Dp]
  float* Qs = Vs + kKeys * Dp;      // [kBwdRows][Dp]
  float* dOs = Qs + kBwdRows * Dp;  // [kBwdRows][Dp]
  float* Ps = dOs + kBwdRows * Dp;  // [kBwdRows][kKeys + 1]
  float* dSs = Ps + kBwdRows * (kKeys + 1);
  __shared__ float lse_s[kBwdRows], delta_s[kBwdRows];

  const int b = blockIdx.z, kh = blockIdx.y, k0 = blockIdx.x * kKeys;
  const int group = a.n_heads / a.n_kv_heads;
  const int64_t base = int64_t(b) * a.seq, rows = int64_t(a.batch) * a.seq;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float scale = attn_scale(a);

  for (int idx = threadIdx.x; idx < kKeys * D; idx += blockDim.x) {
    const int j = idx / D, d = idx - j * D, kj = k0 + j;
    const bool in = kj < a.seq;
    Ks[j * Dp + d] = in ? k[(base + kj) * a.ldk + int64_t(kh) * D + d] : 0.f;
    Vs[j * Dp + d] = in ? v[(base + kj) * a.ldv + int64_t(kh) * D + d] : 0.f;
  }

  float dK[8][NC], dV[8][NC];
#pragma unroll
  for (int jj = 0; jj < 8; ++jj)
#pragma unroll
    for (int c = 0; c < NC; ++c) dK[jj][c] = dV[jj][c] = 0.f;

  for (int h = kh * group; h < (kh + 1) * group; ++h) {
    for (int qt = k0; qt < a.seq; qt += kBwdRows) {  // queries before k0 see none of these keys
      __syncthreads();
      for (int idx = threadIdx.x; idx < kBwdRows * D; idx += blockDim.x) {
        const int r = idx / D, d = idx - r * D, qi = qt + r;
        const bool in = qi < a.seq;
        Qs[r * Dp + d] = in ? q[(base + qi) * a.ldq + int64_t(h) * D + d] : 0.f;
        dOs[r * Dp + d] = in ? dout[(base + qi) * a.ldo + int64_t(h) * D + d] : 0.f;
      }
      if (threadIdx.x < kBwdRows) {
        const int qi = qt + threadIdx.x;
        const bool in = qi < a.seq;
        lse_s[threadIdx.x] = in ? lse[int64_t(h) * rows + base + qi] : 0.f;
        delta_s[threadIdx.x] = in ? delta[int64_t(h) * rows + base + qi] : 0.f;
      }
      __syncthreads();
      // P and dS: warp w takes query rows 8w..8w+7, lane j key k0 + j.
#pragma unroll 1
      for (int ii = 0; ii < 8; ++ii) {
        const int i = warp * 8 + ii, qi = qt + i, kj = k0 + lane;
        float p = 0.f, ds = 0.f;
        if (attends(a, base, qi, kj)) {
          float s = 0.f, dp = 0.f;
          for (int d = 0; d < D; ++d) {
            s += Qs[i * Dp + d] * Ks[lane * Dp + d];
            dp += dOs[i * Dp + d] * Vs[lane * Dp + d];
          }
          const float c = attn_cap(a, s * scale);
          p = softmax_prob(c, lse_s[i]);
          ds = p * (dp - delta_s[i]) * attn_cap_grad(a, c);
        }
        if (a.round_bf16) {
          p = bf16_to_f32(f32_to_bf16(p));
          ds = bf16_to_f32(f32_to_bf16(ds));
        }
        Ps[i * (kKeys + 1) + lane] = p;
        dSs[i * (kKeys + 1) + lane] = ds;
      }
      __syncthreads();
      // dV[j] += sum_i P[i][j] dO[i]; dK[j] += sum_i dS[i][j] Q[i] (scaled at the end):
      // warp w owns keys 8w..8w+7, lane d the dims lane + 32c.
      for (int i = 0; i < kBwdRows; ++i) {
        float qd[NC], od[NC];
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          const int d = lane + 32 * c;
          qd[c] = d < D ? Qs[i * Dp + d] : 0.f;
          od[c] = d < D ? dOs[i * Dp + d] : 0.f;
        }
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          const int j = warp * 8 + jj;
          const float pij = Ps[i * (kKeys + 1) + j], dsij = dSs[i * (kKeys + 1) + j];
#pragma unroll
          for (int c = 0; c < NC; ++c) {
            dV[jj][c] += pij * od[c];
            dK[jj][c] += dsij * qd[c];
          }
        }
      }
      // dQ[i] += scale * sum_j dS[i][j] K[j]: warp w owns query rows 8w..8w+7.
#pragma unroll 1
      for (int ii = 0; ii < 8; ++ii) {
        const int i = warp * 8 + ii, qi = qt + i;
        if (qi >= a.seq) break;
        float g[NC];
#pragma unroll
        for (int c = 0; c < NC; ++c) g[c] = 0.f;
        for (int j = 0; j < kKeys; ++j) {
          const float dsij = dSs[i * (kKeys + 1) + j];
#pragma unroll
          for (int c = 0; c < NC; ++c) {
            const int d = lane + 32 * c;
            g[c] += dsij * (d < D ? Ks[j * Dp + d] : 0.f);
          }
        }
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          const int d = lane + 32 * c;
          if (d < D && g[c] != 0.f)
            atomicAdd(dq + (base + qi) * a.ldq + int64_t(h) * D + d, g[c] * scale);
        }
      }
    }
  }
  // This block alone owns keys k0..k0+31 of KV head kh: plain read-modify-write.
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
    const int kj = k0 + warp * 8 + jj;
    if (kj >= a.seq) continue;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int d = lane + 32 * c;
      if (d >= D) continue;
      dk[(base + kj) * a.ldk + int64_t(kh) * D + d] += dK[jj][c] * scale;
      dv[(base + kj) * a.ldv + int64_t(kh) * D + d] += dV[jj][c];
    }
  }
}

size_t fwd_smem(int D) {
  return size_t(kFwdRows + 2 * kKeys) * (D + 1) * sizeof(float);
}
size_t bwd_smem(int D) {
  return (size_t(2 * kKeys + 2 * kBwdRows) * (D + 1) + size_t(2 * kBwdRows) * (kKeys + 1)) *
         sizeof(float);
}

template <int NC>
void fwd_nc(const AttnArgs& a, const float* q, const float* k, const float* v, float* out,
            float* lse, cudaStream_t s) {
  const size_t smem = fwd_smem(a.head_dim);
  QLFT_CUDA_CHECK(
      cudaFuncSetAttribute(k_attn_fwd<NC>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  dim3 grid((a.seq + kFwdRows - 1) / kFwdRows, a.n_heads, a.batch);
  launch(k_attn_fwd<NC>, grid, 128, smem, s, a, q, k, v, out, lse);
}

template <int NC>
void bwd_nc(const AttnArgs& a, const float* q, const float* k, const float* v, const float* lse,
            const float* delta, const float* dout, float* dq, float* dk, float* dv,
            cudaStream_t s) {
  const size_t smem = bwd_smem(a.head_dim);
  QLFT_CUDA_CHECK(
      cudaFuncSetAttribute(k_attn_bwd<NC>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  dim3 grid((a.seq + kKeys - 1) / kKeys, a.n_kv_heads, a.batch);
  launch(k_attn_bwd<NC>, grid, 128, smem, s, a, q, k, v, lse, delta, dout, dq, dk, dv);
}

}  // namespace

void attention_check_args(const AttnArgs& a) {
  QLFT_CHECK_ARG(a.head_dim > 0 && a.head_dim <= kAttnMaxHeadDim,
                 "cuda attention: head_dim %d is not supported (1..%d)", a.head_dim,
                 kAttnMaxHeadDim);
  QLFT_CHECK_ARG(a.batch > 0 && a.seq > 0 && a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0,
                 "cuda attention: bad shape (batch %d, seq %d, heads %d/%d)", a.batch, a.seq,
                 a.n_heads, a.n_kv_heads);
  QLFT_CHECK_ARG(a.batch <= 65535 && a.n_heads <= 65535,
                 "cuda attention: batch %d or heads %d beyond the grid limit", a.batch, a.n_heads);
}

namespace {

// first[row] = the first position t' of batch element b whose document id equals row's (the
// start of its document when documents are contiguous, as packing makes them).
__global__ void __launch_bounds__(256)
    k_doc_first(const int32_t* doc, int batch, int seq, int32_t* first) {
  const int64_t rows = int64_t(batch) * seq;
  for (int64_t row = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; row < rows;
       row += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b0 = row / seq * seq;
    const int32_t d = doc[row];
    int32_t f = int32_t(row - b0);
    for (int64_t t = 0; t < row - b0; ++t)
      if (doc[b0 + t] == d) {
        f = int32_t(t);
        break;
      }
    first[row] = f;
  }
}

}  // namespace

void doc_first(const int32_t* doc, int batch, int seq, int32_t* first, cudaStream_t s) {
  launch(k_doc_first, grid_for(int64_t(batch) * seq, 256), 256, 0, s, doc, batch, seq, first);
}

void attention_delta(const AttnArgs& a, const float* out, const float* dout, float* delta,
                     cudaStream_t s) {
  const int64_t warps = int64_t(a.batch) * a.seq * a.n_heads;
  launch(k_attn_delta<float, float>, grid_for(warps * 32, 256, int64_t(1) << 31), 256, 0, s, a, out,
         dout, delta);
}

void attention_delta(const AttnArgs& a, const float* out, const uint16_t* dout16, float* delta,
                     cudaStream_t s) {
  const int64_t warps = int64_t(a.batch) * a.seq * a.n_heads;
  launch(k_attn_delta<float, uint16_t>, grid_for(warps * 32, 256, int64_t(1) << 31), 256, 0, s, a,
         out, dout16, delta);
}

void attention_delta16(const AttnArgs& a, const uint16_t* out16, const uint16_t* dout16,
                       float* delta, cudaStream_t s) {
  const int64_t warps = int64_t(a.batch) * a.seq * a.n_heads;
  launch(k_attn_delta<uint16_t, uint16_t>, grid_for(warps * 32, 256, int64_t(1) << 31), 256, 0, s,
         a, out16, dout16, delta);
}

void attention_fwd(const AttnArgs& a, const float* q, const float* k, const float* v, float* out,
                   float* lse, cudaStream_t s) {
  attention_check_args(a);
  const int nc = (a.head_dim + 31) / 32;
  if (nc == 1) return fwd_nc<1>(a, q, k, v, out, lse, s);
  if (nc == 2) return fwd_nc<2>(a, q, k, v, out, lse, s);
  return fwd_nc<4>(a, q, k, v, out, lse, s);
}

void attention_bwd(const AttnArgs& a, const float* q, const float* k, const float* v,
                   const float* out, const float* lse, const float* dout, float* dq, float* dk,
                   float* dv, float* delta, cudaStream_t s) {
  attention_check_args(a);
  attention_delta(a, out, dout, delta, s);
  const int nc = (a.head_dim + 31) / 32;
  if (nc == 1) return bwd_nc<1>(a, q, k, v, lse, delta, dout, dq, dk, dv, s);
  if (nc == 2) return bwd_nc<2>(a, q, k, v, lse, delta, dout, dq, dk, dv, s);
  return bwd_nc<4>(a, q, k, v, lse, delta, dout, dq, dk, dv, s);
}

}  // namespace qlft::cu
