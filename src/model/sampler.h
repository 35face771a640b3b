// Next-token sampling from logits: greedy, temperature, top-k, top-p (nucleus), seeded.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace qlft {

struct SamplerConfig {
  float temperature = 0.f;  // <= 0: greedy (argmax, lowest id on ties)
  int top_k = 0;            // 0: no limit
  float top_p = 1.f;        // 1: no limit; keeps the smallest set of ids whose mass >= top_p
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplerConfig& cfg);
  // Picks a token id from logits [vocab]. Deterministic given the seed and the call sequence.
  int32_t sample(const float* logits, int vocab);
  // The next uniform draw in [0, 1) (exposed for tests).
  double uniform();
  const SamplerConfig& config() const { return cfg_; }

 private:
  SamplerConfig cfg_;
  uint64_t state_;
  std::vector<std::pair<float, int32_t>> cand_;
};

// Argmax with the lowest index on ties.
int32_t argmax(const float* x, int n);

}  // namespace qlft
