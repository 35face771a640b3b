#include "model/moe_lora.h"

namespace qlft {

std::vector<float> moe_lora_b_from_peft(const float* b, int64_t out, int r, int n_experts) {
  const int64_t E = n_experts, cols = int64_t(r) * E;
  std::vector<float> v(static_cast<size_t>(out * cols));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t j = 0; j < r; ++j) v[size_t((e * out + o) * r + j)] = b[o * cols + j * E + e];
  return v;
}

std::vector<float> moe_lora_b_to_peft(const float* b, int64_t out, int r, int n_experts) {
  const int64_t E = n_experts, cols = int64_t(r) * E;
  std::vector<float> v(static_cast<size_t>(out * cols));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t j = 0; j < r; ++j) v[size_t(o * cols + j * E + e)] = b[(e * out + o) * r + j];
  return v;
}

}  // namespace qlft
