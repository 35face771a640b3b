#include "optim/grad_clip.h"
#include "core/threads.h"

#include <algorithm>
#include <cmath>

namespace qlft {

double global_grad_norm(const std::vector<GradSpan>& grads) {
  // Fixed chunks summed in order: the same norm for any thread count (resume must reproduce
  // an uninterrupted run bit for bit).
  constexpr int64_t kChunk = 16384;
  double total = 0.0;
  for (const GradSpan& g : grads) {
    const int64_t n = static_cast<int64_t>(g.n);
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    std::vector<double> part(static_cast<size_t>(chunks), 0.0);
    const float* x = g.data;
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static) if (chunks >= 4)
    for (int64_t c = 0; c < chunks; ++c) {
      double s = 0.0;
      const int64_t end = std::min(n, (c + 1) * kChunk);
      for (int64_t i = c * kChunk; i < end; ++i)
        s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
      part[static_cast<size_t>(c)] = s;
    }
    for (double s : part) total += s;
  }
  return std::sqrt(total);
}

ClipResult clip_rule(double norm, double max_norm) {
  ClipResult r;
  r.norm = norm;
  r.finite = std::isfinite(norm);
  if (!r.finite || max_norm <= 0) return r;
  const double coef = max_norm / (norm + 1e-6);
  if (coef >= 1.0) return r;
  r.clipped = true;
  r.coef = coef;
  return r;
}

ClipResult clip_grad_norm(const std::vector<GradSpan>& grads, double max_norm) {
  const ClipResult r = clip_rule(global_grad_norm(grads), max_norm);
  if (!r.clipped) return r;
  const float cf = static_cast<float>(r.coef);
  for (const GradSpan& g : grads) {
    const int64_t n = static_cast<int64_t>(g.n);
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static) if (n >= (1 << 16))
    for (int64_t i = 0; i < n; ++i) g.data[i] *= cf;
  }
  return r;
}

}  // namespace qlft
