// One row per model family qlft trains: how each file format names it and the conventions its
// files follow. The loaders, the planner and export look a family up here; its tensor shapes
// are rows of arch/model_shapes.cpp and its computational deltas live in the runner
// (docs/ARCHITECTURE.md, "add an architecture").
#pragma once

#include <string>

namespace qlft {

struct ArchFamily {
  const char* name;       // ModelConfig::arch and config.json's model_type: "llama"
  const char* hf_class;   // config.json architectures[0]: "LlamaForCausalLM"
  const char* gguf_arch;  // general.architecture llama.cpp writes (mistral as "llama")
  // llama.cpp's converter stores q/k rows in adjacent-pair RoPE order (true) or keeps Hugging
  // Face's rotate-half order (false: NEOX rope).
  bool gguf_qk_adjacent;
  bool qkv_bias;  // q/k/v biases always (qwen2); otherwise attention_bias or the file says
  // Per-head RMSNorm of q and k before RoPE (qwen3: q_norm / k_norm weights of head_dim).
  bool qk_norm;
  // q / k / v stored as row blocks of one qkv_proj and gate / up of one gate_up_proj (phi3;
  // llama.cpp's attn_qkv and ffn_up): the loaders split them into the seven projections.
  bool fused;
  // Gemma's block (gemma2): RMSNorms scaled by (1 + w), a norm after attention and after the MLP
  // as well as before each (four per layer), GeGLU with tanh-approximated GELU, embeddings
  // multiplied by sqrt(hidden_size). GGUF files store the norms as 1 + w already.
  bool gemma;
  // Mixture-of-experts MLPs (ModelConfig::moe): a router and experts in place of the MLP on
  // some or all layers (mixtral, qwen3_moe).
  bool moe;
};

// The family named name (ModelConfig::arch); nullptr when qlft does not train it.
const ArchFamily* find_family(const std::string& name);
// The family of a GGUF general.architecture, the first in table order that llama.cpp writes so
// ("llama" for llama, mistral and, without expert_count, mixtral; "gemma3" for gemma3_text).
const ArchFamily* find_family_gguf(const std::string& arch);
// The family of a config.json: architectures[0] (cls) or model_type, in table order.
const ArchFamily* find_family_hf(const std::string& cls, const std::string& model_type);
// The families qlft trains, for error messages: "llama, mistral, qwen2, qwen3".
std::string family_names();
// Why qlft does not train an architecture it recognizes (its config.json architectures[0] /
// model_type, or GGUF general.architecture): what the runner lacks for it, e.g. "hybrid
// linear-attention layers (Gated DeltaNet) and mixture-of-experts layers"; "" when unknown.
std::string missing_for(const std::string& cls, const std::string& model_type);
// The message for an architecture qlft does not train: what it is, what is missing (when
// known) and the families qlft does train.
std::string unsupported_architecture(const std::string& cls, const std::string& model_type);

}  // namespace qlft
