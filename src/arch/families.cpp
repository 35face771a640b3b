#include "arch/families.h"

namespace qlft {

namespace {

const ArchFamily kFamilies[] = {
    // name  hf_class  gguf_arch  gguf_qk_adjacent  qkv_bias  qk_norm  fused  gemma  moe
    {"llama", "LlamaForCausalLM", "llama", true, false, false, false, false, false},
    {"mistral", "MistralForCausalLM", "llama", true, false, false, false, false, false},
    {"qwen2", "Qwen2ForCausalLM", "qwen2", false, true, false, false, false, false},
    {"qwen3", "Qwen3ForCausalLM", "qwen3", false, false, true, false, false, false},
    {"phi3", "Phi3ForCausalLM", "phi3", false, false, false, true, false, false},
    {"gemma2", "Gemma2ForCausalLM", "gemma2", false, false, false, false, true, false},
    {"gemma3_text", "Gemma3ForCausalLM", "gemma3", false, false, true, false, true, false},
    // Llama's attention with mixture-of-experts MLPs (ModelConfig::moe; llama.cpp: "llama" with
    // expert tensors).
    {"mixtral", "MixtralForCausalLM", "llama", true, false, false, false, false, true},
    // Qwen3's attention (q / k norms) with experts on the layers decoder_sparse_step and
    // mlp_only_layers leave to them.
    {"qwen3_moe", "Qwen3MoeForCausalLM", "qwen3moe", false, false, true, false, false, true},
};

// Architectures people bring that qlft recognizes but does not train, with what it lacks for
// them (matched on config.json's model_type or GGUF general.architecture, or the HF class).
struct Missing {
  const char* model_type;
  const char* hf_class;
  const char* what;
};
const Missing kMissing[] = {
    {"qwen3_next", "Qwen3NextForCausalLM",
     "hybrid linear-attention layers (Gated DeltaNet) and mixture-of-experts layers"},
    {"qwen2_moe", "Qwen2MoeForCausalLM", "mixture-of-experts layers (router, top-k experts)"},
    {"gpt_oss", "GptOssForCausalLM", "mixture-of-experts layers and attention sinks"},
    {"mamba", "MambaForCausalLM", "state-space (Mamba) layers instead of attention"},
    {"mamba2", "Mamba2ForCausalLM", "state-space (Mamba) layers instead of attention"},
    {"jamba", "JambaForCausalLM", "hybrid Mamba state-space and mixture-of-experts layers"},
    {"falcon_h1", "FalconH1ForCausalLM", "hybrid Mamba state-space layers"},
    {"rwkv", "RwkvForCausalLM", "RWKV recurrent layers instead of attention"},
};

}  // namespace

std::string missing_for(const std::string& cls, const std::string& model_type) {
  for (const Missing& m : kMissing)
    if ((!model_type.empty() && model_type == m.model_type) || (!cls.empty() && cls == m.hf_class))
      return m.what;
  return "";
}

std::string unsupported_architecture(const std::string& cls, const std::string& model_type) {
  std::string s = "architecture '" + (cls.empty() ? model_type : cls) + "'";
  if (!cls.empty() && !model_type.empty()) s += " (model_type '" + model_type + "')";
  const std::string why = missing_for(cls, model_type);
  s += why.empty() ? " is not one qlft trains" : " is not supported: qlft lacks its " + why;
  return s + " (qlft trains " + family_names() + ")";
}

const ArchFamily* find_family(const std::string& name) {
  for (const ArchFamily& f : kFamilies)
    if (name == f.name) return &f;
  return nullptr;
}

const ArchFamily* find_family_gguf(const std::string& arch) {
  for (const ArchFamily& f : kFamilies)
    if (arch == f.gguf_arch) return &f;
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
