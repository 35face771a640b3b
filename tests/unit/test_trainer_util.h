// Shared by the suites that compare trainers: every LoRA tensor's values (or gradients) in the
// trainer's fixed parameter order, as one array.
#pragma once

#include <vector>

#include "train/trainer.h"

namespace trainer_test {

inline std::vector<float> weights_of(qlft::Trainer& t) {
  std::vector<float> w;
  for (const qlft::LoraAdapter::Param& p : t.lora().params()) w.insert(w.end(), p.w, p.w + p.n);
  return w;
}

inline std::vector<float> grads_of(qlft::Trainer& t) {
  std::vector<float> g;
  for (const qlft::LoraAdapter::Param& p : t.lora().params()) g.insert(g.end(), p.g, p.g + p.n);
  return g;
}

}  // namespace trainer_test
