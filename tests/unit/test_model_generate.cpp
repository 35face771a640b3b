// Generation: KV-cache decoding against full recompute, greedy stories260K against the greedy
// continuation computed by the Hugging Face model (fixture), determinism across runs and thread
// counts, and the sampler against its definition.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/threads.h"
#include "model/generate.h"
#include "model/sampler.h"
#include "test_model_util.h"

using namespace qlft;
using namespace model_test;
using qlft_test::max_rel_error;

namespace {

std::vector<int32_t> greedy_stories(const Model& m, Backend& be, int n) {
  Generator g(m, be, nullptr);
  GenerateOptions o;
  o.max_tokens = n;
  return g.generate({1}, o);
}

}  // namespace

// Logits from the KV cache (prompt in one chunk, then token by token, then a chunk of 3) equal
// the full-sequence forward of LlamaRunner at every position, with the LoRA adapter on.
TEST(ModelGenerate, KvCacheLogitsEqualFullRecompute) {
  for (const char* name : {"syn_qwen2", "syn_llama.gguf"}) {
    SCOPED_TRACE(name);
    MemoryTracker tr;
    auto model = load_model(&tr, model_fixture(name), keep());
    const std::string fx = std::string(name).substr(0, 9) + ".lora.safetensors";
    Fixture f(model_fixture(fx));
    auto be = make_cpu_backend(&tr);
    LoraAdapter lora(&tr, model->shapes, lora_config_of(f));
    load_lora(f, lora);
    std::vector<int32_t> tok = f.i32("tokens");
    const int T = static_cast<int>(tok.size() / 2), V = model->cfg.vocab;

    LlamaRunner run(*model, *be, &lora);
    TokenBatch b;
    b.batch = 1;
    b.seq = T;
    b.tokens = tok.data();
    std::vector<float> full(T * V);
    run.logits(b, MatF(full.data(), T, V));

    Generator g(*model, *be, &lora, 64);
    std::vector<float> inc(T * V);
    g.feed(tok.data(), 5, inc.data(), false);
    int t = 5;
    for (; t < 12; ++t) g.feed(tok.data() + t, 1, inc.data() + t * V, true);
    g.feed(tok.data() + t, T - t, inc.data() + t * V, false);
    EXPECT_EQ(g.length(), T);
    EXPECT_LT(max_rel_error(inc.data(), full.data(), full.size()), 1e-5);
    // And the fixture's reference logits themselves (PEFT model).
    std::vector<float> ref = f.f32("logits");
    EXPECT_LT(max_rel_error(inc.data(), ref.data(), T * V), 1e-4);
  }
}

// Greedy from BOS: identical to the Hugging Face greedy continuation, across runs and across
// thread counts 1 and 2.
TEST(ModelGenerate, Stories260kGreedyMatchesReferenceAndIsDeterministic) {
  QLFT_NEED_SHARED(path, "models/stories260K.gguf");
  MemoryTracker tr;
  auto model = load_model(&tr, path, keep());
  auto be = make_cpu_backend(&tr);
  Fixture f(model_fixture("stories260k.safetensors"));
  std::vector<int32_t> ref = f.i32("greedy_bos");
  const int before = num_threads();
  set_num_threads(1);
  auto a = greedy_stories(*model, *be, static_cast<int>(ref.size()));
  auto a2 = greedy_stories(*model, *be, static_cast<int>(ref.size()));
  set_num_threads(2);
  auto b = greedy_stories(*model, *be, static_cast<int>(ref.size()));
  set_num_threads(before);
  EXPECT_EQ(a, ref);
  EXPECT_EQ(a, a2);
  EXPECT_EQ(a, b);
}

TEST(ModelGenerate, StopsAtEosAndContextLimit) {
  MemoryTracker tr;
  auto model = load_model(&tr, model_fixture("syn_qwen2"), keep());
  auto be = make_cpu_backend(&tr);
  Generator g(*model, *be, nullptr, 10);
  GenerateOptions o;
  o.max_tokens = 50;
  auto out = g.generate({3, 4}, o);
  EXPECT_EQ(out.size(), 9u);  // 2 prompt + 8 fed fill the 10 positions; the 9th is sampled last
  o.eos_id = out[2];
  auto out2 = g.generate({3, 4}, o);
  size_t first = 0;
  while (out2[first] != o.eos_id) ++first;
  EXPECT_EQ(out2.size(), first + 1);
  EXPECT_THROW(g.generate({}, o), Error);
  int seen = 0;
  auto out3 = g.generate({3}, o, [&](int32_t) { return ++seen < 3; });
  EXPECT_EQ(out3.size(), 3u);
}

TEST(ModelGenerate, SamplerGreedyTopKTopP) {
  std::vector<float> logits = {0.5f, 2.0f, 1.0f, 2.0f, -1.0f};
  SamplerConfig c;
  EXPECT_EQ(Sampler(c).sample(logits.data(), 5), 1);  // greedy, lowest id on ties
  c.temperature = 1.f;
  c.top_k = 1;
  EXPECT_EQ(Sampler(c).sample(logits.data(), 5), 1);
  // top_p small: only the best candidate survives.
  c.top_k = 0;
  c.top_p = 0.1f;
  for (int i = 0; i < 20; ++i) EXPECT_EQ(Sampler(c).sample(logits.data(), 5), 1);
}

// Sampled frequencies follow softmax(logits / T) restricted to top-k, renormalized.
TEST(ModelGenerate, SamplerFrequenciesFollowTheDistribution) {
  std::vector<float> logits = {1.0f, 0.0f, 2.0f, -0.5f, 1.5f};
  for (int variant = 0; variant < 3; ++variant) {
    SamplerConfig c;
    c.temperature = variant == 1 ? 0.7f : 1.3f;
    c.top_k = variant == 2 ? 3 : 0;
    c.seed = 11 + variant;
    Sampler s(c);
    std::vector<double> p(5, 0.0);
    double z = 0;
    for (int i = 0; i < 5; ++i) {
      bool in = c.top_k == 0 || logits[i] >= 1.0f;  // top 3 are ids 2, 4, 0
      p[i] = in ? std::exp(logits[i] / c.temperature) : 0;
      z += p[i];
    }
    const int N = 40000;
    std::vector<int> cnt(5, 0);
    for (int i = 0; i < N; ++i) ++cnt[s.sample(logits.data(), 5)];
    for (int i = 0; i < 5; ++i) {
      double expect = p[i] / z;
      double sd = std::sqrt(expect * (1 - expect) / N) + 1e-9;
      EXPECT_NEAR(cnt[i] / double(N), expect, 5 * sd + 1e-12)
          << "variant " << variant << " id " << i;
    }
  }
  // Same seed, same sequence; another seed, another sequence.
  SamplerConfig c;
  c.temperature = 1.f;
  c.seed = 5;
  Sampler a(c), b(c);
  c.seed = 6;
  Sampler d(c);
  int same = 0, diff = 0;
  for (int i = 0; i < 200; ++i) {
    int x = a.sample(logits.data(), 5);
    same += x == b.sample(logits.data(), 5);
    diff += x != d.sample(logits.data(), 5);
  }
  EXPECT_EQ(same, 200);
  EXPECT_GT(diff, 20);
}

// Temperature sampling with the adapter runs and is reproducible from the seed.
TEST(ModelGenerate, SeededSamplingIsReproducible) {
  MemoryTracker tr;
  auto model = load_model(&tr, model_fixture("syn_llama"), keep());
  Fixture f(model_fixture("syn_llama.lora.safetensors"));
  auto be = make_cpu_backend(&tr);
  LoraAdapter lora(&tr, model->shapes, lora_config_of(f));
  load_lora(f, lora);
  Generator g(*model, *be, &lora);
  GenerateOptions o;
  o.max_tokens = 30;
  o.sampler.temperature = 0.9f;
  o.sampler.top_k = 40;
  o.sampler.top_p = 0.95f;
  o.sampler.seed = 123;
  auto a = g.generate({5, 6, 7}, o);
  auto b = g.generate({5, 6, 7}, o);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.size(), 30u);
  o.sampler.seed = 124;
  EXPECT_NE(g.generate({5, 6, 7}, o), a);
}
