// llama.cpp LoRA GGUF of each family llama.cpp supports (issue 48): save_gguf_lora_adapter of the
// family fixture's adapter (tests/reference/fixtures/families/syn_<family>.lora.safetensors)
// against what llama.cpp's convert_lora_to_gguf.py writes for the same PEFT adapter
// (tests/reference/gen_lora_gguf_fixtures.py: the converter's name mapping through the base
// model's converter class, LlamaModel's q/k row permutation of lora_b, F32 lora_a [in, r] /
// lora_b [r, out], the adapter keys): the same tensors (name, type, shape, values) and keys.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "formats/gguf.h"
#include "gguf_compare.h"
#include "test_model_util.h"
#include "train/adapter_io.h"

using namespace qlft;
using namespace model_test;

namespace {

std::string fixture(const std::string& rel) {
  return qlft_test::fixture_path(rel);
}

// qlft's LoRA GGUF of fixtures/<lora> on the family's model against
// fixtures/lora_gguf/<want>.
void expect_as_llama_cpp_converts(const std::string& family, const std::string& lora,
                                  const std::string& want) {
  SCOPED_TRACE(lora);
  MemoryTracker tr;
  auto model = load_model(&tr, fixture("families/syn_" + family), keep());
  Fixture f(fixture(lora));
  LoraAdapter adapter(&tr, model->shapes, lora_config_of(f));
  load_lora_modules(f, adapter);
  const std::string dir = qlft_test::temp_dir("lora_gguf_" + family);
  save_gguf_lora_adapter(adapter, dir + "/adapter.gguf");
  auto ours = GgufFile::open(dir + "/adapter.gguf");
  auto ref = GgufFile::open(fixture("lora_gguf/" + want));

  std::set<std::string> ours_keys, ref_keys;
  for (const auto& kv : ours->metadata()) ours_keys.insert(kv.first);
  for (const auto& kv : ref->metadata()) ref_keys.insert(kv.first);
  EXPECT_EQ(ours_keys, ref_keys) << "metadata keys";
  for (const char* k : {"general.architecture", "general.type", "adapter.type"})
    EXPECT_EQ(ours->get_string(k, "?"), ref->get_string(k)) << k;
  EXPECT_EQ(ours->get_float("adapter.lora.alpha", -1), ref->get_float("adapter.lora.alpha", -2));

  const std::set<std::string> extra = expect_tensors_like(*ours, *ref, true);
  EXPECT_TRUE(extra.empty()) << "tensors the converter does not write: " << *extra.begin();
  std::filesystem::remove_all(dir);
}

}  // namespace

TEST(Families, Qwen3LoraGgufAsLlamaCppConverts) {
  expect_as_llama_cpp_converts("qwen3", "families/syn_qwen3.lora.safetensors",
                               "syn_qwen3.lora.gguf");
}

TEST(Families, Gemma2LoraGgufAsLlamaCppConverts) {
  expect_as_llama_cpp_converts("gemma2", "families/syn_gemma2.lora.safetensors",
                               "syn_gemma2.lora.gguf");
}

TEST(Families, Gemma3LoraGgufAsLlamaCppConverts) {
  expect_as_llama_cpp_converts("gemma3", "families/syn_gemma3.lora.safetensors",
                               "syn_gemma3.lora.gguf");
}

TEST(Families, Gemma3ImageTextLoraGgufAsLlamaCppConverts) {  // the text model's names
  expect_as_llama_cpp_converts("gemma3_vlm", "families/syn_gemma3_vlm.lora.safetensors",
                               "syn_gemma3_vlm.lora.gguf");
}

TEST(Families, Phi3LoraGgufAsLlamaCppConverts) {
  expect_as_llama_cpp_converts("phi3", "families/syn_phi3.lora.safetensors", "syn_phi3.lora.gguf");
  // The fused qkv_proj / gate_up_proj: llama.cpp's attn_qkv / ffn_up.
  expect_as_llama_cpp_converts("phi3", "families/syn_phi3.fused_lora.safetensors",
                               "syn_phi3.fused.lora.gguf");
}

TEST(Families, MistralLoraGgufAsLlamaCppConverts) {  // as "llama", q/k rows permuted
  expect_as_llama_cpp_converts("mistral", "families/syn_mistral.lora.safetensors",
                               "syn_mistral.lora.gguf");
}

TEST(Families, MixtralLoraGgufAsLlamaCppConverts) {
  expect_as_llama_cpp_converts("mixtral", "families/syn_mixtral.lora.safetensors",
                               "syn_mixtral.lora.gguf");
}

TEST(Families, Qwen3MoeLoraGgufAsLlamaCppConverts) {
  expect_as_llama_cpp_converts("qwen3_moe", "families/syn_qwen3_moe.lora.safetensors",
                               "syn_qwen3_moe.lora.gguf");
}

// LoRA on Mixtral's experts and router (PEFT's target_parameters, gate_up at rank 2r / alpha 2
// alpha): 3-D ffn_{gate,up,down}_exps lora_a / lora_b as the converter stacks the per-expert
// adapter, ffn_gate_inp's, lora_b carrying the part's scale beside alpha / rank.
TEST(Families, MixtralExpertLoraGgufAsLlamaCppConverts) {
  expect_as_llama_cpp_converts("mixtral", "moe_lora/syn_mixtral.moe_lora.safetensors",
                               "syn_mixtral.moe_lora.gguf");
}
