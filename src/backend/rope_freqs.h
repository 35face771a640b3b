// The frequencies a RoPE rotation uses: one inverse frequency per pair (head_dim / 2) and the
// factor cos and sin are multiplied by (yarn's attention factor, 1 otherwise). The backends
// rotate with this table and never derive frequencies themselves; model/rope_scaling.h makes it
// from a model's configuration (and, for dynamic NTK, the sequence length).
#pragma once

#include <vector>

#include "backend/rope_math.h"

namespace qlft {

// The most distinct tables a device backend keeps uploaded (dynamic NTK makes one per sequence
// length); the planner counts this many where the model's tables vary (rope_varies).
constexpr int kRopeDeviceTables = 8;

struct RopeFreqs {
  std::vector<float> inv_freq;  // [head_dim / 2]
  float scale = 1.f;            // cos and sin are multiplied by it (in float, as transformers)

  int head_dim() const { return static_cast<int>(inv_freq.size()) * 2; }
  bool operator==(const RopeFreqs& o) const { return scale == o.scale && inv_freq == o.inv_freq; }

  // Unscaled RoPE of base theta: transformers' "default" rope_type.
  static RopeFreqs plain(float theta, int head_dim) {
    RopeFreqs f;
    f.inv_freq.resize(static_cast<size_t>(head_dim / 2));
    for (int i = 0; i < head_dim / 2; ++i)
      f.inv_freq[static_cast<size_t>(i)] = rope_inv_freq(theta, i, head_dim);
    return f;
  }
};

}  // namespace qlft
