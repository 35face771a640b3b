// Shared by test_rope_scaling (CPU backend) and test_cuda_rope_scaling (the CUDA backend): the
// fixtures of tests/reference/gen_rope_scaling_fixtures.py (one tiny random Llama, a config.json
// per RoPE scaling variant, transformers' rotary tables, logits and greedy tokens).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/generate.h"
#include "model/llama.h"
#include "model/model.h"
#include "support/test_support.h"
#include "test_model_util.h"

namespace rope_test {
using namespace qlft;

inline const char* const kVariants[] = {"llama3", "linear", "dynamic", "yarn"};
constexpr int kPrompt = 40, kNew = 24;  // the generator's PROMPT and NEW

inline std::string fixture(const std::string& rel) {
  return qlft_test::fixture_path("rope_scaling/" + rel);
}

inline const model_test::Fixture& reference() {
  static model_test::Fixture f(fixture("reference.safetensors"));
  return f;
}

// A model directory of variant v: its config.json beside the shared weights (a temp copy).
inline std::string variant_dir(const std::string& v) {
  const std::string dir = qlft_test::temp_dir("rope_scaling_" + v);
  std::vector<uint8_t> cfg = qlft_test::read_file(fixture("config_" + v + ".json"));
  qlft_test::write_file(dir + "/config.json", cfg.data(), cfg.size());
  std::vector<uint8_t> st = qlft_test::read_file(fixture("model.safetensors"));
  qlft_test::write_file(dir + "/model.safetensors", st.data(), st.size());
  return dir;
}

// The logits of the fixture's 72 tokens (one sequence) at the fixture's positions.
inline std::vector<float> logits_at_positions(const Model& m, Backend& be,
                                              LoraAdapter* lora = nullptr) {
  const std::vector<int32_t> tok = reference().i32("tokens");
  const std::vector<int32_t> at = reference().i32("positions");
  LlamaRunner run(m, be, lora);
  TokenBatch b;
  b.batch = 1;
  b.seq = static_cast<int>(tok.size());
  b.tokens = tok.data();
  const int V = m.cfg.vocab;
  std::vector<float> all(tok.size() * size_t(V)), out;
  run.logits(b, MatF(all.data(), b.rows(), V));
  for (int32_t p : at)
    out.insert(out.end(), all.begin() + size_t(p) * V, all.begin() + size_t(p + 1) * V);
  return out;
}

// Greedy decoding as transformers' generate: the prompt in one call, then a token per call (with
// dynamic NTK each call's length sets the new keys' base; cached keys keep theirs).
inline std::vector<int32_t> greedy(const Model& m, Backend& be) {
  const std::vector<int32_t> tok = reference().i32("tokens");
  Generator g(m, be, nullptr, kPrompt + kNew);
  std::vector<float> lg(size_t(m.cfg.vocab));
  std::vector<int32_t> out;
  g.feed(tok.data(), kPrompt, lg.data(), true);
  for (int i = 0; i < kNew; ++i) {
    int32_t best = 0;
    for (int j = 1; j < m.cfg.vocab; ++j)
      if (lg[size_t(j)] > lg[size_t(best)]) best = j;
    out.push_back(best);
    if (i + 1 < kNew) g.feed(&best, 1, lg.data(), true);
  }
  return out;
}

}  // namespace rope_test
