#include "optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace qlft {

LrSchedule::LrSchedule(const ScheduleSettings& s, double base_lr, int64_t total_steps)
    : s_(s), base_lr_(base_lr), total_(total_steps) {
  QLFT_CHECK_ARG(s.warmup_steps >= 0, "sched.warmup_steps must be >= 0, got %lld",
                 static_cast<long long>(s.warmup_steps));
  QLFT_CHECK_ARG(s.min_lr_ratio >= 0 && s.min_lr_ratio <= 1,
                 "sched.min_lr_ratio must be in [0, 1], got %g", s.min_lr_ratio);
  QLFT_CHECK_ARG(total_steps >= 0, "schedule: total steps must be >= 0, got %lld",
                 static_cast<long long>(total_steps));
}

double LrSchedule::factor(int64_t step) const {
  const int64_t w = s_.warmup_steps;
  // The arithmetic and its order follow transformers/optimization.py (Python doubles).
  if (step < w) return static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, w));
  if (s_.kind == ScheduleKind::Constant) return 1.0;
  const double span = static_cast<double>(std::max<int64_t>(1, total_ - w));
  const double r = s_.min_lr_ratio;
  if (s_.kind == ScheduleKind::Linear) {
    double f = std::max(0.0, static_cast<double>(total_ - step) / span);
    return r > 0 ? f * (1 - r) + r : f;
  }
  const double progress = static_cast<double>(step - w) / span;
  const double num_cycles = 0.5;
  double f = 0.5 * (1.0 + std::cos(M_PI * num_cycles * 2.0 * progress));
  if (r > 0) f = f * (1 - r) + r;
  return std::max(0.0, f);
}

void LrSchedule::save_state(StateDict& out, const std::string& prefix) const {
  out.put_string(prefix + "type", name_of(s_.kind));
  out.put_i64(prefix + "step", step_);
}

void LrSchedule::load_state(const StateDict& in, const std::string& prefix) {
  const std::string type = in.get_string(prefix + "type");
  if (type != name_of(s_.kind))
    throw_error(QLFT_ERR_FORMAT, "checkpoint state: '%stype' is '%s' but sched.name is '%s'",
                prefix.c_str(), type.c_str(), name_of(s_.kind));
  const int64_t step = in.get_i64(prefix + "step");
  QLFT_CHECK_FORMAT(step >= 0, "checkpoint state: '%sstep' is negative (%lld)", prefix.c_str(),
                    static_cast<long long>(step));
  step_ = step;
}

}  // namespace qlft
