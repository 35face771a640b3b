// Gemma's pointwise kernels: GeGLU with transformers' gelu_pytorch_tanh (forward and backward)
// and the tanh soft-cap of the final logits (head_logits). The attention cap lives in the
// attention kernels (attn_mask.cuh), the cross-entropy's in k_xent.cu. Grid-stride loops over
// dense [rows * cols] arrays, like SwiGLU's in k_pointwise.cu; the GELU formulas are the CPU
// backend's (backend/activation_math.h).
#include "backend/activation_math.h"
#include "check.h"
#include "kernels.h"

namespace qlft::cu {

namespace {

__global__ void __launch_bounds__(256)
    k_geglu_fwd(const float* g, const float* u, float* o, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    o[i] = gelu_tanh(g[i]) * u[i];
  }
}

__global__ void __launch_bounds__(256)
    k_geglu_bwd(const float* g, const float* u, const float* d, float* dg, float* du, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float a, da;
    gelu_tanh_and_grad(g[i], a, da);
    const float di = d[i];
    dg[i] = di * u[i] * da;
    du[i] = di * a;
  }
}

// x = cap * tanh(x / cap), in place.
__global__ void __launch_bounds__(256) k_softcap(float* x, int64_t n, float cap) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = cap * tanhf(x[i] / cap);
}

}  // namespace

void geglu_fwd(const float* gate, const float* up, float* out, int64_t n, cudaStream_t s) {
  launch(k_geglu_fwd, grid_for(n, 256), 256, 0, s, gate, up, out, n);
}

void geglu_bwd(const float* gate, const float* up, const float* dout, float* dgate, float* dup,
               int64_t n, cudaStream_t s) {
  launch(k_geglu_bwd, grid_for(n, 256), 256, 0, s, gate, up, dout, dgate, dup, n);
}

void softcap(float* x, int64_t n, float cap, cudaStream_t s) {
  launch(k_softcap, grid_for(n, 256), 256, 0, s, x, n, cap);
}

}  // namespace qlft::cu
