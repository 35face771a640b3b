// Per-element AdamW arithmetic (QLFT_HD), shared by the CPU optimizers (optim/) and the CUDA
// kernels (cuda/src/k_optim.cu): below both, in backend/, since each backend implements the step.
//
// Each function reproduces the operation order of its reference so results agree to the last
// bit or two: hyperparameters arrive as the float values the reference's tensor ops use (it
// computes them in double, e.g. 1 - lr * wd, then rounds to float), and fmaf stands exactly
// where the reference's vectorized kernel fuses (torch's lerp and add-with-alpha).
#pragma once

#include <cmath>

#include "core/hd.h"

namespace qlft {

QLFT_HD inline bool optim_isfinite(float x) {
#if defined(__CUDACC__)
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}

// Scalars of one torch.optim.AdamW step (single-tensor path, torch 2.x).
struct AdamWTorchCoeffs {
  float decay;          // 1 - lr * weight_decay (1 when weight_decay == 0)
  float w1;             // 1 - beta1: lerp weight of the first moment
  float beta2;          // second-moment decay
  float one_m_beta2;    // 1 - beta2
  float bc2_sqrt;       // sqrt(1 - beta2^t)
  float eps;            // added after the square root
  float neg_step_size;  // -lr / (1 - beta1^t)
};

// p, m, v updated in place for gradient g. PyTorch semantics: decoupled weight decay first
// (p *= 1 - lr*wd), m = lerp(m, g, 1 - beta1), v = beta2*v + (1-beta2)*g*g,
// p += -lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps). torch's vectorized sqrt is not always correctly
// rounded (it differs from sqrtf by one ulp for some inputs), so results agree to a few ulps,
// not bit for bit. v's multiply-add is written as the one fmaf the host's vectorized loop
// compiles it to: left to contraction, the CUDA kernel fused the other product and the host and
// device steps parted by an ulp of v (CudaOptim.AdamWTorchEqualsHostOptimizer checks the bits).
QLFT_HD inline void adamw_torch_update(float& p, float& m, float& v, float g,
                                       const AdamWTorchCoeffs& c) {
  p = p * c.decay;
  // torch lerp (vectorized): weight < 0.5 -> fma(w, end - start, start), else
  // fma(w - 1, end - start, end). Written as selects so the loop stays vectorizable.
  const bool small = c.w1 < 0.5f;
  const float diff = g - m;
  m = fmaf(small ? c.w1 : c.w1 - 1.0f, diff, small ? m : g);
  v = fmaf(c.one_m_beta2 * g, g, v * c.beta2);
  float denom = sqrtf(v) / c.bc2_sqrt + c.eps;
  p = p + (c.neg_step_size * m) / denom;  // torch addcdiv: self + value * t1 / t2
}

// Scalars of one bitsandbytes AdamW8bit step as its CPU backend computes them.
struct AdamBnbCoeffs {
  float beta1, one_m_beta1, beta2, one_m_beta2;
  float decay;  // 1 - lr * weight_decay, applied only when weight_decay > 0
  bool apply_decay;
  // 8-bit (blockwise) path: denom = sqrt(v) / corr2 + eps; p += neg_lr_over_c1 * m / denom
  float corr2;           // sqrt(1 - beta2^t)
  float eps;             //
  float neg_lr_over_c1;  // -lr / (1 - beta1^t)
  // fp32-state path (tensors under min_8bit_size): p += step_size * m / (sqrt(v) + eps_c2)
  float step_size_32;  // -lr * corr2 / (1 - beta1^t)
  float eps_corr2;     // eps * corr2
};

// Moment update shared by both bnb paths: m = m*beta1 + (1-beta1)*g (fused, as torch's
// add_(alpha) kernel), v = v*beta2 + ((1-beta2)*g)*g (addcmul).
QLFT_HD inline void adam_bnb_moments(float& m, float& v, float g, const AdamBnbCoeffs& c) {
  m = m * c.beta1;
  m = fmaf(c.one_m_beta1, g, m);
  v = v * c.beta2;
  v = v + (c.one_m_beta2 * g) * g;
}

// The moments of both bnb paths; a non-finite gradient instead restarts the element's state at
// zero (bitsandbytes' kernels skip it) and returns false.
QLFT_HD inline bool adam_bnb_finite_moments(float& m, float& v, float g, const AdamBnbCoeffs& c) {
  if (!optim_isfinite(g)) {
    m = 0.0f;
    v = 0.0f;
    return false;
  }
  adam_bnb_moments(m, v, g, c);
  return true;
}

// bnb blockwise 8-bit path, on dequantized state: moments, then decay, then the update.
// A non-finite gradient leaves p untouched and restarts that element's state at zero, as
// bitsandbytes' 8-bit blockwise kernel does. Returns false for such an element.
QLFT_HD inline bool adam_bnb_8bit_update(float& p, float& m, float& v, float g,
                                         const AdamBnbCoeffs& c) {
  if (!adam_bnb_finite_moments(m, v, g, c)) return false;
  float denom = sqrtf(v) / c.corr2 + c.eps;
  if (c.apply_decay) p = p * c.decay;
  p = p + (c.neg_lr_over_c1 * m) / denom;  // addcdiv, as above
  return true;
}

// bnb fp32-state path (its 32-bit optimizer, used for tensors under 4096 elements).
QLFT_HD inline bool adam_bnb_32bit_update(float& p, float& m, float& v, float g,
                                          const AdamBnbCoeffs& c) {
  if (!adam_bnb_finite_moments(m, v, g, c)) return false;
  if (c.apply_decay) p = p * c.decay;
  float update = m / (sqrtf(v) + c.eps_corr2);
  p = fmaf(c.step_size_32, update, p);
  return true;
}

}  // namespace qlft
