// Cross-entropy over row chunks of logits panels (the fused linear + cross-entropy head: the
// logits of a [rows, panel] tile come from a GEMM, these kernels turn them into the online
// log-sum-exp state, the loss terms and the gradient in place). Shared math: softmax_math.h.
#include "backend/softmax_math.h"
#include "core/half.h"
#include "check.h"
#include "kernels.h"
#include "reduce.cuh"

namespace qlft::cu {

namespace {

// Gemma 2's final logit soft-cap, cap * tanh(x / cap), applied to each logit as it is read (the
// panel is recomputed by the gradient pass, so nothing capped is kept); cap 0: x as it is.
__device__ __forceinline__ float ce_cap(float x, float cap) {
  return cap > 0.f ? cap * tanhf(x / cap) : x;
}

// One block per row (grid-stride over rows): the panel's max and sum of exp(x - max) merged into
// the row's running state; the first panel (p0 == 0) starts the state.
__global__ void __launch_bounds__(256)
    k_ce_merge(const float* logits, int64_t rc, int64_t n, int64_t p0, const int32_t* targets,
               float* m, double* sum, float* target_logit, float cap) {
  __shared__ float redf[32];
  __shared__ double redd[32];
  for (int64_t row = blockIdx.x; row < rc; row += gridDim.x) {
    const float* l = logits + row * n;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = fmaxf(mx, ce_cap(l[j], cap));
    mx = block_max(mx, redf);
    double s = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += double(expf(ce_cap(l[j], cap) - mx));
    s = block_sum(s, redd);
    if (threadIdx.x == 0) {
      OnlineSoftmax<double> st;
      if (p0 != 0) {
        st.m = m[row];
        st.s = sum[row];
      }
      online_softmax_merge(st, mx, s);
      m[row] = st.m;
      sum[row] = st.s;
      const int64_t t = targets[row];
      if (t >= p0 && t < p0 + n) target_logit[row] = ce_cap(l[t - p0], cap);
    }
  }
}

__global__ void __launch_bounds__(256)
    k_ce_finish(const float* m, const double* sum, const float* target_logit,
                const int32_t* targets, int32_t ignore_index, int64_t rc, float* lse,
                double* loss_terms) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rc;
       i += int64_t(gridDim.x) * blockDim.x) {
    OnlineSoftmax<double> st;
    st.m = m[i];
    st.s = sum[i];
    const double l = double(st.m) + log(st.s);  // as the CPU: lse in double for the loss
    lse[i] = float(l);
    loss_terms[i] = targets[i] == ignore_index ? 0.0 : l - double(target_logit[i]);
  }
}

__global__ void __launch_bounds__(32)
    k_ce_sum(const double* loss_terms, const int32_t* targets, int64_t rc, int32_t ignore_index,
             double* acc, unsigned long long* count) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double a = acc[0];
  unsigned long long c = count[0];
  for (int64_t i = 0; i < rc; ++i) {
    if (targets[i] == ignore_index) continue;
    a += loss_terms[i];
    ++c;
  }
  acc[0] = a;
  count[0] = c;
}

// T = F32: in place; BF16 / F16: the gradient rounded to T into out16 (the dh GEMM's operand,
// so no conversion kernel sits between this one and that GEMM).
template <TileType T>
__global__ void __launch_bounds__(256)
    k_ce_grad(float* logits, int64_t rc, int64_t n, int64_t p0, const int32_t* targets,
              int32_t ignore_index, const float* lse, float grad_scale, float cap,
              uint16_t* out16) {
  const int64_t total = rc * n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / n, j = i - r * n;
    float g = 0.f;
    if (targets[r] != ignore_index) {
      const float x = ce_cap(logits[i], cap);
      g = softmax_prob(x, lse[r]) * grad_scale;
      if (targets[r] == p0 + j) g -= grad_scale;
      if (cap > 0.f) {  // through the cap: d/dz of cap tanh(z / cap) is 1 - tanh^2
        const float t = x / cap;
        g *= 1.f - t * t;
      }
    }
    if (T == TileType::F32)
      logits[i] = g;
    else
      out16[i] = T == TileType::BF16 ? f32_to_bf16(g) : f32_to_f16(g);
  }
}

}  // namespace

void ce_merge_panel(const float* logits, int64_t rc, int64_t n, int64_t p0, const int32_t* targets,
                    float* m, double* sum, float* target_logit, cudaStream_t s, float cap) {
  launch(k_ce_merge, dim3(unsigned(rc < 65535 ? rc : 65535)), 256, 0, s, logits, rc, n, p0, targets,
         m, sum, target_logit, cap);
}

void ce_finish(const float* m, const double* sum, const float* target_logit, const int32_t* targets,
               int32_t ignore_index, int64_t rc, float* lse, double* loss_terms, cudaStream_t s) {
  launch(k_ce_finish, grid_for(rc, 256), 256, 0, s, m, sum, target_logit, targets, ignore_index, rc,
         lse, loss_terms);
}

void ce_grad_panel(float* logits, int64_t rc, int64_t n, int64_t p0, const int32_t* targets,
                   int32_t ignore_index, const float* lse, float grad_scale, cudaStream_t s,
                   float cap, void* out16, TileType t) {
  uint16_t* o = static_cast<uint16_t*>(out16);
  const dim3 g = grid_for(rc * n, 256);
  if (!o || t == TileType::F32)
    return launch(k_ce_grad<TileType::F32>, g, 256, 0, s, logits, rc, n, p0, targets, ignore_index,
                  lse, grad_scale, cap, o);
  if (t == TileType::BF16)
    return launch(k_ce_grad<TileType::BF16>, g, 256, 0, s, logits, rc, n, p0, targets, ignore_index,
                  lse, grad_scale, cap, o);
  launch(k_ce_grad<TileType::F16>, g, 256, 0, s, logits, rc, n, p0, targets, ignore_index, lse,
         grad_scale, cap, o);
}

void ce_sum(const double* loss_terms, const int32_t* targets, int64_t rc, int32_t ignore_index,
            double* acc, unsigned long long* count, cudaStream_t s) {
  launch(k_ce_sum, 1, 32, 0, s, loss_terms, targets, rc, ignore_index, acc, count);
}

}  // namespace qlft::cu
