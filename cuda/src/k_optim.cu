// Optimizer and loss-scaler kernels: torch AdamW, bitsandbytes blockwise 8-bit AdamW (and its
// fp32-state path), gradient sum of squares (global norm), scaling (clipping), non-finite count.
// Per-element math: adamw_math.h and nf4_math.h (blockwise 8-bit decode and LUT index).
#include "check.h"
#include "core/half.h"
#include "kernels.h"
#include "quant/nf4_math.h"
#include "reduce.cuh"

namespace qlft::cu {

namespace {

constexpr int kBnbBlock = 256;  // bnb optimizer blocksize (kAdam8bitBlock)

// p16 (may be null): the updated p rounded to bf16 (the LoRA factors' bf16 copy, written here
// so no conversion kernel sits between the optimizer and the GEMMs that read it).
__global__ void __launch_bounds__(256) k_adamw_torch(float* p, float* m, float* v, const float* g,
                                                     int64_t n, AdamWTorchCoeffs c, uint16_t* p16) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float pi = p[i], mi = m[i], vi = v[i];
    adamw_torch_update(pi, mi, vi, g[i], c);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if (p16) p16[i] = f32_to_bf16(pi);
  }
}

// One CUDA block per 256-element state block: dequantize, update, re-quantize (bnb's order).
__global__ void __launch_bounds__(256)
    k_adamw_bnb8(float* p, uint8_t* q1, uint8_t* q2, float* absmax1, float* absmax2, const float* g,
                 int64_t n, AdamBnbCoeffs c, const float* code1, const float* code2,
                 const uint8_t* lut1, const uint8_t* lut2, unsigned long long* skipped) {
  __shared__ float redf[32];
  __shared__ unsigned long long redu[32];
  const int64_t b = blockIdx.x, e = b * kBnbBlock + threadIdx.x;
  const bool in = e < n;
  float m = 0.f, v = 0.f;
  unsigned long long skip = 0;
  if (in) {
    m = blockwise8_decode(code1, q1[e], absmax1[b]);
    v = blockwise8_decode(code2, q2[e], absmax2[b]);
    float pi = p[e];
    skip = adam_bnb_8bit_update(pi, m, v, g[e], c) ? 0 : 1;
    p[e] = pi;
  }
  const float am1 = block_max(in ? fabsf(m) : 0.f, redf);
  const float am2 = block_max(in ? fabsf(v) : 0.f, redf);
  const unsigned long long sk = block_sum(skip, redu);
  if (in) {
    q1[e] = am1 == 0.f ? uint8_t(0) : lut1[blockwise8_lut_index(m * (1.0f / am1))];
    q2[e] = am2 == 0.f ? uint8_t(0) : lut2[blockwise8_lut_index(v * (1.0f / am2))];
  }
  if (threadIdx.x == 0) {
    absmax1[b] = am1;
    absmax2[b] = am2;
    if (sk && skipped) atomicAdd(skipped, sk);
  }
}

__global__ void __launch_bounds__(256)
    k_adamw_bnb32(float* p, float* m, float* v, const float* g, int64_t n, AdamBnbCoeffs c,
                  unsigned long long* skipped) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float pi = p[i], mi = m[i], vi = v[i];
    if (!adam_bnb_32bit_update(pi, mi, vi, g[i], c) && skipped) atomicAdd(skipped, 1ull);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

__global__ void __launch_bounds__(256) k_sum_squares(const float* g, int64_t n, double* out) {
  __shared__ double red[32];
  double s = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    s += double(g[i]) * g[i];
  s = block_sum(s, red);
  if (threadIdx.x == 0) atomicAdd(out, s);
}

__global__ void __launch_bounds__(256) k_scale(float* g, int64_t n, float f) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    g[i] *= f;
}

__global__ void __launch_bounds__(256)
    k_count_nonfinite(const float* g, int64_t n, unsigned long long* count) {
  __shared__ unsigned long long red[32];
  unsigned long long c = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    c += optim_isfinite(g[i]) ? 0 : 1;
  c = block_sum(c, red);
  if (threadIdx.x == 0 && c) atomicAdd(count, c);
}

}  // namespace

void adamw_torch(float* p, float* m, float* v, const float* g, int64_t n, const AdamWTorchCoeffs& c,
                 cudaStream_t s, uint16_t* p16) {
  launch(k_adamw_torch, grid_for(n, 256), 256, 0, s, p, m, v, g, n, c, p16);
}

void adamw_bnb8(float* p, uint8_t* q1, uint8_t* q2, float* absmax1, float* absmax2, const float* g,
                int64_t n, const AdamBnbCoeffs& c, const float* code1, const float* code2,
                const uint8_t* lut1, const uint8_t* lut2, unsigned long long* skipped,
                cudaStream_t s) {
  const int64_t blocks = (n + kBnbBlock - 1) / kBnbBlock;
  QLFT_CHECK_ARG(blocks < (int64_t(1) << 31), "adamw8bit: %lld blocks exceed the grid",
                 static_cast<long long>(blocks));
  launch(k_adamw_bnb8, dim3(unsigned(blocks)), kBnbBlock, 0, s, p, q1, q2, absmax1, absmax2, g, n,
         c, code1, code2, lut1, lut2, skipped);
}

void adamw_bnb32(float* p, float* m, float* v, const float* g, int64_t n, const AdamBnbCoeffs& c,
                 unsigned long long* skipped, cudaStream_t s) {
  launch(k_adamw_bnb32, grid_for(n, 256), 256, 0, s, p, m, v, g, n, c, skipped);
}

void sum_squares(const float* g, int64_t n, double* out, cudaStream_t s) {
  launch(k_sum_squares, grid_for(n, 256, 1024), 256, 0, s, g, n, out);
}

void scale(float* g, int64_t n, float f, cudaStream_t s) {
  launch(k_scale, grid_for(n, 256), 256, 0, s, g, n, f);
}

void count_nonfinite(const float* g, int64_t n, unsigned long long* count, cudaStream_t s) {
  launch(k_count_nonfinite, grid_for(n, 256, 1024), 256, 0, s, g, n, count);
}

}  // namespace qlft::cu
