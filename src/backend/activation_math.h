// SiLU / SwiGLU and GELU-tanh (GeGLU) math shared by the CPU backend and CUDA kernels.
#pragma once

#include <cmath>

#include "core/hd.h"

namespace qlft {

QLFT_HD inline float sigmoidf_(float x) {
  return 1.0f / (1.0f + expf(-x));
}

// silu(g) = g * sigmoid(g) (torch's formula).
QLFT_HD inline float silu(float g) {
  return g * sigmoidf_(g);
}

QLFT_HD inline float swiglu(float gate, float up) {
  return silu(gate) * up;
}

// d silu / dg = sigmoid(g) * (1 + g * (1 - sigmoid(g))).
QLFT_HD inline float silu_grad(float g) {
  float s = sigmoidf_(g);
  return s * (1.0f + g * (1.0f - s));
}

// The SwiGLU formulas given s = sigmoid(gate), so a kernel can bring its own vectorized or
// intrinsic sigmoid (the CPU backend's exp_approx_in_range, CUDA's __expf) and share the rest.
QLFT_HD inline float swiglu_from_sigmoid(float gate, float up, float s) {
  return gate * s * up;
}
QLFT_HD inline void swiglu_bwd_from_sigmoid(float gate, float up, float dout, float s, float& dgate,
                                            float& dup) {
  dgate = dout * up * (s * (1.0f + gate * (1.0f - s)));
  dup = dout * (gate * s);
}

// Gradients of out = silu(gate) * up.
QLFT_HD inline void swiglu_bwd_elem(float gate, float up, float dout, float& dgate, float& dup) {
  swiglu_bwd_from_sigmoid(gate, up, dout, sigmoidf_(gate), dgate, dup);
}

// gelu_pytorch_tanh (Gemma's GeGLU): 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), and
// with its derivative.
constexpr float kGeluC = 0.7978845608028654f, kGeluA = 0.044715f;
QLFT_HD inline float gelu_tanh(float x) {
  return 0.5f * x * (1.f + tanhf(kGeluC * (x + kGeluA * x * x * x)));
}
QLFT_HD inline void gelu_tanh_and_grad(float x, float& g, float& dg) {
  const float t = tanhf(kGeluC * (x + kGeluA * x * x * x));
  g = 0.5f * x * (1.f + t);
  dg = 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * kGeluC * (1.f + 3.f * kGeluA * x * x);
}

}  // namespace qlft
