// RoPE scaling on the CUDA backend (the emulator in the cuda-emu build): the tiny Llama of each
// variant (llama3, linear, dynamic NTK, yarn; tests/reference/gen_rope_scaling_fixtures.py) gives
// transformers' logits and greedy tokens with backend=cuda, as test_rope_scaling checks on the
// CPU; and a training step on the scaled model follows the CPU's (the backward rotation).
#include <gtest/gtest.h>

#include <cmath>

#include "cuda_test_util.h"
#include "unit/rope_scaling_util.h"

using namespace qlft;
using namespace rope_test;

TEST(CudaRopeScaling, LogitsAndGreedyMatchTransformers) {
  QLFT_NEED_GPU();
  for (const char* v : kVariants) {
    SCOPED_TRACE(v);
    MemoryTracker tr;
    auto m = load_model(&tr, variant_dir(v), model_test::keep());
    CudaBackendOptions o;
    o.spec.precision = qlft::Precision::FP32;
    auto gpu = make_cuda_backend(&tr, o);
    const std::vector<float> ours = logits_at_positions(*m, *gpu);
    const std::vector<float> want = reference().f32(std::string(v) + ".logits");
    ASSERT_EQ(ours.size(), want.size());
    const double err = qlft_test::max_rel_error(ours.data(), want.data(), want.size());
    std::printf("%s: backend=cuda logits vs transformers max rel error %.3g\n", v, err);
    EXPECT_LT(err, 1e-4);
    EXPECT_EQ(greedy(*m, *gpu), reference().i32(std::string(v) + ".greedy"));
  }
}

// The loss and the LoRA gradients of one step on the yarn and dynamic models (scaled cos / sin,
// a length-dependent table) on the device against the CPU backend.
TEST(CudaRopeScaling, BackwardFollowsCpu) {
  QLFT_NEED_GPU();
  for (const char* v : {"yarn", "dynamic", "llama3"}) {
    SCOPED_TRACE(v);
    MemoryTracker tr;
    auto m = load_model(&tr, variant_dir(v), model_test::keep());
    LoraConfig lc;
    lc.r = 4;
    lc.alpha = 8;
    const Proj targets[] = {Proj::Q, Proj::K, Proj::V, Proj::O};
    lc.set_targets("q_proj,k_proj,v_proj,o_proj");
    const std::vector<int32_t> tok = reference().i32("tokens");
    const int seq = static_cast<int>(tok.size()) - 1;
    std::vector<int32_t> in(tok.begin(), tok.end() - 1), tgt(tok.begin() + 1, tok.end());
    auto run = [&](Backend& be, std::vector<float>* grads) {
      LoraAdapter lora(&tr, m->shapes, lc);
      lora.init(7);
      for (int l = 0; l < lora.n_layers(); ++l)  // B != 0, so dA carries the backward too
        for (Proj p : targets) {
          std::vector<float> A = lora.get_hf(l, p, LoraAdapter::Part::A);
          std::vector<float> B(size_t(lora.slot(l, p).out) * lc.r);
          for (size_t i = 0; i < B.size(); ++i) B[i] = 0.01f * float(int(i % 7) - 3);
          lora.set_hf(l, p, A.data(), A.size(), B.data(), B.size());
        }
      LlamaRunner r(*m, be, &lora);
      TokenBatch b;
      b.seq = seq;
      b.tokens = in.data();
      b.targets = tgt.data();
      const LossResult res = r.forward(b);
      r.backward();
      grads->clear();
      for (int l = 0; l < lora.n_layers(); ++l)
        for (Proj p : targets)
          for (LoraAdapter::Part part : {LoraAdapter::Part::dA, LoraAdapter::Part::dB}) {
            const std::vector<float> g = lora.get_hf(l, p, part);
            grads->insert(grads->end(), g.begin(), g.end());
          }
      return res.loss_sum;
    };
    auto cpu = make_cpu_backend(&tr);
    CudaBackendOptions o;
    o.spec.precision = qlft::Precision::FP32;
    auto gpu = make_cuda_backend(&tr, o);
    std::vector<float> gc, gg;
    const double lc_ = run(*cpu, &gc), lg = run(*gpu, &gg);
    EXPECT_NEAR(lg, lc_, 1e-4 * std::fabs(lc_));
    EXPECT_LT(qlft_cuda_test::norm_err(gg, gc), 1e-4);
  }
}
