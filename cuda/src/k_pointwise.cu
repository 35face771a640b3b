// Row-wise and element-wise ops: RMSNorm, RoPE, SwiGLU, with the CPU's per-element math
// (norm_math.h, rope_math.h, activation_math.h). Row sums accumulate in double as on the CPU.
#include "backend/activation_math.h"
#include "backend/norm_math.h"
#include "backend/rope_math.h"
#include "check.h"
#include "core/half.h"
#include "kernels.h"
#include "reduce.cuh"

namespace qlft::cu {

namespace {

constexpr int kRowThreads = 256;

// One block per row. res given: x += res first (written back; each thread adds and then reads
// its own columns). y (fp32) and y16 (bf16, the next GEMM's operand) each where not null.
__global__ void __launch_bounds__(256)
    k_rmsnorm_fwd(float* x, const float* res, const float* w, float eps, float* y, uint16_t* y16,
                  float* rstd, int64_t cols) {
  __shared__ double red[32];
  float* xr = x + blockIdx.x * cols;
  if (res) {
    const float* rr = res + blockIdx.x * cols;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) xr[c] += rr[c];
  }
  double ss = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) ss += double(xr[c]) * xr[c];
  ss = block_sum(ss, red);
  const float r = rmsnorm_rstd(ss, long(cols), eps);
  if (rstd && threadIdx.x == 0) rstd[blockIdx.x] = r;
  const int64_t o = blockIdx.x * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = rmsnorm_apply(xr[c], w[c], r);
    if (y) y[o + c] = v;
    if (y16) y16[o + c] = f32_to_bf16(v);
  }
}

__global__ void __launch_bounds__(256)
    k_rmsnorm_bwd(const float* x, const float* w, const float* rstd, const float* dy, float* dx,
                  uint16_t* dx16, int64_t cols) {
  __shared__ double red[32];
  const int64_t off = blockIdx.x * cols;
  const float r = rstd[blockIdx.x];
  double dot = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    dot += double(dy[off + c]) * w[c] * x[off + c];
  dot = block_sum(dot, red);
  const float coef = rmsnorm_bwd_coef(dot, long(cols), r);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = dx[off + c] + rmsnorm_bwd_elem(x[off + c], w[c], dy[off + c], r, coef);
    dx[off + c] = v;
    if (dx16) dx16[off + c] = f32_to_bf16(v);  // the next GEMM's dy (rmsnorm_bwd16)
  }
}

// Element t of the RoPE kernels' (row, pair, head) walk: its row, the offset of its head in the
// row, the pair's two columns in the head, and the rotation (cos, sin) of its position.
struct RopePair {
  int64_t row, head_off;
  int a, b;
  float c, s;
};
__device__ inline RopePair rope_pair(int64_t t, const int32_t* pos, const float* inv_freq,
                                     float scale, int n_heads, int head_dim, bool adjacent,
                                     bool inverse) {
  const int half = head_dim / 2;
  RopePair p;
  const int h = int(t % n_heads);
  const int i = int((t / n_heads) % half);
  p.row = t / (int64_t(n_heads) * half);
  p.head_off = int64_t(h) * head_dim;
  const float ang = rope_angle(pos[p.row], inv_freq[i]);
  // times the table's scale (yarn's attention factor), as the CPU's RopeTable
  p.c = cosf(ang) * scale;
  p.s = sinf(ang) * scale;
  if (inverse) p.s = -p.s;
  p.a = adjacent ? 2 * i : i;
  p.b = adjacent ? 2 * i + 1 : i + half;
  return p;
}

// One thread per (row, pair, head).
__global__ void __launch_bounds__(256)
    k_rope(float* x, int64_t ld, const int32_t* pos, const float* inv_freq, float scale,
           int64_t rows, int n_heads, int head_dim, bool adjacent, bool inverse) {
  const int64_t total = rows * (head_dim / 2) * n_heads;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    const RopePair p = rope_pair(t, pos, inv_freq, scale, n_heads, head_dim, adjacent, inverse);
    float* xh = x + p.row * ld + p.head_off;
    float va = xh[p.a], vb = xh[p.b];
    rope_rotate_pair(va, vb, p.c, p.s);
    xh[p.a] = va;
    xh[p.b] = vb;
  }
}

// RoPE of x (fp32, row stride ld) written rotated to bf16 x16 (row stride ld16); x unchanged:
// the runner's q / k (forward) and dq / dk (inverse, backward) for the next GEMM or attention.
__global__ void __launch_bounds__(256)
    k_rope16(const float* x, int64_t ld, uint16_t* x16, int64_t ld16, const int32_t* pos,
             const float* inv_freq, float scale, int64_t rows, int n_heads, int head_dim,
             bool adjacent, bool inverse) {
  const int64_t total = rows * (head_dim / 2) * n_heads;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    const RopePair p = rope_pair(t, pos, inv_freq, scale, n_heads, head_dim, adjacent, inverse);
    const float* xh = x + p.row * ld + p.head_off;
    uint16_t* yh = x16 + p.row * ld16 + p.head_off;
    float va = xh[p.a], vb = xh[p.b];
    rope_rotate_pair(va, vb, p.c, p.s);
    yh[p.a] = f32_to_bf16(va);
    yh[p.b] = f32_to_bf16(vb);
  }
}

// SwiGLU of bf16 gate / up, its output bf16 (the down projection's operand).
__global__ void __launch_bounds__(256)
    k_swiglu_fwd16(const uint16_t* g16, const uint16_t* u16, uint16_t* o16, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float g = bf16_to_f32(g16[i]), u = bf16_to_f32(u16[i]);
    o16[i] = f32_to_bf16(swiglu_from_sigmoid(g, u, sigmoidf_(g)));
  }
}

// SwiGLU's backward from bf16 gate / up and fp32 dout (row stride ldd), dgate / dup written
// bf16 (row stride ld16): the gate / up projections' dy.
__global__ void __launch_bounds__(256)
    k_swiglu_bwd16(const uint16_t* g16, const uint16_t* u16, const float* d, int64_t ldd,
                   uint16_t* dg16, uint16_t* du16, int64_t ld16, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    const float g = bf16_to_f32(g16[i]), u = bf16_to_f32(u16[i]);
    float a, b;
    swiglu_bwd_from_sigmoid(g, u, d[r * ldd + c], sigmoidf_(g), a, b);
    dg16[r * ld16 + c] = f32_to_bf16(a);
    du16[r * ld16 + c] = f32_to_bf16(b);
  }
}

__global__ void __launch_bounds__(256)
    k_swiglu_fwd(const float* g, const float* u, float* o, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    o[i] = swiglu_from_sigmoid(g[i], u[i], sigmoidf_(g[i]));
}

__global__ void __launch_bounds__(256)
    k_swiglu_bwd(const float* g, const float* u, const float* d, float* dg, float* du, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float a, b;
    swiglu_bwd_from_sigmoid(g[i], u[i], d[i], sigmoidf_(g[i]), a, b);
    dg[i] = a;
    du[i] = b;
  }
}

}  // namespace

void rmsnorm_fwd(const float* x, const float* w, float eps, float* y, float* rstd, int64_t rows,
                 int64_t cols, cudaStream_t s) {
  // (x is written only with a residual, which this form has not)
  rmsnorm_fwd16(const_cast<float*>(x), nullptr, w, eps, y, nullptr, rstd, rows, cols, s);
}

void rmsnorm_fwd16(float* x, const float* res, const float* w, float eps, float* y, uint16_t* y16,
                   float* rstd, int64_t rows, int64_t cols, cudaStream_t s) {
  for (int64_t r0 = 0; r0 < rows; r0 += 65535) {  // grid.x limit of a 1-D row grid
    const int64_t n = rows - r0 < 65535 ? rows - r0 : 65535;
    launch(k_rmsnorm_fwd, dim3(unsigned(n)), kRowThreads, 0, s, x + r0 * cols,
           res ? res + r0 * cols : nullptr, w, eps, y ? y + r0 * cols : nullptr,
           y16 ? y16 + r0 * cols : nullptr, rstd ? rstd + r0 : nullptr, cols);
  }
}

void rope16(const float* x, int64_t ld, uint16_t* x16, int64_t ld16, const int32_t* pos,
            const float* inv_freq, float scale, int64_t rows, int n_heads, int head_dim,
            bool adjacent, bool inverse, cudaStream_t s) {
  const int64_t total = rows * (head_dim / 2) * n_heads;
  launch(k_rope16, grid_for(total, 256), 256, 0, s, x, ld, x16, ld16, pos, inv_freq, scale, rows,
         n_heads, head_dim, adjacent, inverse);
}

void swiglu_fwd16(const uint16_t* g16, const uint16_t* u16, uint16_t* o16, int64_t n,
                  cudaStream_t s) {
  launch(k_swiglu_fwd16, grid_for(n, 256), 256, 0, s, g16, u16, o16, n);
}

void swiglu_bwd16(const uint16_t* g16, const uint16_t* u16, const float* dout, int64_t ldd,
                  uint16_t* dg16, uint16_t* du16, int64_t ld16, int64_t rows, int64_t cols,
                  cudaStream_t s) {
  launch(k_swiglu_bwd16, grid_for(rows * cols, 256), 256, 0, s, g16, u16, dout, ldd, dg16, du16,
         ld16, rows, cols);
}

void rmsnorm_bwd(const float* x, const float* w, const float* rstd, const float* dy, float* dx,
                 int64_t rows, int64_t cols, cudaStream_t s) {
  rmsnorm_bwd16(x, w, rstd, dy, dx, nullptr, rows, cols, s);
}

void rmsnorm_bwd16(const float* x, const float* w, const float* rstd, const float* dy, float* dx,
                   uint16_t* dx16, int64_t rows, int64_t cols, cudaStream_t s) {
  for (int64_t r0 = 0; r0 < rows; r0 += 65535) {
    const int64_t n = rows - r0 < 65535 ? rows - r0 : 65535;
    launch(k_rmsnorm_bwd, dim3(unsigned(n)), kRowThreads, 0, s, x + r0 * cols, w, rstd + r0,
           dy + r0 * cols, dx + r0 * cols, dx16 ? dx16 + r0 * cols : nullptr, cols);
  }
}

void rope(float* x, int64_t ld, const int32_t* pos, const float* inv_freq, float scale,
          int64_t rows, int n_heads, int head_dim, bool adjacent, bool inverse, cudaStream_t s) {
  const int64_t total = rows * (head_dim / 2) * n_heads;
  launch(k_rope, grid_for(total, 256), 256, 0, s, x, ld, pos, inv_freq, scale, rows, n_heads,
         head_dim, adjacent, inverse);
}

void swiglu_fwd(const float* gate, const float* up, float* out, int64_t n, cudaStream_t s) {
  launch(k_swiglu_fwd, grid_for(n, 256), 256, 0, s, gate, up, out, n);
}

void swiglu_bwd(const float* gate, const float* up, const float* dout, float* dgate, float* dup,
                int64_t n, cudaStream_t s) {
  launch(k_swiglu_bwd, grid_for(n, 256), 256, 0, s, gate, up, dout, dgate, dup, n);
}

}  // namespace qlft::cu
