// Row-wise and element-wise ops: RMSNorm, RoPE, SwiGLU, with the CPU's per-element math
// (norm_math.h, rope_math.h, activation_math.h). Row sums accumulate in double as on the CPU.
#include "backend/activation_math.h"
#include "backend/norm_math.h"
#include "backend/rope_math.h"
#include "check.h"
#include "kernels.h"
#include "reduce.cuh"

namespace qlft::cu {

namespace {

constexpr int kRowThreads = 256;

__global__ void __launch_bounds__(256)
    k_rmsnorm_fwd(const float* x, const float* w, float eps, float* y, float* rstd, int64_t cols) {
  __shared__ double red[32];
  const float* xr = x + blockIdx.x * cols;
  double ss = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) ss += double(xr[c]) * xr[c];
  ss = block_sum(ss, red);
  const float r = rmsnorm_rstd(ss, long(cols), eps);
  if (rstd && threadIdx.x == 0) rstd[blockIdx.x] = r;
  float* yr = y + blockIdx.x * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = rmsnorm_apply(xr[c], w[c], r);
}

__global__ void __launch_bounds__(256)
    k_rmsnorm_bwd(const float* x, const float* w, const float* rstd, const float* dy, float* dx,
                  int64_t cols) {
  __shared__ double red[32];
  const int64_t off = blockIdx.x * cols;
  const float r = rstd[blockIdx.x];
  double dot = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    dot += double(dy[off + c]) * w[c] * x[off + c];
  dot = block_sum(dot, red);
  const float coef = rmsnorm_bwd_coef(dot, long(cols), r);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    dx[off + c] += rmsnorm_bwd_elem(x[off + c], w[c], dy[off + c], r, coef);
}

// One thread per (row, pair, head).
__global__ void __launch_bounds__(256)
    k_rope(float* x, int64_t ld, const int32_t* pos, const float* inv_freq, float scale,
           int64_t rows, int n_heads, int head_dim, bool adjacent, bool inverse) {
  const int half = head_dim / 2;
  const int64_t total = rows * half * n_heads;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    const int h = int(t % n_heads);
    const int i = int((t / n_heads) % half);
    const int64_t row = t / (int64_t(n_heads) * half);
    const float ang = rope_angle(pos[row], inv_freq[i]);
    // times the table's scale (yarn's attention factor), as the CPU's RopeTable
    float c = cosf(ang) * scale, s = sinf(ang) * scale;
    if (inverse) s = -s;
    const int a = adjacent ? 2 * i : i, b = adjacent ? 2 * i + 1 : i + half;
    float* xh = x + row * ld + int64_t(h) * head_dim;
    float va = xh[a], vb = xh[b];
    rope_rotate_pair(va, vb, c, s);
    xh[a] = va;
    xh[b] = vb;
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
  for (int64_t r0 = 0; r0 < rows; r0 += 65535) {  // grid.x limit of a 1-D row grid
    const int64_t n = rows - r0 < 65535 ? rows - r0 : 65535;
    launch(k_rmsnorm_fwd, dim3(unsigned(n)), kRowThreads, 0, s, x + r0 * cols, w, eps,
           y + r0 * cols, rstd ? rstd + r0 : nullptr, cols);
  }
}

void rmsnorm_bwd(const float* x, const float* w, const float* rstd, const float* dy, float* dx,
                 int64_t rows, int64_t cols, cudaStream_t s) {
  for (int64_t r0 = 0; r0 < rows; r0 += 65535) {
    const int64_t n = rows - r0 < 65535 ? rows - r0 : 65535;
    launch(k_rmsnorm_bwd, dim3(unsigned(n)), kRowThreads, 0, s, x + r0 * cols, w, rstd + r0,
           dy + r0 * cols, dx + r0 * cols, cols);
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
