// Rotary position embedding math shared by the CPU backend and CUDA kernels.
// Frequencies follow Hugging Face transformers in float32 so parity holds:
//   inv_freq[i] = 1 / theta^((2i) / d), angle = float(pos) * inv_freq[i], cos/sin of the float.
#pragma once

#include <cmath>

#include "core/hd.h"

namespace qlft {

// inv_freq of pair i (0 <= i < head_dim / 2), all in float32 as HF computes it.
QLFT_HD inline float rope_inv_freq(float theta, int i, int head_dim) {
  float expo = static_cast<float>(2 * i) / static_cast<float>(head_dim);
  return 1.0f / powf(theta, expo);
}

QLFT_HD inline float rope_angle(int pos, float inv_freq) {
  return static_cast<float>(pos) * inv_freq;
}

// Rotates the pair (a, b) by the angle with cosine c and sine s: the HF rotate-half form
// a' = a c - b s, b' = b c + a s. The inverse (backward) rotation passes -s.
QLFT_HD inline void rope_rotate_pair(float& a, float& b, float c, float s) {
  float a0 = a, b0 = b;
  a = a0 * c - b0 * s;
  b = b0 * c + a0 * s;
}

}  // namespace qlft
