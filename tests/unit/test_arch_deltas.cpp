// describe_deltas (what `qlft-finetune inspect` prints as "deltas") on the committed family
// fixtures' config.json: the expected facts are the fixtures' own keys (model_type,
// sliding_window, num_hidden_layers, tie_word_embeddings, rope_scaling), written out by hand.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "arch/deltas.h"
#include "formats/json_file.h"
#include "model/model.h"
#include "support/test_support.h"

using namespace qlft;

namespace {

// The config load_model reads from a fixture directory's config.json (weights not opened).
std::string deltas_of(const std::string& fixture_dir) {
  const std::string path = qlft_test::fixture_path(fixture_dir + "/config.json");
  const ModelConfig c = read_hf_config(JsonFile::load(path), "", nullptr);
  return describe_deltas(c, model_shapes(c));
}

std::string deltas_of_json(const nlohmann::json& j) {
  const ModelConfig c = read_hf_config(JsonFile::parse(j.dump(), "config.json"), "", nullptr);
  return describe_deltas(c, model_shapes(c));
}

}  // namespace

TEST(ArchDeltas, FamilyFixtures) {
  // syn_llama: model_type llama, tie_word_embeddings false, rope_type default.
  EXPECT_EQ(deltas_of("model/syn_llama"), "none");
  // syn_qwen2: qwen2 always has q/k/v biases; tie_word_embeddings true.
  EXPECT_EQ(deltas_of("model/syn_qwen2"), "q/k/v bias, tied head");
  // syn_qwen3: q_norm / k_norm, attention_bias false, use_sliding_window false, tied.
  EXPECT_EQ(deltas_of("families/syn_qwen3"), "q/k RMSNorm per head, tied head");
  // syn_mistral: sliding_window 5, num_hidden_layers 2 (mistral slides every layer).
  EXPECT_EQ(deltas_of("families/syn_mistral"), "sliding window 5 on 2 of 2 layers");
  // syn_phi3: qkv_proj / gate_up_proj fused, sliding_window null, untied.
  EXPECT_EQ(deltas_of("families/syn_phi3"), "fused qkv_proj and gate_up_proj (split on load)");
  // syn_gemma2: sliding_window 5 with layer_types sliding / full / sliding, query_pre_attn_scalar
  // 24 (head_dim 16), attn_logit_softcapping 4, final_logit_softcapping 8, tied.
  EXPECT_EQ(deltas_of("families/syn_gemma2"),
            "sliding window 5 on 2 of 3 layers, (1 + w) RMSNorms, post-attention and "
            "post-feedforward norms, GeGLU (tanh GELU), embeddings times sqrt(hidden), attention "
            "scaled by query_pre_attn_scalar 24^-0.5, attention logits soft-capped at 4, final "
            "logits soft-capped at 8, tied head");
  // syn_gemma3: gemma3_text (q_norm / k_norm), layer_types sliding / sliding / full, no caps,
  // rope_parameters full_attention linear factor 2 theta 1e6, sliding_attention theta 1e4.
  EXPECT_EQ(deltas_of("families/syn_gemma3"),
            "q/k RMSNorm per head, sliding window 5 on 2 of 3 layers, (1 + w) RMSNorms, "
            "post-attention and post-feedforward norms, GeGLU (tanh GELU), embeddings times "
            "sqrt(hidden), attention scaled by query_pre_attn_scalar 24^-0.5, RoPE base 10000 on "
            "sliding layers, 1000000 on full ones, tied head, rope scaling linear");
}

// The per-layer window (qwen2's max_window_layers: layers from it on slide) and llama3 rope
// scaling, from a config written here (Llama 3.1's rope_scaling block).
TEST(ArchDeltas, PartialWindowAndRopeScaling) {
  nlohmann::json q = {{"architectures", {"Qwen2ForCausalLM"}},
                      {"model_type", "qwen2"},
                      {"hidden_size", 32},
                      {"intermediate_size", 64},
                      {"num_hidden_layers", 6},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"vocab_size", 160},
                      {"tie_word_embeddings", false},
                      {"use_sliding_window", true},
                      {"sliding_window", 4096},
                      {"max_window_layers", 2}};
  EXPECT_EQ(deltas_of_json(q), "q/k/v bias, sliding window 4096 on 4 of 6 layers");
  nlohmann::json l = {{"architectures", {"LlamaForCausalLM"}},
                      {"model_type", "llama"},
                      {"hidden_size", 32},
                      {"intermediate_size", 64},
                      {"num_hidden_layers", 2},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"vocab_size", 160},
                      {"tie_word_embeddings", false},
                      {"rope_scaling",
                       {{"rope_type", "llama3"},
                        {"factor", 8.0},
                        {"low_freq_factor", 1.0},
                        {"high_freq_factor", 4.0},
                        {"original_max_position_embeddings", 8192}}}};
  EXPECT_EQ(deltas_of_json(l), "rope scaling llama3");
}
