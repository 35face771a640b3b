// The scalars of one bitsandbytes 8-bit AdamW step (optim/adamw8bit.h), apart from the optimizer
// so the device step (train/device_adamw8bit.cpp) computes them as the host one does.
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

}  // namespace qlft
