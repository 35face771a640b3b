// Dynamic loss scaling for fp16 training, the algorithm of torch.amp.GradScaler: the loss is
// multiplied by scale() before backward; unscale_and_check() divides the gradients by it and
// reports inf/nan; update() then backs off (scale *= backoff, step skipped) on overflow, or
// after growth_interval clean steps in a row grows the scale (scale *= growth).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/run_spec.h"
#include "optim/grad_clip.h"
#include "optim/state_dict.h"

namespace qlft {

// scaler.* (config/run_spec.h).
using ScalerSettings = ScalerSpec;

// Multiplies every gradient by inv_scale (skipped when it is 1) and returns true if any input
// value was inf or nan (torch._amp_foreach_non_finite_check_and_unscale_).
bool unscale_and_check(const std::vector<GradSpan>& grads, float inv_scale);

class LossScaler final : public CheckpointState {
 public:
  explicit LossScaler(const ScalerSettings& s);
  // CheckpointState: "<prefix>scale" (F64), "<prefix>growth_tracker", "<prefix>skipped" (I64).
  void save_state(StateDict& out, const std::string& prefix = "scaler.") const override;
  void load_state(const StateDict& in, const std::string& prefix = "scaler.") override;

  float scale() const { return scale_; }
  int64_t growth_tracker() const { return tracker_; }
  // Unscales with 1/scale (computed in double, as GradScaler does) and checks for inf/nan.
  bool unscale_and_check(const std::vector<GradSpan>& grads) const;
  // After each step attempt: found_inf -> back off (the caller skipped the step), else count
  // a clean step and grow after growth_interval of them. A growth that would overflow float is
  // not taken.
  void update(bool found_inf);
  int64_t skipped_steps() const { return skipped_; }

 private:
  ScalerSettings s_;
  float scale_;
  int64_t tracker_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace qlft
