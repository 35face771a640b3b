#include "optim/loss_scaler.h"

#include <cmath>

#include "core/error.h"
#include "core/threads.h"

namespace qlft {

bool unscale_and_check(const std::vector<GradSpan>& grads, float inv_scale) {
  bool found = false;
  for (const GradSpan& g : grads) {
    const int64_t n = static_cast<int64_t>(g.n);
    float* x = g.data;
    int bad = 0;
    const int nt = qlft::num_threads();
#pragma omp parallel for num_threads(nt) schedule(static) reduction(| : bad) if (n >= (1 << 16))
    for (int64_t i = 0; i < n; ++i) {
      const float v = x[i];
      bad |= !std::isfinite(v);
      if (inv_scale != 1.0f) x[i] = v * inv_scale;
    }
    found = found || bad;
  }
  return found;
}

LossScaler::LossScaler(const ScalerSettings& s) : s_(s), scale_(static_cast<float>(s.init_scale)) {
  QLFT_CHECK_ARG(std::isfinite(scale_) && scale_ > 0,
                 "scaler.init_scale must be a positive float, got %g", s.init_scale);
  QLFT_CHECK_ARG(s.growth_factor > 1.0, "scaler.growth_factor must be > 1, got %g",
                 s.growth_factor);
  QLFT_CHECK_ARG(s.backoff_factor > 0.0 && s.backoff_factor < 1.0,
                 "scaler.backoff_factor must be in (0, 1), got %g", s.backoff_factor);
  QLFT_CHECK_ARG(s.growth_interval >= 1, "scaler.growth_interval must be >= 1, got %lld",
                 static_cast<long long>(s.growth_interval));
}

bool LossScaler::unscale_and_check(const std::vector<GradSpan>& grads) const {
  // GradScaler: inv_scale = scale.double().reciprocal().float()
  const float inv = static_cast<float>(1.0 / static_cast<double>(scale_));
  return qlft::unscale_and_check(grads, inv);
}

void LossScaler::update(bool found_inf) {
  // torch's _amp_update_scale_ (CPU): float scale, double factors.
  if (found_inf) {
    scale_ = static_cast<float>(scale_ * s_.backoff_factor);
    tracker_ = 0;
    ++skipped_;
    return;
  }
  const int64_t successful = tracker_ + 1;
  if (successful == s_.growth_interval) {
    const float grown = static_cast<float>(scale_ * s_.growth_factor);
    if (std::isfinite(grown)) scale_ = grown;
    tracker_ = 0;
  } else {
    tracker_ = successful;
  }
}

void LossScaler::save_state(StateDict& out, const std::string& prefix) const {
  out.put_f64(prefix + "scale", scale_);
  out.put_i64(prefix + "growth_tracker", tracker_);
  out.put_i64(prefix + "skipped", skipped_);
}

void LossScaler::load_state(const StateDict& in, const std::string& prefix) {
  const double scale = in.get_f64(prefix + "scale");
  const int64_t tracker = in.get_i64(prefix + "growth_tracker");
  const int64_t skipped = in.get_i64(prefix + "skipped");
  QLFT_CHECK_FORMAT(std::isfinite(scale) && scale > 0 && scale <= 3.4e38,
                    "checkpoint state: '%sscale' must be a positive float, got %g", prefix.c_str(),
                    scale);
  QLFT_CHECK_FORMAT(tracker >= 0 && skipped >= 0,
                    "checkpoint state: '%sgrowth_tracker'/'%sskipped' must be >= 0", prefix.c_str(),
                    prefix.c_str());
  scale_ = static_cast<float>(scale);
  tracker_ = tracker;
  skipped_ = skipped;
}

}  // namespace qlft
