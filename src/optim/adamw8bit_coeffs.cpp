// What the host and device 8-bit AdamW (optim/adamw8bit.cpp, train/device_adamw8bit.cpp) share:
// the scalars of one bitsandbytes step and the check of a checkpoint's header.
#include <cmath>

#include "core/error.h"
#include "optim/adamw8bit.h"

namespace qlft {

AdamBnbCoeffs adam_bnb_coeffs(const OptimSettings& s, double lr, int64_t t) {
  QLFT_CHECK_ARG(std::isfinite(lr) && lr >= 0,
                 "optimizer step: lr must be a finite number >= 0, got %g", lr);
  // bitsandbytes' CPU backend computes these in Python (double); torch's tensor ops then use
  // them as float operands.
  AdamBnbCoeffs c;
  c.beta1 = static_cast<float>(s.beta1);
  c.one_m_beta1 = static_cast<float>(1.0 - s.beta1);
  c.beta2 = static_cast<float>(s.beta2);
  c.one_m_beta2 = static_cast<float>(1.0 - s.beta2);
  c.apply_decay = s.weight_decay > 0.0;
  c.decay = static_cast<float>(1.0 - lr * s.weight_decay);
  const double correction1 = 1.0 - std::pow(s.beta1, static_cast<double>(t));
  const double correction2 = std::sqrt(1.0 - std::pow(s.beta2, static_cast<double>(t)));
  c.corr2 = static_cast<float>(correction2);
  c.eps = static_cast<float>(s.eps);
  c.neg_lr_over_c1 = static_cast<float>(-lr / correction1);
  c.step_size_32 = static_cast<float>(-lr * correction2 / correction1);
  c.eps_corr2 = static_cast<float>(s.eps * correction2);
  return c;
}

int64_t adamw8bit_checkpoint_step(const StateDict& in, const std::string& prefix,
                                  const char* optimizer) {
  const std::string type = in.get_string(prefix + "type");
  if (type != "adamw8bit")
    throw_error(QLFT_ERR_FORMAT,
                "checkpoint state: '%stype' is '%s' but the optimizer is %s (optim.name)",
                prefix.c_str(), type.c_str(), optimizer);
  const int64_t step = in.get_i64(prefix + "step");
  QLFT_CHECK_FORMAT(step >= 0, "checkpoint state: '%sstep' is negative (%lld)", prefix.c_str(),
                    static_cast<long long>(step));
  return step;
}

}  // namespace qlft
