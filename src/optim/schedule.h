// Learning-rate schedules with linear warmup, equal to transformers' LambdaLR schedules:
//   constant: get_constant_schedule_with_warmup
//   linear:   get_linear_schedule_with_warmup
//   cosine:   get_cosine_schedule_with_warmup (half a cycle), or with min_lr_ratio > 0
//             get_cosine_with_min_lr_schedule_with_warmup(min_lr_rate = min_lr_ratio)
// For linear, min_lr_ratio > 0 applies the same floor (factor * (1 - r) + r after warmup);
// transformers has no such variant. The lr of optimizer step k (0-based) is lr_at(k), as
// when the HF Trainer calls scheduler.step() after each optimizer step.
#pragma once

#include <cstdint>
#include <string>

#include "config/run_spec.h"
#include "optim/state_dict.h"

namespace qlft {

// sched.* (config/run_spec.h).
using ScheduleSettings = ScheduleSpec;

class LrSchedule final : public CheckpointState {
 public:
  // total_steps: optimizer steps of the whole run (linear and cosine decay over it).
  LrSchedule(const ScheduleSettings& s, double base_lr, int64_t total_steps);
  // CheckpointState: "<prefix>type" (the schedule name: one that differs from this schedule's is
  // refused naming both) and "<prefix>step".
  void save_state(StateDict& out, const std::string& prefix = "sched.") const override;
  void load_state(const StateDict& in, const std::string& prefix = "sched.") override;

  double lr_at(int64_t step) const { return base_lr_ * factor(step); }
  double factor(int64_t step) const;

  // The lr for the next optimizer step, and moving past it.
  double current_lr() const { return lr_at(step_); }
  void advance() { ++step_; }
  int64_t step() const { return step_; }

 private:
  ScheduleSettings s_;
  double base_lr_;
  int64_t total_;
  int64_t step_ = 0;
};

}  // namespace qlft
