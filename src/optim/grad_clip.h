// Gradient clipping by global L2 norm, as torch.nn.utils.clip_grad_norm_(max_norm, 2): the
// norm of all gradients as one vector; when it exceeds max_norm every gradient is scaled by
// max_norm / (norm + 1e-6). The norm is accumulated in double.
#pragma once

#include <cstddef>
#include <vector>

namespace qlft {

struct GradSpan {
  float* data = nullptr;
  size_t n = 0;
};

struct ClipResult {
  double norm = 0;       // global L2 norm before clipping (inf or nan when not finite)
  bool finite = true;    // false: some gradient is inf/nan; nothing was scaled
  bool clipped = false;  // the gradients were scaled
  double coef = 1.0;     // the factor applied (1 when not clipped)
};

double global_grad_norm(const std::vector<GradSpan>& grads);

// torch.nn.utils.clip_grad_norm_'s rule for a global norm: clipped (by coef = max_norm /
// (norm + 1e-6)) when the norm is finite, max_norm > 0 and coef < 1. The caller scales.
ClipResult clip_rule(double norm, double max_norm);

// max_norm <= 0 only measures. A non-finite norm is reported and leaves the gradients as they
// are (the caller skips the step), unlike torch, which would multiply them by nan.
ClipResult clip_grad_norm(const std::vector<GradSpan>& grads, double max_norm);

}  // namespace qlft
