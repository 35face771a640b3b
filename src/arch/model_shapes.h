// The one shape table of a model: every tensor's shape, derived once from its ModelConfig
// (model_shapes) when the model is loaded (Model::shapes) or its file is planned
// (train/planner.h). Loaders check the file's tensors against it, LoRA sizes its adapters by
// it, the runner, the workspace models, the planner, export and the CUDA backend read their
// dimensions from it: no other code multiplies heads by head_dim or lists projection shapes.
//
// A new architecture adds its rows here (model_shapes: e.g. per-layer shapes that differ,
// fused projections, experts) and its deltas in the runner; see docs/ARCHITECTURE.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "arch/model_config.h"

namespace qlft {

// A linear projection's weight [out, in] (y = x W^T).
struct ProjShape {
  int64_t out = 0, in = 0;
  bool operator==(const ProjShape&) const = default;
};

// One layer's tensors: its projections, its two norms [norm] (four with post_norm), its q/k/v
// biases [proj out] and its per-head q / k norms [qk_norm] when the model has them.
struct LayerShapes {
  ProjShape proj[kProjCount];
  int64_t norm = 0;       // attn_norm and ffn_norm length
  bool qkv_bias = false;  // q, k, v biases of length proj[Q/K/V].out
  int64_t qk_norm = 0;    // q_norm and k_norm length (head_dim; qwen3), 0: none
  int window = 0;         // sliding-window attention's window (AttnShape::window), 0: none
  // post_attention_norm and post_ffw_norm length (gemma: a norm after attention and after the
  // MLP, before each residual add), 0: none.
  int64_t post_norm = 0;
  // A mixture-of-experts MLP (ModelConfig::layer_moe): n_experts experts, each w1 / w3
  // [expert_ffn, norm] and w2 [norm, expert_ffn], a router [n_experts, norm]; the dense gate /
  // up / down rows of proj are then {0, 0} (absent). 0 experts: the dense MLP.
  int n_experts = 0, top_k = 0;
  int64_t expert_ffn = 0;
  bool norm_topk = true;
  bool moe() const { return n_experts > 0; }
  bool operator==(const LayerShapes&) const = default;
};

// ModelDims: the config's dimensions as the file states them (heads, layers, widths, vocab).
struct ModelShapes : ModelDims {
  std::string arch;        // the family whose row made the table (ModelConfig::arch)
  bool tied_head = false;  // the output head is the token embedding [vocab, dim]
  // q/k rows in GGUF llama order (RoPE on adjacent pairs) rather than Hugging Face's
  // rotate-half order (ModelConfig::rope_adjacent): LoRA and export permute q/k rows by it.
  bool qk_adjacent = false;
  // The Hugging Face prefix of the decoder's tensors (ModelConfig::hf_prefix): PEFT names an
  // adapter's tensors base_model.model.<hf_prefix>layers.N...; image_text: the language model
  // of an image-text checkpoint, which an adapter's target_modules must single out.
  std::string hf_prefix = "model.";
  bool image_text = false;
  std::vector<LayerShapes> layers;

  const ProjShape& proj(int layer, Proj p) const {
    return layers[static_cast<size_t>(layer)].proj[static_cast<int>(p)];
  }
  // The heads a projection's output rows are made of: q n_heads, k and v n_kv_heads, o and the
  // MLP's none (0).
  int heads_of(Proj p) const {
    return p == Proj::Q ? n_heads : (p == Proj::K || p == Proj::V) ? n_kv_heads : 0;
  }
  // Whether q and k are RMS-normalized per head before RoPE (every layer alike).
  bool qk_norm() const { return !layers.empty() && layers[0].qk_norm > 0; }
  // Whether each block's attention and MLP outputs are RMS-normalized before the residual add
  // (gemma; every layer alike).
  bool post_norm() const { return !layers.empty() && layers[0].post_norm > 0; }
  // Whether any layer's MLP is a mixture of experts.
  bool any_moe() const {
    for (const LayerShapes& l : layers)
      if (l.moe()) return true;
    return false;
  }
  // Embedding [vocab, dim] and head [vocab, dim] elements.
  int64_t embedding_numel() const { return int64_t(vocab) * dim; }
  bool operator==(const ModelShapes&) const = default;
};

// The shape table of c (c checked by check_model_config first).
ModelShapes model_shapes(const ModelConfig& c);

}  // namespace qlft
