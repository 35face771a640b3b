#include "arch/model_shapes.h"

namespace qlft {

ModelShapes model_shapes(const ModelConfig& c) {
  ModelShapes s;
  static_cast<ModelDims&>(s) = c;
  s.arch = c.arch;
  s.tied_head = c.tied_embeddings;
  s.qk_adjacent = c.rope_adjacent;
  s.hf_prefix = c.hf_prefix;
  s.image_text = c.image_text;
  // Llama's layer (mistral, qwen2 and qwen3 alike; qwen2 adds q/k/v biases, qwen3 q/k norms): the
  // projection-shape table, [out, in] in Proj order.
  const int64_t q = s.q_dim(), kv = s.kv_dim(), d = c.dim, f = c.ffn_dim;
  LayerShapes l;
  const ProjShape table[kProjCount] = {{q, d}, {kv, d}, {kv, d}, {d, q}, {f, d}, {f, d}, {d, f}};
  for (int p = 0; p < kProjCount; ++p) l.proj[p] = table[p];
  l.norm = d;
  l.qkv_bias = c.qkv_bias;
  l.qk_norm = c.qk_norm ? c.head_dim : 0;
  l.post_norm = c.gemma ? d : 0;
  s.layers.assign(static_cast<size_t>(c.n_layers), l);
  for (int i = 0; i < c.n_layers; ++i)
    s.layers[static_cast<size_t>(i)].window = c.layer_slides(i) ? c.sliding_window : 0;
  // Mixture-of-experts layers: the experts and the router instead of gate / up / down.
  for (int i = 0; i < c.n_layers; ++i) {
    if (!c.layer_moe(i)) continue;
    LayerShapes& m = s.layers[static_cast<size_t>(i)];
    for (Proj p : {Proj::Gate, Proj::Up, Proj::Down}) m.proj[static_cast<int>(p)] = ProjShape{};
    m.n_experts = c.moe.n_experts;
    m.top_k = c.moe.top_k;
    m.expert_ffn = c.moe.expert_ffn;
    m.norm_topk = c.moe.norm_topk;
  }
  return s;
}

}  // namespace qlft
