#include "optim/grad_clip.h"

#include <cmath>

namespace qlft {

double global_grad_norm(const std::vector<GradSpan>& grads) {
  double total = 0.0;
  for (const GradSpan& g : grads) {
    const int64_t n = static_cast<int64_t>(g.n);
    const float* x = g.data;
    double s = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : s) if (n >= (1 << 16))
    for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    total += s;
  }
  return std::sqrt(total);
}

ClipResult clip_grad_norm(const std::vector<GradSpan>& grads, double max_norm) {
  ClipResult r;
  r.norm = global_grad_norm(grads);
  r.finite = std::isfinite(r.norm);
  if (!r.finite || max_norm <= 0) return r;
  const double coef = max_norm / (r.norm + 1e-6);
  if (coef >= 1.0) return r;
  r.clipped = true;
  r.coef = coef;
  const float cf = static_cast<float>(coef);
  for (const GradSpan& g : grads) {
    const int64_t n = static_cast<int64_t>(g.n);
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
    for (int64_t i = 0; i < n; ++i) g.data[i] *= cf;
  }
  return r;
}

}  // namespace qlft
