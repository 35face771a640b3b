// Phi-3's fused LoRA modules (qkv_proj, gate_up_proj: one A shared by the parts, model/lora.h)
// on the CUDA backend (the emulator in the cuda-emu build): the runner's device copy holds one
// A per module and the parts' gradients accumulate into its one dA; logits, loss and every
// module's gA / gB equal PEFT's (tests/reference/gen_family_fixtures.py,
// syn_phi3.fused_lora.safetensors) and the CPU backend's.
#include <gtest/gtest.h>

#include <cmath>

#include "config/config_file.h"
#include "config/run_spec.h"
#include "cuda_test_util.h"
#include "family_steps.h"
#include "train/trainer.h"
#include "unit/test_model_util.h"

using namespace qlft;

namespace {

constexpr Proj kModules[] = {Proj::Q, Proj::O, Proj::Gate, Proj::Down};

struct Step {
  std::vector<float> logits, grads;
  double loss = 0;
};

Step run_step(const Model& m, Backend& be, const model_test::Fixture& f, MemoryTracker* tr) {
  LoraAdapter lora(tr, m.shapes, model_test::lora_config_of(f));
  for (int l = 0; l < lora.n_layers(); ++l)
    for (Proj p : kModules) {
      const std::string k = "l" + std::to_string(l) + "." + lora.module(p).peft + ".";
      std::vector<float> A = f.f32(k + "A"), B = f.f32(k + "B");
      lora.set_module_hf(l, p, A.data(), int64_t(A.size()), B.data(), int64_t(B.size()));
    }
  LlamaRunner run(m, be, &lora);
  Step s;
  s.loss = qlft_cuda_test::fixture_step(run, f, &s.logits, m.cfg.vocab);
  for (int l = 0; l < lora.n_layers(); ++l)
    for (Proj p : kModules)
      for (LoraAdapter::Part part : {LoraAdapter::Part::dA, LoraAdapter::Part::dB}) {
        const std::vector<float> g = lora.get_module_hf(l, p, part);
        s.grads.insert(s.grads.end(), g.begin(), g.end());
      }
  return s;
}

}  // namespace

TEST(CudaPhi3Lora, FusedModulesFollowPeftAndCpu) {
  QLFT_NEED_GPU();
  MemoryTracker tr;
  auto m = load_model(&tr, qlft_test::fixture_path("families/syn_phi3"), model_test::keep());
  model_test::Fixture f(qlft_test::fixture_path("families/syn_phi3.fused_lora.safetensors"));
  auto cpu = make_cpu_backend(&tr);
  CudaBackendOptions o;
  o.spec.precision = qlft::Precision::FP32;
  auto gpu = make_cuda_backend(&tr, o);
  const Step c = run_step(*m, *cpu, f, &tr), g = run_step(*m, *gpu, f, &tr);
  const std::vector<float> ref = f.f32("logits");
  const double e = qlft_test::max_rel_error(g.logits.data(), ref.data(), ref.size());
  std::printf("phi3 fused LoRA: backend=cuda logits vs PEFT %.3g\n", e);
  EXPECT_LT(e, 1e-4);
  EXPECT_NEAR(g.loss, f.f32("loss")[0], 1e-4 * std::fabs(c.loss));
  std::vector<float> peft;
  for (int l = 0; l < m->cfg.n_layers; ++l)
    for (Proj p : kModules)
      for (const char* part : {"gA", "gB"}) {
        const std::string k =
            "l" + std::to_string(l) + "." + lora_module(true, p).peft + "." + part;
        const std::vector<float> v = f.f32(k);
        peft.insert(peft.end(), v.begin(), v.end());
      }
  ASSERT_EQ(g.grads.size(), peft.size());
  EXPECT_LT(qlft_cuda_test::norm_err(g.grads, peft), 1e-4) << "backend=cuda vs PEFT";
  EXPECT_LT(qlft_cuda_test::norm_err(g.grads, c.grads), 1e-4) << "backend=cuda vs cpu";
}

// The trainer with backend=cuda keeps the adapter on the device (one A per fused module there)
// and copies it back on a host read: four steps follow backend=cpu's.
TEST(CudaPhi3Lora, TrainerStepsFollowCpu) {
  QLFT_NEED_GPU();
  MemoryTracker tr;
  auto m = load_model(&tr, qlft_test::fixture_path("families/syn_phi3"), model_test::keep());
  const data::Batch b = qlft_cuda_test::fixture_batch(
      model_test::Fixture(qlft_test::fixture_path("families/syn_phi3.fused_lora.safetensors")));
  std::vector<float> w[2];
  double loss[2] = {0, 0};
  const char* backends[2] = {"cpu", "cuda"};
  for (int i = 0; i < 2; ++i) {
    Config c;
    c.set("backend", backends[i]);
    c.set("train.precision", "fp32");
    c.set("lora.r", "4");
    c.set("lora.alpha", "8");
    c.set("lora.target_modules", "qkv_proj,o_proj,gate_up_proj,down_proj");
    c.set("optim.lr", "2e-2");
    c.set("sched.name", "constant");
    c.set("seed", "7");
    c.set("data.seq_len", std::to_string(b.seq_len));
    c.set("train.micro_batch", std::to_string(b.micro_batch));
    Trainer t(*m, &tr, nullptr, parse_run_spec(c));
    StepReport r;
    for (int s = 0; s < 4; ++s) t.step_on({b}, &r);
    loss[i] = r.loss;
    for (const LoraAdapter::Param& p : t.lora().params()) w[i].insert(w[i].end(), p.w, p.w + p.n);
    EXPECT_EQ(t.lora().get_hf(1, Proj::K, LoraAdapter::Part::A),
              t.lora().get_hf(1, Proj::Q, LoraAdapter::Part::A));
  }
  std::printf("phi3 fused LoRA, 4 steps: loss cpu %.6f cuda %.6f\n", loss[0], loss[1]);
  EXPECT_NEAR(loss[1], loss[0], 1e-4 * std::fabs(loss[0]));
  ASSERT_EQ(w[0].size(), w[1].size());
  EXPECT_LT(qlft_cuda_test::norm_err(w[1], w[0]), 1e-4);
}
