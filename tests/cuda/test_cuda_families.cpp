// The model families of issue 48 on the CUDA backend (the emulator in the cuda-emu build): the
// tiny Qwen3 (per-head q / k norms), Mistral (sliding window 5) and Phi-3 (fused projections) of
// tests/reference/gen_family_fixtures.py give transformers' logits with backend=cuda, and a
// training step's loss and LoRA gradients follow the CPU backend's; the sliding window on the
// attention kernels against the CPU's on random inputs. (Gemma 2 / 3: test_cuda_families_gemma.)
#include <gtest/gtest.h>

#include <cmath>

#include "cuda_test_util.h"
#include "family_steps.h"
#include "unit/test_model_util.h"

using namespace qlft;

namespace {

std::string family_fixture(const std::string& rel) {
  return qlft_test::fixture_path("families/" + rel);
}

std::unique_ptr<Backend> fp32_gpu(MemoryTracker* tr) {
  CudaBackendOptions o;
  o.spec.precision = qlft::Precision::FP32;
  return make_cuda_backend(tr, o);
}

// The fixture's batch through model with its LoRA adapter on be: logits, loss, gradients.
struct Step {
  std::vector<float> logits, grads;
  double loss = 0;
};
Step run_step(const Model& m, Backend& be, const model_test::Fixture& f, MemoryTracker* tr) {
  LoraAdapter lora(tr, m.shapes, model_test::lora_config_of(f));
  model_test::load_lora(f, lora);
  LlamaRunner run(m, be, &lora);
  Step s;
  s.loss = qlft_cuda_test::fixture_step(run, f, &s.logits, m.cfg.vocab);
  for (int l = 0; l < lora.n_layers(); ++l)
    for (int p = 0; p < kProjCount; ++p)
      for (LoraAdapter::Part part : {LoraAdapter::Part::dA, LoraAdapter::Part::dB}) {
        const std::vector<float> g = lora.get_hf(l, static_cast<Proj>(p), part);
        s.grads.insert(s.grads.end(), g.begin(), g.end());
      }
  return s;
}

}  // namespace

TEST(CudaFamilies, Qwen3MistralPhi3FollowTransformersAndCpu) {
  QLFT_NEED_GPU();
  for (const char* fam : {"qwen3", "mistral", "phi3"}) {
    SCOPED_TRACE(fam);
    MemoryTracker tr;
    const std::string name = std::string("syn_") + fam;
    auto m = load_model(&tr, family_fixture(name), model_test::keep());
    model_test::Fixture f(family_fixture(name + ".lora.safetensors"));
    auto cpu = make_cpu_backend(&tr);
    auto gpu = fp32_gpu(&tr);
    const Step c = run_step(*m, *cpu, f, &tr), g = run_step(*m, *gpu, f, &tr);
    const std::vector<float> ref = f.f32("logits");
    const double e = qlft_test::max_rel_error(g.logits.data(), ref.data(), ref.size());
    std::printf("%s: backend=cuda logits vs transformers %.3g\n", fam, e);
    EXPECT_LT(e, 1e-4);
    EXPECT_NEAR(g.loss, f.f32("loss")[0], 1e-4 * std::fabs(c.loss));
    EXPECT_NEAR(g.loss, c.loss, 1e-5 * std::fabs(c.loss));
    EXPECT_LT(qlft_cuda_test::norm_err(g.grads, c.grads), 1e-4);
  }
}

// The kernels' window mask against the CPU backend's (itself held to a scalar oracle by
// test_backend_ops): forward out / lse and backward dq / dk / dv, with and without packed
// documents; and the window visible (the outputs differ from window 0's).
TEST(CudaFamilies, SlidingWindowAttentionFollowsCpu) {
  QLFT_NEED_GPU();
  MemoryTracker tr;
  auto cpu = make_cpu_backend(&tr);
  auto gpu = fp32_gpu(&tr);
  for (int docs = 0; docs < 2; ++docs)
    for (int window : {3, 17}) {
      SCOPED_TRACE(::testing::Message() << "window " << window << " docs " << docs);
      AttnShape s;
      s.batch = 2;
      s.seq = 45;
      s.n_heads = 4;
      s.n_kv_heads = 2;
      s.head_dim = 16;
      s.window = window;
      const int rows = s.batch * s.seq, qc = 64, kc = 32;
      std::vector<int32_t> doc(static_cast<size_t>(rows));
      for (int i = 0; i < rows; ++i) doc[size_t(i)] = (i % s.seq) / 20;
      if (docs) s.doc_ids = doc.data();
      auto rnd = [](size_t n, uint32_t seed) {
        std::vector<float> v(n);
        for (size_t i = 0; i < n; ++i) {
          seed = seed * 1664525u + 1013904223u;
          v[i] = float(int(seed >> 9) % 2001 - 1000) / 700.f;
        }
        return v;
      };
      const std::vector<float> q = rnd(size_t(rows) * qc, 1), k = rnd(size_t(rows) * kc, 2),
                               v = rnd(size_t(rows) * kc, 3), dout = rnd(size_t(rows) * qc, 4);
      auto both = [&](Backend& be, const AttnShape& sh) {
        std::vector<float> out(q.size()), lse(size_t(s.n_heads) * rows), dq(q.size(), 0.f),
            dk(k.size(), 0.f), dv(v.size(), 0.f);
        be.attention_fwd(sh, CMatF(q.data(), rows, qc), CMatF(k.data(), rows, kc),
                         CMatF(v.data(), rows, kc), MatF(out.data(), rows, qc), lse.data());
        be.attention_bwd(sh, CMatF(q.data(), rows, qc), CMatF(k.data(), rows, kc),
                         CMatF(v.data(), rows, kc), CMatF(out.data(), rows, qc), lse.data(),
                         CMatF(dout.data(), rows, qc), MatF(dq.data(), rows, qc),
                         MatF(dk.data(), rows, kc), MatF(dv.data(), rows, kc));
        std::vector<float> all = out;
        for (const auto* x : {&lse, &dq, &dk, &dv}) all.insert(all.end(), x->begin(), x->end());
        return all;
      };
      const std::vector<float> c = both(*cpu, s), g = both(*gpu, s);
      EXPECT_LT(qlft_cuda_test::norm_err(g, c), 1e-5);
      AttnShape full = s;
      full.window = 0;
      EXPECT_GT(qlft_cuda_test::norm_err(both(*cpu, full), c), 1e-2) << "the window is visible";
    }
}
