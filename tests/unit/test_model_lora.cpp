// LoRA adapter bookkeeping: PEFT's init (kaiming-uniform a=sqrt(5) A, zero B) from a seed, the
// scale with and without rsLoRA, target parsing, settings keys, memory categories, and the q/k
// row permutation against llama.cpp's converter formula.
#include <gtest/gtest.h>

#include <cmath>

#include "config/config.h"
#include "test_model_util.h"

using namespace qlft;
using namespace model_test;

namespace {
ModelShapes tiny() {
  ModelConfig m;
  m.arch = "llama";
  m.n_layers = 2;
  m.dim = 64;
  m.n_heads = 8;
  m.n_kv_heads = 2;
  m.head_dim = 8;
  m.ffn_dim = 96;
  m.vocab = 100;
  m.rope_adjacent = true;
  return model_shapes(m);
}
}  // namespace

TEST(ModelLora, PeftInitFromSeed) {
  MemoryTracker tr;
  LoraConfig c;
  c.r = 16;
  c.init_seed = 9;
  LoraAdapter a(&tr, tiny(), c);
  for (int p = 0; p < kProjCount; ++p) {
    const LoraSlot& s = a.slot(1, static_cast<Proj>(p));
    ASSERT_TRUE(s.active());
    const float bound = 1.f / std::sqrt(static_cast<float>(s.in));
    const float* A = s.A.as<float>();
    const int64_t n = static_cast<int64_t>(c.r) * s.in;
    double mean = 0, var = 0, mx = 0;
    for (int64_t i = 0; i < n; ++i) {
      mean += A[i];
      var += double(A[i]) * A[i];
      mx = std::max(mx, double(std::fabs(A[i])));
    }
    mean /= n;
    var /= n;
    EXPECT_LE(mx, bound);
    EXPECT_GT(mx, 0.95 * bound);
    EXPECT_NEAR(mean, 0.0, 4 * bound / std::sqrt(3.0 * n));
    EXPECT_NEAR(var, bound * bound / 3.0, 0.15 * bound * bound / 3.0);  // U(-b, b) variance
    for (size_t i = 0; i < s.B.size() / 4; ++i) ASSERT_EQ(s.B.as<float>()[i], 0.f);
  }
  // Same seed, same values; another seed, other values; grads start at zero.
  LoraAdapter b(&tr, tiny(), c);
  c.init_seed = 10;
  LoraAdapter d(&tr, tiny(), c);
  const LoraSlot &sa = a.slot(0, Proj::Q), &sb = b.slot(0, Proj::Q), &sd = d.slot(0, Proj::Q);
  EXPECT_EQ(0, std::memcmp(sa.A.data(), sb.A.data(), sa.A.size()));
  EXPECT_NE(0, std::memcmp(sa.A.data(), sd.A.data(), sa.A.size()));
  EXPECT_NE(0, std::memcmp(a.slot(0, Proj::Q).A.data(), a.slot(0, Proj::K).A.data(), 64));
  for (size_t i = 0; i < sa.dA.size() / 4; ++i) ASSERT_EQ(sa.dA.as<float>()[i], 0.f);
}

TEST(ModelLora, ScaleTargetsAndMemory) {
  LoraConfig c;
  c.r = 16;
  c.alpha = 32;
  EXPECT_FLOAT_EQ(c.scale(), 2.f);
  c.use_rslora = true;
  EXPECT_FLOAT_EQ(c.scale(), 8.f);
  c.set_targets("q_proj, v_proj,attn_output");
  EXPECT_EQ(c.targets_string(), "q_proj,v_proj,o_proj");
  EXPECT_THROW(c.set_targets("q_proj,lm_head"), Error);
  EXPECT_THROW(c.set_targets(""), Error);

  MemoryTracker tr;
  c.r = 4;
  LoraAdapter a(&tr, tiny(), c);
  EXPECT_FALSE(a.slot(0, Proj::K).active());
  // q: A 4x64 + B 64x4; v: A 4x64 + B 16x4; o: A 4x64 + B 64x4 per layer.
  const uint64_t per_layer = (256 + 256) + (256 + 64) + (256 + 256);
  EXPECT_EQ(a.n_params(), 2 * per_layer);
  auto snap = tr.snapshot();
  EXPECT_EQ(snap.allocated[static_cast<int>(MemCategory::Adapter)], 2 * per_layer * 4);
  EXPECT_EQ(snap.allocated[static_cast<int>(MemCategory::Gradients)], 2 * per_layer * 4);
  c.r = 0;
  EXPECT_THROW(LoraAdapter(&tr, tiny(), c), Error);
}

TEST(ModelLora, ConfigFromKeys) {
  Config cfg;
  cfg.set("lora.r", "12");
  cfg.set("lora.alpha", "24");
  cfg.set("lora.dropout", "0.05");
  cfg.set("lora.use_rslora", "true");
  cfg.set("lora.target_modules", "gate_proj,up_proj,down_proj");
  cfg.set("seed", "77");
  LoraConfig c = lora_config_from(qlft::parse_run_spec(cfg).lora);
  EXPECT_EQ(c.r, 12);
  EXPECT_FLOAT_EQ(c.alpha, 24.f);
  EXPECT_FLOAT_EQ(c.dropout, 0.05f);
  EXPECT_TRUE(c.use_rslora);
  EXPECT_EQ(c.targets_string(), "gate_proj,up_proj,down_proj");
  EXPECT_EQ(c.init_seed, 77u);
  EXPECT_THROW(cfg.set("lora.target_modules", "q_proj,foo"), Error);
}

// llama.cpp's converter: w.reshape(n_head, 2, hd/2, cols).swapaxes(1, 2).reshape(...), i.e. GGUF
// row h*hd + 2j + i holds HF row h*hd + i*hd/2 + j.
TEST(ModelLora, RowPermutationMatchesLlamaCppConverter) {
  const int heads = 3, hd = 8, cols = 5, rows = heads * hd;
  std::vector<float> hf(rows * cols), gg(rows * cols), back(rows * cols);
  for (int i = 0; i < rows * cols; ++i) hf[i] = static_cast<float>(i);
  permute_rows_hf_to_adjacent(hf.data(), gg.data(), heads, hd, cols);
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < hd / 2; ++j)
        for (int c = 0; c < cols; ++c)
          ASSERT_EQ(gg[(h * hd + 2 * j + i) * cols + c], hf[(h * hd + i * hd / 2 + j) * cols + c]);
  permute_rows_adjacent_to_hf(gg.data(), back.data(), heads, hd, cols);
  EXPECT_EQ(back, hf);

  // set_hf / get_hf round trip through the adjacent order of a GGUF llama model.
  MemoryTracker tr;
  LoraConfig c;
  c.r = 2;
  LoraAdapter a(&tr, tiny(), c);
  std::vector<float> A(2 * 64), B(16 * 2);
  for (size_t i = 0; i < B.size(); ++i) B[i] = static_cast<float>(i);
  a.set_hf(0, Proj::K, A.data(), A.size(), B.data(), B.size());
  EXPECT_EQ(a.get_hf(0, Proj::K, LoraAdapter::Part::B), B);
  EXPECT_NE(0, std::memcmp(a.slot(0, Proj::K).B.data(), B.data(), B.size() * 4));
  EXPECT_THROW(a.set_hf(0, Proj::K, A.data(), A.size() - 1, B.data(), B.size()), Error);
}
