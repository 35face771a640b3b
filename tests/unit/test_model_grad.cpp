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

  GradSetup(const std::string& name, float dropout, int seq = 8) {
    model = load_model(&tr, model_fixture(name), keep());
    be = make_cpu_backend(&tr);
    LoraConfig lc;
    lc.r = 4;
    lc.alpha = 8;
    lc.dropout = dropout;
    lc.init_seed = 7;
    lora = std::make_unique<LoraAdapter>(&tr, model->shapes, lc);
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

// Central differences for the largest-gradient entry of every `stride`-th adapter tensor.
void fd_check(GradSetup& s, uint64_t seed, int stride = 1) {
  s.lora->zero_grad();
  s.run->forward(s.b, 0.f, seed);
  s.run->backward();
  const float eps = 2e-3f;
  int checked = 0;
  double worst = 0;
  auto params = s.lora->params();
  for (size_t pi = 0; pi < params.size(); pi += stride) {
    auto& p = params[pi];
    // Pick the entry with the largest |gradient| of this tensor.
    std::vector<int64_t> idx(p.n);
    for (int64_t i = 0; i < p.n; ++i) idx[i] = i;
    std::partial_sort(idx.begin(), idx.begin() + 1, idx.end(),
                      [&](int64_t a, int64_t b) { return std::fabs(p.g[a]) > std::fabs(p.g[b]); });
    for (int k = 0; k < 1; ++k) {
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
  fd_check(s, 12345, 3);
}

namespace {
std::vector<std::vector<float>> all_grads(LoraAdapter& a) {
  std::vector<std::vector<float>> v;
  for (auto& p : a.params()) v.emplace_back(p.g, p.g + p.n);
  return v;
}
double worst_diff(const std::vector<std::vector<float>>& a,
                  const std::vector<std::vector<float>>& b, double factor = 1.0) {
  double w = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    std::vector<float> s(b[i]);
    for (float& x : s) x *= static_cast<float>(factor);
    w = std::max(w, max_rel_error(a[i].data(), s.data(), s.size()));
  }
  return w;
}
}  // namespace

// Recomputing checkpointed layers in backward reproduces the stored-activation gradients.
TEST(ModelGrad, CheckpointingGivesSameGradients) {
  GradSetup s("syn_qwen2", 0.1f, 16);
  s.lora->zero_grad();
  double l0 = s.run->forward(s.b, 0.f, 99).mean();
  s.run->backward();
  auto g0 = all_grads(*s.lora);
  for (int mode = 0; mode < 2; ++mode) {
    if (mode == 0)
      s.run->set_checkpoint_all(true);
    else {
      s.run->set_checkpoint_all(false);
      s.run->set_checkpoint(1, true);
    }
    s.lora->zero_grad();
    double l1 = s.run->forward(s.b, 0.f, 99).mean();
    s.run->backward();
    EXPECT_EQ(l0, l1);
    EXPECT_EQ(worst_diff(all_grads(*s.lora), g0), 0.0) << "mode " << mode;
  }
}

// Backward accumulates: two identical micro-batches give twice the gradient.
TEST(ModelGrad, GradientsAccumulate) {
  GradSetup s("syn_llama", 0.f);
  s.lora->zero_grad();
  s.run->forward(s.b);
  s.run->backward();
  auto g1 = all_grads(*s.lora);
  s.run->forward(s.b);
  s.run->backward();
  EXPECT_LT(worst_diff(all_grads(*s.lora), g1, 2.0), 1e-6);
  EXPECT_THROW(s.run->backward(), Error);  // no forward to go back through
}

// Sequence packing: two documents in one row (doc ids + restarted positions) give the same
// logits, loss and gradients as the documents run as separate rows.
TEST(ModelGrad, PackedBatchEqualsSeparateDocuments) {
  GradSetup s("syn_qwen2", 0.f, 16);
  const int n1 = 7, n2 = 9, V = s.model->cfg.vocab;
  std::vector<int32_t> tok(s.tok.begin(), s.tok.begin() + 16),
      tgt(s.tgt.begin(), s.tgt.begin() + 16);
  tgt[n1 - 1] = kIgnoreIndex;  // no target across the document boundary
  std::vector<int32_t> pos(16), doc(16);
  for (int i = 0; i < 16; ++i) {
    pos[i] = i < n1 ? i : i - n1;
    doc[i] = i < n1 ? 0 : 1;
  }
  TokenBatch packed;
  packed.batch = 1;
  packed.seq = 16;
  packed.tokens = tok.data();
  packed.targets = tgt.data();
  packed.positions = pos.data();
  packed.doc_ids = doc.data();
  std::vector<float> lp(16 * V);
  LossResult rp = s.run->logits(packed, MatF(lp.data(), 16, V));
  s.lora->zero_grad();
  s.run->forward(packed);
  s.run->backward();
  auto gp = all_grads(*s.lora);

  LlamaRunner sep(*s.model, *s.be, s.lora.get());
  s.lora->zero_grad();
  double sum = 0;
  int64_t count = 0;
  for (int d = 0; d < 2; ++d) {
    const int off = d ? n1 : 0, n = d ? n2 : n1;
    TokenBatch b;
    b.batch = 1;
    b.seq = n;
    b.tokens = tok.data() + off;
    b.targets = tgt.data() + off;
    std::vector<float> l(n * V);
    LossResult r = sep.logits(b, MatF(l.data(), n, V));
    sum += r.loss_sum;
    count += r.count;
    EXPECT_LT(max_rel_error(l.data(), lp.data() + off * V, l.size()), 1e-5) << "doc " << d;
    sep.forward(b, 1.f / static_cast<float>(rp.count));
    sep.backward();
  }
  EXPECT_EQ(count, rp.count);
  EXPECT_NEAR(sum, rp.loss_sum, 1e-5 * std::fabs(sum));
  EXPECT_LT(worst_diff(all_grads(*s.lora), gp), 1e-5);
}

// Bad input is an error, not a crash.
TEST(ModelGrad, RejectsBadTokensAndTargets) {
  GradSetup s("syn_qwen2", 0.f);
  std::vector<int32_t> tok(s.tok), tgt(s.tgt);
  TokenBatch b = s.b;
  b.tokens = tok.data();
  b.targets = tgt.data();
  tgt[2] = s.model->cfg.vocab;
  EXPECT_THROW(s.run->forward(b), Error);
  tgt[2] = 0;
  tok[5] = -1;
  EXPECT_THROW(s.run->forward(b), Error);
  tok[5] = 0;
  b.batch = 0;
  EXPECT_THROW(s.run->forward(b), Error);
}
