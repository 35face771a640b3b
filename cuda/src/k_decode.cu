// Generation's decode kernels: RoPE positions, greedy argmax and attention of a few new rows over
// the KV cache (Backend::attention_decode), so a greedy step keeps everything on the device and
// copies back one int32.
//
// Attention layout: one block per (new row, head), kDecodeWarps warps. Warp w walks the row's
// visible keys w, w + kDecodeWarps, ... one key at a time: each lane holds head dims lane + 32 c
// (c < NC) of q and of its running output, the score is a warp sum, and the warp keeps its own
// online softmax (max, sum) over its keys. The warps' partial states are then merged through
// shared memory (online_softmax_merge, softmax_math.h, both times). Correctness first: a step has
// one query row per head, so the keys are read once and the kernel is bound by reading the cache;
// no tiling beyond that. Scores scaled by DecodeArgs::scale and soft-capped (Gemma 2) as in the
// training kernels.
#include <climits>

#include "backend/softmax_math.h"
#include "check.h"
#include "kernels.h"
#include "reduce.cuh"

namespace qlft::cu {

namespace {

// (Literal launch bounds below: scripts/cuda_resource_usage.sh reads them from the source.)
constexpr int kDecodeWarps = 4;      // __launch_bounds__(128) of k_attn_decode
constexpr int kArgmaxThreads = 256;  // __launch_bounds__(256) of k_argmax
static_assert(kDecodeWarps * 32 == 128, "k_attn_decode's launch bounds");

__global__ void __launch_bounds__(256) k_positions(int32_t* pos, int n, int32_t start) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    pos[i] = start + i;
}

// (v, i) beats (bv, bi) when larger, or equal with a lower index. NaN never beats anything.
__device__ __forceinline__ bool argmax_better(float v, int i, float bv, int bi) {
  return v > bv || (v == bv && i < bi);
}

// One block: each thread walks x[t], x[t + 256], ... and the block reduces in shared memory.
__global__ void __launch_bounds__(256) k_argmax(const float* x, int64_t n, int32_t* out) {
  __shared__ float sv[kArgmaxThreads];
  __shared__ int si[kArgmaxThreads];
  float bv = -INFINITY;
  int bi = INT_MAX;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    if (argmax_better(x[i], int(i), bv, bi)) {
      bv = x[i];
      bi = int(i);
    }
  sv[threadIdx.x] = bv;
  si[threadIdx.x] = bi;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (int(threadIdx.x) < w &&
        argmax_better(sv[threadIdx.x + w], si[threadIdx.x + w], sv[threadIdx.x], si[threadIdx.x])) {
      sv[threadIdx.x] = sv[threadIdx.x + w];
      si[threadIdx.x] = si[threadIdx.x + w];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = si[0] == INT_MAX ? 0 : si[0];  // every value NaN: id 0
}

template <int NC>
__global__ void __launch_bounds__(128)
    k_attn_decode(DecodeArgs a, const float* q, const float* kc, const float* vc, float* out) {
  __shared__ float wm[kDecodeWarps], wl[kDecodeWarps];
  __shared__ float wacc[kDecodeWarps][NC * 32];
  const int i = blockIdx.x, h = blockIdx.y, D = a.head_dim;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t koff = int64_t(h / (a.n_heads / a.n_kv_heads)) * D;
  const float scale = a.scale > 0.f ? a.scale : rsqrtf(float(D));
  const int upto = a.past + i + 1;
  const int from = a.window > 0 ? max(0, upto - a.window) : 0;

  float qr[NC], acc[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    const int d = lane + 32 * c;
    qr[c] = d < D ? q[int64_t(i) * a.ldq + int64_t(h) * D + d] : 0.f;
    acc[c] = 0.f;
  }
  OnlineSoftmax<float> st;  // this warp's keys
  for (int j = from + warp; j < upto; j += kDecodeWarps) {
    const float* kr = kc + int64_t(j) * a.kv_dim + koff;
    const float* vr = vc + int64_t(j) * a.kv_dim + koff;
    float part = 0.f;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int d = lane + 32 * c;
      if (d < D) part += qr[c] * kr[d];
    }
    float s = warp_sum(part) * scale;
    if (a.softcap > 0.f) s = a.softcap * tanhf(s / a.softcap);  // Gemma 2's attention cap
    const float m_old = st.m;
    online_softmax_merge(st, s, 1.f);
    const float a_old = expf(m_old - st.m), p = expf(s - st.m);  // a_old 0 at the first key
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int d = lane + 32 * c;
      acc[c] = acc[c] * a_old + (d < D ? p * vr[d] : 0.f);
    }
  }
  if (lane == 0) {
    wm[warp] = st.m;
    wl[warp] = st.s;
  }
#pragma unroll
  for (int c = 0; c < NC; ++c) wacc[warp][lane + 32 * c] = acc[c];
  __syncthreads();
  if (warp != 0) return;
  // Merge: a warp that saw no key has m = -inf, adds nothing and gets weight exp(-inf) = 0
  // (warp 0 always sees key `from`, so the merged max is finite).
  OnlineSoftmax<float> all;
  for (int w = 0; w < kDecodeWarps; ++w) online_softmax_merge(all, wm[w], wl[w]);
  float wt[kDecodeWarps];
  for (int w = 0; w < kDecodeWarps; ++w) wt[w] = expf(wm[w] - all.m);
  const float inv = 1.f / all.s;
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    const int d = lane + 32 * c;
    if (d >= D) continue;
    float o = 0.f;
    for (int w = 0; w < kDecodeWarps; ++w) o += wacc[w][d] * wt[w];
    out[int64_t(i) * a.ldo + int64_t(h) * D + d] = o * inv;
  }
}

template <int NC>
void decode_nc(const DecodeArgs& a, const float* q, const float* k, const float* v, float* out,
               cudaStream_t s) {
  launch(k_attn_decode<NC>, dim3(unsigned(a.rows), unsigned(a.n_heads)), kDecodeWarps * 32, 0, s, a,
         q, k, v, out);
}

}  // namespace

void positions(int32_t* pos, int n, int32_t start, cudaStream_t s) {
  launch(k_positions, grid_for(n, 256), 256, 0, s, pos, n, start);
}

void argmax(const float* x, int64_t n, int32_t* out, cudaStream_t s) {
  QLFT_CHECK_ARG(n > 0 && n < INT_MAX, "argmax: %lld values", static_cast<long long>(n));
  launch(k_argmax, 1, kArgmaxThreads, 0, s, x, n, out);
}

void attention_decode(const DecodeArgs& a, const float* q, const float* k_cache,
                      const float* v_cache, float* out, cudaStream_t s) {
  QLFT_CHECK_ARG(a.head_dim > 0 && a.head_dim <= kAttnMaxHeadDim,
                 "attention_decode: head_dim %d is outside 1..%d", a.head_dim, kAttnMaxHeadDim);
  QLFT_CHECK_ARG(a.n_heads <= 65535 && a.rows < INT_MAX,
                 "attention_decode: %d heads / %lld rows exceed the grid", a.n_heads,
                 static_cast<long long>(a.rows));
  const int nc = (a.head_dim + 31) / 32;
  if (nc == 1) return decode_nc<1>(a, q, k_cache, v_cache, out, s);
  if (nc == 2) return decode_nc<2>(a, q, k_cache, v_cache, out, s);
  return decode_nc<4>(a, q, k_cache, v_cache, out, s);
}

}  // namespace qlft::cu
