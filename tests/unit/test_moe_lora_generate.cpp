// Generation with LoRA on an MoE model's experts and router (PEFT's target_parameters on
// syn_mixtral, fixtures/moe_lora): the Generator's KV-cache path applies the expert / router
// LoRA as LlamaRunner's full forward does (logits at every position, greedy ids), and a
// generator without the expert LoRA differs (the check can fail).
#include <gtest/gtest.h>

#include <algorithm>

#include "core/threads.h"
#include "model/generate.h"
#include "test_model_util.h"

using namespace qlft;
using namespace model_test;
using qlft_test::max_rel_error;

namespace {

// The runner's logits of tok [1, n] (full recompute).
std::vector<float> runner_logits(const Model& m, Backend& be, LoraAdapter* lora,
                                 std::vector<int32_t> tok) {
  LlamaRunner run(m, be, lora);
  TokenBatch b;
  b.batch = 1;
  b.seq = static_cast<int>(tok.size());
  b.tokens = tok.data();
  std::vector<float> out(tok.size() * static_cast<size_t>(m.cfg.vocab));
  run.logits(b, MatF(out.data(), b.seq, m.cfg.vocab));
  return out;
}

}  // namespace

TEST(MoeLoraGenerate, KvCacheAndGreedyFollowRunnerWithExpertLora) {
  set_num_threads(1);
  MemoryTracker tr;
  auto model = load_model(&tr, qlft_test::fixture_path("families/syn_mixtral"), keep());
  Fixture f(qlft_test::fixture_path("moe_lora/syn_mixtral.moe_lora.safetensors"));
  auto be = make_cpu_backend(&tr);
  LoraAdapter lora(&tr, model->shapes, lora_config_of(f));
  load_lora_modules(f, lora);
  ASSERT_TRUE(lora.has_moe());
  const std::vector<int32_t> all = f.i32("tokens");
  const int T = static_cast<int>(f.shape("tokens")[1]), V = model->cfg.vocab;
  const std::vector<int32_t> tok(all.begin(), all.begin() + T);
  const std::vector<float> full = runner_logits(*model, *be, &lora, tok);

  // Prompt in one chunk, then token by token, then a chunk.
  Generator g(*model, *be, &lora, 64);
  std::vector<float> inc(static_cast<size_t>(T) * V);
  g.feed(tok.data(), 5, inc.data(), false);
  int t = 5;
  for (; t < 10; ++t) g.feed(tok.data() + t, 1, inc.data() + size_t(t) * V, true);
  g.feed(tok.data() + t, T - t, inc.data() + size_t(t) * V, false);
  EXPECT_LT(max_rel_error(inc.data(), full.data(), full.size()), 1e-5);

  // Without the expert / router LoRA (q / v only) the logits are not these.
  LoraConfig qv = lora_config_of(f);
  qv.set_targets("q_proj,v_proj");
  LoraAdapter attn(&tr, model->shapes, qv);
  load_lora_modules(f, attn);
  Generator ga(*model, *be, &attn, 64);
  std::vector<float> other(full.size());
  ga.feed(tok.data(), T, other.data(), false);
  EXPECT_GT(max_rel_error(other.data(), full.data(), full.size()), 1e-3);

  // Greedy ids: each the argmax of the runner's logits over the sequence so far.
  const std::vector<int32_t> prompt(tok.begin(), tok.begin() + 6);
  Generator gg(*model, *be, &lora, 64);
  GenerateOptions o;
  o.max_tokens = 8;
  const std::vector<int32_t> ids = gg.generate(prompt, o);
  std::vector<int32_t> seq = prompt, want;
  for (int i = 0; i < o.max_tokens; ++i) {
    const std::vector<float> l = runner_logits(*model, *be, &lora, seq);
    const float* last = l.data() + (seq.size() - 1) * size_t(V);
    const int32_t id = static_cast<int32_t>(std::max_element(last, last + V) - last);
    want.push_back(id);
    seq.push_back(id);
  }
  EXPECT_EQ(ids, want);
}
