// SmolLM2-135M-Instruct against transformers (+PEFT), through the public API: the ids qlft gives
// with the model's own BOS/EOS rule (its GGUF says add_bos_token = false) from the GGUF, from the
// Hugging Face tokenizer files transformers saves for it and from the loaded model, and the
// greedy continuation with a fixed LoRA adapter on the base kept as stored (quant.type keep).
// Expected values: tests/reference/gen_smollm2_fixtures.py (transformers and PEFT).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api/api_session.h"
#include "support/test_support.h"

namespace {

const char* kModel = "models/smollm2-135m-instruct-q4_1.gguf";

nlohmann::json expected() {
  auto raw = qlft_test::read_file(qlft_test::fixture_path("smollm2/expected.json"));
  return nlohmann::json::parse(raw.begin(), raw.end());
}

std::vector<int32_t> ids_of(const nlohmann::json& j) {
  return j.get<std::vector<int32_t>>();
}

struct TokenizerHandle {
  qlft_tokenizer* t = nullptr;
  ~TokenizerHandle() { qlft_tokenizer_free(t); }
};

std::vector<int32_t> encode(const qlft_tokenizer* t, const std::string& text) {
  size_t n = 0;
  EXPECT_EQ(qlft_tokenizer_encode(t, text.data(), text.size(), QLFT_ADD_SPECIAL_AS_MODEL, 0,
                                  nullptr, 0, &n),
            QLFT_OK)
      << qlft_last_error();
  std::vector<int32_t> ids(n);
  EXPECT_EQ(qlft_tokenizer_encode(t, text.data(), text.size(), QLFT_ADD_SPECIAL_AS_MODEL, 0,
                                  ids.data(), ids.size(), &n),
            QLFT_OK)
      << qlft_last_error();
  return ids;
}

void check_texts(const std::string& path, const char* key) {
  TokenizerHandle h;
  ASSERT_EQ(qlft_tokenizer_load(path.c_str(), &h.t), QLFT_OK) << qlft_last_error();
  const auto e = expected();
  ASSERT_GE(e["texts"].size(), 10u);
  for (const auto& c : e["texts"]) {
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(encode(h.t, text), ids_of(c[key])) << "text: '" << text << "'";
  }
}

// The greedy continuation of the fixture's prompt, as token ids.
std::vector<int32_t> continuation(qlft_test::Session& s, bool with_adapter, size_t n) {
  std::vector<int32_t> out;
  if (with_adapter) {
    EXPECT_EQ(qlft_trainer_create(s.model, nullptr, s.cfg, &s.trainer), QLFT_OK)
        << qlft_last_error();
  }
  const std::string prompt = expected()["prompt"].get<std::string>();
  qlft_generation* g = nullptr;
  EXPECT_EQ(qlft_generation_create(s.model, with_adapter ? s.trainer : nullptr, prompt.c_str(),
                                   s.cfg, nullptr, 0, &g),
            QLFT_OK)
      << qlft_last_error();
  if (!g) return out;
  for (size_t i = 0; i <= n; ++i) {
    qlft_generated_token t{};
    t.struct_size = sizeof t;
    if (qlft_generation_next(g, &t) != QLFT_OK) {
      ADD_FAILURE() << qlft_last_error();
      break;
    }
    if (t.id >= 0) out.push_back(t.id);
    if (t.finish_reason != QLFT_FINISH_NONE) break;
  }
  qlft_generation_free(g);
  return out;
}

}  // namespace

TEST(Smollm2Reference, TokenizeFromGgufMatchesTransformers) {
  QLFT_NEED_SHARED(gguf, kModel);
  check_texts(gguf, "ids_gguf");
}

TEST(Smollm2Reference, TokenizeFromHfTokenizerFilesMatchesTransformers) {
  check_texts(qlft_test::fixture_path("smollm2/hf-tokenizer"), "ids_hf");
}

TEST(Smollm2Reference, GreedyContinuationWithAdapterMatchesPeft) {
  QLFT_NEED_SHARED(gguf, kModel);
  const auto e = expected();
  const auto want_base = ids_of(e["base"]["ids"]), want_lora = ids_of(e["adapter"]["ids"]);
  ASSERT_NE(want_base, want_lora) << "the fixture's adapter must change the continuation";
  qlft_test::Session s;
  ASSERT_EQ(qlft_config_create(&s.cfg), QLFT_OK);
  s.set("threads", "2");
  s.set("quant.type", "keep");
  s.set("generate.temperature", "0");
  s.set("generate.max_tokens", std::to_string(want_lora.size()).c_str());
  s.set("lora.init_from", qlft_test::fixture_path("smollm2/adapter").c_str());
  ASSERT_EQ(qlft_runtime_create(s.cfg, &s.rt), QLFT_OK) << qlft_last_error();
  ASSERT_EQ(qlft_model_load(s.rt, gguf.c_str(), s.cfg, &s.model), QLFT_OK) << qlft_last_error();

  // The prompt as the model's tokenizer encodes it (no BOS for SmolLM2).
  const std::string prompt = e["prompt"].get<std::string>();
  size_t n = 0;
  std::vector<int32_t> ids(64);
  ASSERT_EQ(qlft_tokenize(s.model, prompt.data(), prompt.size(), QLFT_ADD_SPECIAL_AS_MODEL, 0,
                          ids.data(), ids.size(), &n),
            QLFT_OK)
      << qlft_last_error();
  ids.resize(n);
  EXPECT_EQ(ids, ids_of(e["prompt_ids"]));

  EXPECT_EQ(continuation(s, false, want_lora.size()),
            std::vector<int32_t>(want_base.begin(),
                                 want_base.begin() + std::min(want_base.size(), want_lora.size())));
  EXPECT_EQ(continuation(s, true, want_lora.size()), want_lora);
}
