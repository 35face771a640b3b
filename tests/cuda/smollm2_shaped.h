// A model of SmolLM2-135M's layer shapes with random weights, made in memory for the CUDA tests
// that need real widths without the model file (the launch list, the offload timeline).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "model/model.h"
#include "quant/qweight.h"

namespace qlft_cuda_test {

// SmolLM2-135M's layer widths (its config.json), n_layers layers, random NF4 weights (seed 45),
// fp32 embedding tied to the head, unit norms.
inline std::unique_ptr<qlft::Model> smollm2_shaped(qlft::MemoryTracker* t, int n_layers) {
  using namespace qlft;
  auto m = std::make_unique<Model>();
  ModelConfig& c = m->cfg;
  c.arch = "llama";
  c.n_layers = n_layers;
  c.dim = 576;
  c.n_heads = 9;
  c.n_kv_heads = 3;
  c.head_dim = 64;
  c.ffn_dim = 1536;
  c.vocab = 256;
  c.context_length = 2048;
  c.tied_embeddings = true;
  m->shapes = model_shapes(c);
  std::mt19937_64 g(45);
  auto weight = [&](int64_t rows, int64_t cols, QuantKind k) {
    std::normal_distribution<float> d(0.f, 0.04f);
    std::vector<float> w(size_t(rows * cols));
    for (float& x : w) x = d(g);
    return qweight_from_f32(t, w.data(), rows, cols, k, 64, false);
  };
  auto ones = [&](int n) {
    Buffer b(t, MemCategory::Weights, size_t(n) * 4, "norm");
    for (int i = 0; i < n; ++i) b.as<float>()[i] = 1.f;
    return b;
  };
  m->tok_embd = weight(c.vocab, c.dim, QuantKind::F32);
  m->output_norm = ones(c.dim);
  m->layers.resize(size_t(c.n_layers));
  for (LayerWeights& L : m->layers) {
    L.attn_norm = ones(c.dim);
    L.ffn_norm = ones(c.dim);
    for (int p = 0; p < kProjCount; ++p) {
      const ProjShape& ps = m->shapes.proj(0, static_cast<Proj>(p));
      L.proj[p] = weight(ps.out, ps.in, QuantKind::NF4);
    }
  }
  return m;
}

}  // namespace qlft_cuda_test
