// SiLU / SwiGLU math shared by the CPU backend and CUDA kernels.
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

}  // namespace qlft
