#include "model/sampler.h"

#include <algorithm>
#include <cmath>

#include "backend/dropout.h"
#include "core/error.h"

namespace qlft {

int32_t argmax(const float* x, int n) {
  int32_t best = 0;
  for (int i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

Sampler::Sampler(const SamplerConfig& cfg)
    : cfg_(cfg), state_(mix64(cfg.seed ^ 0x5851f42d4c957f2dull)) {
  QLFT_CHECK_ARG(std::isfinite(cfg.temperature), "temperature must be finite");
  QLFT_CHECK_ARG(cfg.top_k >= 0, "top_k must be >= 0, got %d", cfg.top_k);
  QLFT_CHECK_ARG(cfg.top_p > 0.f && cfg.top_p <= 1.f, "top_p must be in (0, 1], got %g", cfg.top_p);
}

double Sampler::uniform() {
  state_ += 0x9e3779b97f4a7c15ull;  // splitmix64 stream
  return static_cast<double>(mix64(state_) >> 11) * (1.0 / 9007199254740992.0);
}

int32_t Sampler::sample(const float* logits, int vocab) {
  QLFT_CHECK_ARG(vocab > 0, "sample: empty logits");
  if (cfg_.temperature <= 0.f) return argmax(logits, vocab);
  // Candidates sorted by logit, highest first (ties: lower id first), cut to top_k.
  cand_.resize(vocab);
  for (int i = 0; i < vocab; ++i) cand_[i] = {logits[i], i};
  auto better = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  int n = vocab;
  if (cfg_.top_k > 0 && cfg_.top_k < vocab) {
    n = cfg_.top_k;
    std::partial_sort(cand_.begin(), cand_.begin() + n, cand_.end(), better);
  } else {
    std::sort(cand_.begin(), cand_.end(), better);
  }
  // Softmax of logit / T over the candidates, in double.
  const double inv_t = 1.0 / cfg_.temperature, mx = cand_[0].first;
  std::vector<double> p(n);
  double sum = 0;
  for (int i = 0; i < n; ++i) {
    p[i] = std::exp((cand_[i].first - mx) * inv_t);
    sum += p[i];
  }
  // Nucleus: the smallest prefix whose probability reaches top_p.
  int keep = n;
  if (cfg_.top_p < 1.f) {
    double acc = 0;
    for (int i = 0; i < n; ++i) {
      acc += p[i] / sum;
      if (acc >= cfg_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double mass = 0;
  for (int i = 0; i < keep; ++i) mass += p[i];
  double u = uniform() * mass, acc = 0;
  for (int i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return cand_[i].second;
  }
  return cand_[keep - 1].second;
}

}  // namespace qlft
