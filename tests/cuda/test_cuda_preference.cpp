// The preference objectives on the CUDA backend (the emulator in the cuda-emu build): one
// micro-batch of each objective on the TRL fixture batch (tests/reference/
// gen_preference_fixtures.py, stories260K) gives the CPU backend's loss and LoRA gradients, and
// TRL's loss: the reference pass with the adapter off, the per-row head calls and ORPO's second
// target set run on device memory as on the host.
#include <gtest/gtest.h>

#include <cmath>

#include "cuda_test_util.h"
#include "train/preference.h"
#include "unit/test_model_util.h"

using namespace qlft;

namespace {

constexpr int kT = 24;

data::Batch rows_of(const std::vector<int32_t>& ids, const std::vector<int32_t>& mask) {
  data::Batch b;
  b.micro_batch = b.rows = static_cast<int>(ids.size() / kT);
  b.seq_len = kT;
  b.tokens = ids;
  b.targets.assign(ids.size(), kIgnoreIndex);
  for (int r = 0; r < b.rows; ++r)
    for (int t = 0; t + 1 < kT; ++t)
      if (mask[r * kT + t + 1]) b.targets[r * kT + t] = ids[r * kT + t + 1];
  return b;
}

struct Result {
  double loss = 0;
  std::vector<float> grads;
};

Result run(const Model& m, Backend& be, const model_test::Fixture& fx, const PrefSpec& s,
           MemoryTracker* tr) {
  LoraConfig lc;
  lc.r = 4;
  lc.alpha = 8;
  LoraAdapter lora(tr, m.shapes, lc);
  model_test::load_lora(fx, lora);
  LlamaRunner r(m, be, &lora);
  const std::vector<int32_t> ids = fx.i32("ids"), attn = fx.i32("attn"), comp = fx.i32("comp");
  PrefBatch b;
  b.rows = rows_of(ids, comp);
  if (s.objective == Objective::Orpo) {
    std::vector<int32_t> prompt(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) prompt[i] = attn[i] && !comp[i];
    b.prompt_targets = rows_of(ids, prompt).targets;
  }
  if (s.objective == Objective::Kto) {
    b.kl_rows = rows_of(fx.i32("kto.kl_ids"), fx.i32("kto.kl_comp"));
    for (int32_t l : fx.i32("kto.label")) b.desirable.push_back(static_cast<uint8_t>(l));
  }
  Result out;
  out.loss = preference_forward_backward(r, s, b, 1.f, 0).loss;
  for (int l = 0; l < lora.n_layers(); ++l)
    for (int p = 0; p < kProjCount; ++p)
      for (LoraAdapter::Part part : {LoraAdapter::Part::dA, LoraAdapter::Part::dB}) {
        const std::vector<float> g = lora.get_hf(l, static_cast<Proj>(p), part);
        out.grads.insert(out.grads.end(), g.begin(), g.end());
      }
  return out;
}

}  // namespace

TEST(CudaPreference, EveryObjectiveFollowsCpuAndTrl) {
  QLFT_NEED_GPU();
  QLFT_NEED_SHARED(path, "models/stories260K.gguf");
  MemoryTracker tr;
  auto m = load_model(&tr, path, model_test::keep());
  model_test::Fixture fx(qlft_test::fixture_path("preference/preference.safetensors"));
  auto cpu = make_cpu_backend(&tr);
  CudaBackendOptions o;
  o.spec.precision = Precision::FP32;
  auto gpu = make_cuda_backend(&tr, o);
  const struct {
    const char* name;
    Objective o;
    double beta;
  } cases[] = {{"dpo", Objective::Dpo, 0.1},
               {"ipo", Objective::Ipo, 0.1},
               {"orpo", Objective::Orpo, 0.1},
               {"simpo", Objective::Simpo, 2.0},
               {"kto", Objective::Kto, 0.1}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    PrefSpec s;
    s.objective = c.o;
    s.beta = c.beta;
    s.cpo_alpha = 0.5;  // the fixture's SimPO settings (the others ignore them)
    s.label_smoothing = 0.1;
    s.simpo_gamma = 0.5;
    s.undesirable_weight = 1.5;
    const Result rc = run(*m, *cpu, fx, s, &tr), rg = run(*m, *gpu, fx, s, &tr);
    const double trl = fx.f32(std::string(c.name) + ".loss")[0];
    const double ge = qlft_cuda_test::norm_err(rg.grads, rc.grads);
    std::printf("%s: backend=cuda loss %.6f, cpu %.6f, TRL %.6f; gradients vs cpu %.3g\n", c.name,
                rg.loss, rc.loss, trl, ge);
    EXPECT_NEAR(rg.loss, rc.loss, 1e-5 * std::fabs(rc.loss));
    EXPECT_NEAR(rg.loss, trl, 1e-4 * std::fabs(trl));
    EXPECT_LT(ge, 1e-4);
  }
}
