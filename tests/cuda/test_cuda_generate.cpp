// Generation on the CUDA backend (the emulator in the cuda-emu build) with the KV cache in device
// memory (model/generate.h): the decode ops against the CPU backend's on random inputs (GQA,
// sliding window, a causal offset) and against full attention; incremental logits against
// transformers' (the model fixtures with their PEFT adapter) and the CPU backend's; and a greedy
// step's traffic, read from the backend's transfer counters: one int32 id in, one out, one wait.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "model/generate.h"
#include "model/sampler.h"
#include "unit/test_model_util.h"

using namespace qlft;
using qlft_cuda_test::norm_err;

namespace {

std::unique_ptr<Backend> fp32_gpu(MemoryTracker* tr) {
  CudaBackendOptions o;
  o.spec.precision = Precision::FP32;
  return make_cuda_backend(tr, o);
}

std::vector<float> normal(std::mt19937_64& g, size_t n) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// values in be's memory (a device buffer on the GPU backend).
Buffer put(const Backend& be, const std::vector<float>& v) {
  Buffer b = be.alloc(MemCategory::Activations, v.size() * 4, "test input", BufferInit::Uninit);
  b.copy_from_host(v.data(), v.size() * 4);
  return b;
}
std::vector<float> get(const Buffer& b) {
  std::vector<float> v(b.size() / 4);
  b.copy_to_host(v.data(), b.size());
  return v;
}

struct Moved {
  uint64_t h2d, d2h, syncs, launches;
};
Moved since(const Backend& be, const TransferCounts& t0) {
  const TransferCounts t = be.transfers();
  return {t.host_to_device - t0.host_to_device, t.device_to_host - t0.device_to_host,
          t.syncs - t0.syncs, t.launches - t0.launches};
}

std::string fixture(const char* family) {
  const std::string f = family;
  return f == "qwen2" ? model_test::model_fixture("syn_qwen2")
                      : qlft_test::fixture_path("families/syn_" + f);
}
std::string lora_fixture(const char* family) {
  const std::string f = family;
  return f == "qwen2" ? model_test::model_fixture("syn_qwen2.lora.safetensors")
                      : qlft_test::fixture_path("families/syn_" + f + ".lora.safetensors");
}

// The Generator's logits of tok on be: the first 5 in one chunk, then token by token up to 8,
// then the rest in one chunk.
std::vector<float> logits_on(const Model& m, Backend& be, const LoraAdapter& lora,
                             const std::vector<int32_t>& tok) {
  const int T = static_cast<int>(tok.size()), V = m.cfg.vocab;
  Generator g(m, be, &lora, 64);
  std::vector<float> out(size_t(T) * V);
  g.feed(tok.data(), 5, out.data(), false);
  int t = 5;
  for (; t < 8; ++t) g.feed(tok.data() + t, 1, out.data() + size_t(t) * V, true);
  g.feed(tok.data() + t, T - t, out.data() + size_t(t) * V, false);
  return out;
}

}  // namespace

// attention_decode on device buffers: the CUDA kernel against the CPU backend's loop, and that
// loop against the CPU's full causal attention_fwd over the whole sequence (a second code path:
// its last n rows are the decode rows). Shapes cover GQA, head dims across the kernel's lane
// chunks (8, 40, 64, 128), one and several new rows, no cache, and windows shorter and longer
// than the cache. The device call runs in place: nothing staged.
TEST(CudaGenerate, DecodeAttentionEqualsCpu) {
  QLFT_NEED_GPU();
  MemoryTracker tr;
  auto cpu = make_cpu_backend(&tr);
  auto gpu = fp32_gpu(&tr);
  std::mt19937_64 rng(5);
  struct Case {
    int heads, kv, dim, past, n, window;
  };
  for (const Case c :
       {Case{4, 2, 8, 37, 1, 0}, Case{8, 2, 64, 50, 5, 16}, Case{3, 3, 40, 0, 9, 0},
        Case{2, 1, 128, 70, 1, 33}, Case{6, 3, 64, 12, 3, 1}, Case{4, 1, 32, 200, 2, 500}}) {
    SCOPED_TRACE(testing::Message()
                 << "heads " << c.heads << "/" << c.kv << " dim " << c.dim << " past " << c.past
                 << " n " << c.n << " window " << c.window);
    HeadGeometry g;
    g.n_heads = c.heads;
    g.n_kv_heads = c.kv;
    g.head_dim = c.dim;
    const int total = c.past + c.n;
    const int64_t qd = g.q_dim(), kvd = g.kv_dim();
    // Full-sequence q (the decode rows are its last n) and the cache holding every row's k / v.
    const std::vector<float> qf = normal(rng, size_t(total * qd)),
                             k = normal(rng, size_t(total * kvd)),
                             v = normal(rng, size_t(total * kvd));
    const std::vector<float> q(qf.end() - c.n * qd, qf.end());
    std::vector<float> o_cpu(size_t(c.n * qd));
    cpu->attention_decode(g, c.window, c.past, CMatF(q.data(), c.n, qd, qd), k.data(), v.data(),
                          MatF(o_cpu.data(), c.n, qd, qd));

    Buffer dq = put(*gpu, q), dk = put(*gpu, k), dv = put(*gpu, v);
    Buffer dout = gpu->alloc(MemCategory::Activations, q.size() * 4, "test out");
    const TransferCounts t0 = gpu->transfers();
    gpu->attention_decode(g, c.window, c.past, CMatF(dq.as<float>(), c.n, qd, qd), dk.as<float>(),
                          dv.as<float>(), MatF(dout.as<float>(), c.n, qd, qd));
    const Moved m = since(*gpu, t0);
    EXPECT_EQ(m.h2d, 0u);
    EXPECT_EQ(m.d2h, 0u);
    EXPECT_EQ(m.syncs, 0u);
    const std::vector<float> o_gpu = get(dout);
    EXPECT_LT(norm_err(o_gpu, o_cpu), 1e-5);

    AttnShape s;
    static_cast<HeadGeometry&>(s) = g;
    s.seq = total;
    s.window = c.window;
    std::vector<float> full(size_t(total * qd));
    cpu->attention_fwd(s, CMatF(qf.data(), total, qd, qd), CMatF(k.data(), total, kvd, kvd),
                       CMatF(v.data(), total, kvd, kvd), MatF(full.data(), total, qd, qd), nullptr);
    const std::vector<float> tail(full.end() - c.n * qd, full.end());
    EXPECT_LT(norm_err(o_cpu, tail), 1e-5);
  }
}

// Greedy selection on the device equals the host Sampler's argmax (lowest id on ties, -inf and
// a vocabulary wider than the kernel's block), moving one int32 back; positions are written on
// the device.
TEST(CudaGenerate, ArgmaxTiesAndPositionsOnDevice) {
  QLFT_NEED_GPU();
  MemoryTracker tr;
  auto gpu = fp32_gpu(&tr);
  std::mt19937_64 rng(9);
  for (const int n : {1, 7, 256, 1000, 32003}) {
    SCOPED_TRACE(n);
    std::vector<float> x = normal(rng, size_t(n));
    if (n > 7) {
      x[size_t(n / 3)] = -INFINITY;
      x[size_t(n - 1)] = 9.f;  // a tie between the last and a middle id: the middle one wins
      x[size_t(n / 2)] = 9.f;
    }
    Buffer d = put(*gpu, x);
    const TransferCounts t0 = gpu->transfers();
    const int32_t id = gpu->argmax(d.as<float>(), n);
    const Moved m = since(*gpu, t0);
    EXPECT_EQ(id, argmax(x.data(), n));  // model/sampler.h: the host Sampler's greedy choice
    EXPECT_EQ(m.h2d, 0u);
    EXPECT_EQ(m.d2h, 4u);
    EXPECT_EQ(m.syncs, 1u);
  }
  std::vector<float> all_tied(300, 2.5f);
  Buffer d = put(*gpu, all_tied);
  EXPECT_EQ(gpu->argmax(d.as<float>(), 300), 0);

  Buffer pos = gpu->alloc(MemCategory::Activations, 40 * 4, "test positions");
  gpu->positions(pos.as<int32_t>(), 40, 123);
  std::vector<int32_t> p(40);
  pos.copy_to_host(p.data(), 160);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(p[size_t(i)], 123 + i);
}

// The Generator on the CUDA backend, KV cache on the device, against transformers' logits with
// the fixture's PEFT adapter (the prompt in a chunk, then token by token, then a chunk) and
// against the CPU backend's Generator: q/k/v biases (qwen2), per-head q / k norms (qwen3) and a
// sliding window shorter than the sequence (mistral, window 5); mixture-of-experts layers
// (mixtral, qwen3_moe: moe_fwd's routing through the host, the experts on the device).
TEST(CudaGenerate, KvCacheLogitsFollowTransformersAndCpu) {
  QLFT_NEED_GPU();
  for (const char* fam : {"qwen2", "qwen3", "mistral", "mixtral", "qwen3_moe"}) {
    SCOPED_TRACE(fam);
    MemoryTracker tr;
    auto model = load_model(&tr, fixture(fam), model_test::keep());
    model_test::Fixture f(lora_fixture(fam));
    LoraAdapter lora(&tr, model->shapes, model_test::lora_config_of(f));
    model_test::load_lora(f, lora);
    const std::vector<int32_t> all = f.i32("tokens");  // its first row
    const int T = static_cast<int>(f.shape("tokens").back());
    const std::vector<int32_t> tok(all.begin(), all.begin() + T);
    ASSERT_GT(T, 8);
    auto cpu = make_cpu_backend(&tr);
    auto gpu = fp32_gpu(&tr);
    const std::vector<float> c = logits_on(*model, *cpu, lora, tok),
                             g = logits_on(*model, *gpu, lora, tok);
    const std::vector<float> ref = f.f32("logits");
    const double e = qlft_test::max_rel_error(g.data(), ref.data(), g.size());
    std::printf("%s: generation logits on cuda vs transformers %.3g\n", fam, e);
    EXPECT_LT(e, 1e-4);
    EXPECT_LT(norm_err(g, c), 1e-5);
  }
}

// Greedy generation of the MoE fixtures (no adapter) with backend=cuda: the ids of backend=cpu
// and of transformers' generate (the fixture's greedy continuation of its prompt).
TEST(CudaGenerate, MoeGreedyIdsEqualCpuAndTransformers) {
  QLFT_NEED_GPU();
  for (const char* fam : {"mixtral", "qwen3_moe"}) {
    SCOPED_TRACE(fam);
    MemoryTracker tr;
    auto model = load_model(&tr, fixture(fam), model_test::keep());
    model_test::Fixture f(lora_fixture(fam));
    const std::vector<int32_t> prompt = f.i32("prompt"), want = f.i32("greedy");
    GenerateOptions opt;
    opt.max_tokens = static_cast<int>(want.size());
    auto cpu = make_cpu_backend(&tr);
    auto gpu = fp32_gpu(&tr);
    const std::vector<int32_t> c = Generator(*model, *cpu, nullptr, 64).generate(prompt, opt);
    const std::vector<int32_t> g = Generator(*model, *gpu, nullptr, 64).generate(prompt, opt);
    EXPECT_EQ(c, want);
    EXPECT_EQ(g, c);
  }
}

// Generation with LoRA on Mixtral's experts and router (PEFT's target_parameters, fixtures/
// moe_lora) with backend=cuda, the factors copied to the device once: the logits (chunk, token by
// token, chunk) and 8 greedy ids of backend=cpu (whose Generator follows LlamaRunner's forward:
// MoeLoraGenerate.KvCacheAndGreedyFollowRunnerWithExpertLora).
TEST(CudaGenerate, ExpertLoraLogitsAndGreedyIdsEqualCpu) {
  QLFT_NEED_GPU();
  MemoryTracker tr;
  auto model = load_model(&tr, fixture("mixtral"), model_test::keep());
  model_test::Fixture f(qlft_test::fixture_path("moe_lora/syn_mixtral.moe_lora.safetensors"));
  LoraAdapter lora(&tr, model->shapes, model_test::lora_config_of(f));
  model_test::load_lora_modules(f, lora);
  ASSERT_TRUE(lora.has_moe());
  const std::vector<int32_t> all = f.i32("tokens");  // its first row
  const int T = static_cast<int>(f.shape("tokens").back());
  const std::vector<int32_t> tok(all.begin(), all.begin() + T);
  auto cpu = make_cpu_backend(&tr);
  auto gpu = fp32_gpu(&tr);
  const std::vector<float> c = logits_on(*model, *cpu, lora, tok),
                           g = logits_on(*model, *gpu, lora, tok);
  std::printf("mixtral expert LoRA: generation logits cuda vs cpu %.3g\n", norm_err(g, c));
  EXPECT_LT(norm_err(g, c), 1e-5);
  const std::vector<int32_t> prompt(tok.begin(), tok.begin() + 6);
  GenerateOptions opt;
  opt.max_tokens = 8;
  const std::vector<int32_t> ic = Generator(*model, *cpu, &lora, 64).generate(prompt, opt);
  const std::vector<int32_t> ig = Generator(*model, *gpu, &lora, 64).generate(prompt, opt);
  EXPECT_EQ(ig, ic);
}

// A greedy step with the cache on the device moves one int32 id in (the previous id) and one out
// (the chosen id), with one wait: the adapter, norms and biases were copied once when the
// Generator was made (exactly their bytes) and are not sent again. The ids equal the CPU
// backend's greedy continuation with the same adapter.
TEST(CudaGenerate, GreedyStepMovesOneIdEachWay) {
  QLFT_NEED_GPU();
  MemoryTracker tr;
  auto model = load_model(&tr, fixture("qwen2"), model_test::keep());
  model_test::Fixture f(lora_fixture("qwen2"));
  LoraAdapter lora(&tr, model->shapes, model_test::lora_config_of(f));
  model_test::load_lora(f, lora);
  const std::vector<int32_t> prompt = {3, 17, 5, 9};
  const int N = 12;
  GenerateOptions opt;
  opt.max_tokens = N;  // temperature 0: greedy

  auto cpu = make_cpu_backend(&tr);
  Generator gc(*model, *cpu, &lora, 32);
  const std::vector<int32_t> want = gc.generate(prompt, opt);
  ASSERT_EQ(want.size(), size_t(N));

  auto gpu = fp32_gpu(&tr);
  uint64_t frozen = model->output_norm.size();  // what the Generator copies once
  for (int l = 0; l < model->cfg.n_layers; ++l) {
    const LayerWeights& L = model->layers[size_t(l)];
    frozen += L.attn_norm.size() + L.ffn_norm.size() + L.q_norm.size() + L.k_norm.size();
    for (const Buffer& b : L.bias) frozen += b.size();
    for (int p = 0; p < kProjCount; ++p) {
      const LoraSlot& s = lora.slot(l, static_cast<Proj>(p));
      if (s.active()) frozen += s.a_bytes() + s.b_bytes();
    }
  }
  ASSERT_GT(frozen, 0u);
  const TransferCounts t0 = gpu->transfers();
  Generator gg(*model, *gpu, &lora, 32);
  const Moved made = since(*gpu, t0);
  EXPECT_EQ(made.h2d, frozen);
  EXPECT_EQ(made.d2h, 0u);

  TokenStream stream(gg, prompt, opt);
  std::vector<int32_t> got;
  for (int i = 0; i < N; ++i) {
    const TransferCounts s0 = gpu->transfers();
    const int32_t id = stream.next();
    const Moved m = since(*gpu, s0);
    got.push_back(id);
    if (i == 0) {  // the prompt's ids (and the weights' first upload) go in with the first step
      EXPECT_GE(m.h2d, prompt.size() * 4);
      EXPECT_EQ(m.d2h, 4u);
      continue;
    }
    SCOPED_TRACE(i);
    EXPECT_EQ(m.h2d, 4u);
    EXPECT_EQ(m.d2h, 4u);
    EXPECT_EQ(m.syncs, 1u);
    if (i == 1)
      std::printf("greedy decode step: h2d %llu B, d2h %llu B, %llu sync, %llu launches\n",
                  (unsigned long long)m.h2d, (unsigned long long)m.d2h, (unsigned long long)m.syncs,
                  (unsigned long long)m.launches);
  }
  EXPECT_EQ(got, want);
}
