#include "arch/families.h"

namespace qlft {

namespace {

const ArchFamily kFamilies[] = {
    // name       hf_class               gguf_arch  gguf_qk_adjacent  qkv_bias
    {"llama", "LlamaForCausalLM", "llama", true, false},
    {"mistral", "MistralForCausalLM", "llama", true, false},
    {"qwen2", "Qwen2ForCausalLM", "qwen2", false, true},
};

}  // namespace

const ArchFamily* find_family(const std::string& name) {
  for (const ArchFamily& f : kFamilies)
    if (name == f.name) return &f;
  return nullptr;
}

const ArchFamily* find_family_hf(const std::string& cls, const std::string& model_type) {
  for (const ArchFamily& f : kFamilies)
    if (cls == f.hf_class || model_type == f.name) return &f;
  return nullptr;
}

std::string family_names() {
  std::string s;
  for (const ArchFamily& f : kFamilies) s += (s.empty() ? "" : ", ") + std::string(f.name);
  return s;
}

}  // namespace qlft
