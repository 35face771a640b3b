#include "arch/model_shapes.h"

namespace qlft {

ModelShapes model_shapes(const ModelConfig& c) {
  ModelShapes s;
  s.arch = c.arch;
  s.n_heads = c.n_heads;
  s.n_kv_heads = c.n_kv_heads;
  s.head_dim = c.head_dim;
  s.n_layers = c.n_layers;
  s.dim = c.dim;
  s.ffn_dim = c.ffn_dim;
  s.vocab = c.vocab;
  s.tied_head = c.tied_embeddings;
  s.qk_adjacent = c.rope_adjacent;
  // Llama's layer (mistral and qwen2 alike; qwen2 adds q/k/v biases): the projection-shape
  // table, [out, in] in Proj order.
  const int64_t q = s.q_dim(), kv = s.kv_dim(), d = c.dim, f = c.ffn_dim;
  LayerShapes l;
  const ProjShape table[kProjCount] = {{q, d}, {kv, d}, {kv, d}, {d, q}, {f, d}, {f, d}, {d, f}};
  for (int p = 0; p < kProjCount; ++p) l.proj[p] = table[p];
  l.norm = d;
  l.qkv_bias = c.qkv_bias;
  s.layers.assign(static_cast<size_t>(c.n_layers), l);
  return s;
}

}  // namespace qlft
