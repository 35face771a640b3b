// Training with LoRA on an MoE model's experts / router (lora.target_modules w1 / w2 / w3 / gate)
// on the CUDA backend (the emulator in the cuda-emu build): the runner's device copy of the
// adapter carries the expert / router factors after the projections' (the device AdamW steps
// them with the rest); a Trainer step with backend=cuda follows backend=cpu's (loss, every
// factor after the step), itself held to PEFT by test_moe_lora.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "config/config.h"
#include "config/run_spec.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "family_steps.h"
#include "train/trainer.h"
#include "unit/test_model_util.h"

using namespace qlft;
using namespace qlft_cuda_test;

TEST(CudaMoeLora, TrainerStepFollowsCpu) {
  QLFT_NEED_GPU();
  const model_test::Fixture f(qlft_test::fixture_path("moe_lora/syn_mixtral.moe_lora.safetensors"));
  const data::Batch b = fixture_batch(f);
  std::vector<std::vector<float>> after[2];
  double loss[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    MemoryTracker tr;
    if (k) tr.set_limit_space(MemSpace::Device);
    auto m = load_model(&tr, qlft_test::fixture_path("families/syn_mixtral"), model_test::keep());
    Config c;
    c.set("backend", k ? "cuda" : "cpu");
    c.set("train.precision", "fp32");
    c.set("lora.r", f.meta("r"));
    c.set("lora.alpha", f.meta("alpha"));
    c.set("lora.target_modules", f.meta("targets"));
    c.set("data.seq_len", "16");
    c.set("train.micro_batch", "2");
    Trainer t(*m, &tr, nullptr, parse_run_spec(c));
    model_test::load_lora_modules(f, t.lora());
    StepReport rep;
    t.step_on({b}, &rep);
    loss[k] = rep.loss;
    for (int l = 0; l < 2; ++l)
      for (int p = 0; p < kMoePartCount; ++p)
        for (bool is_b : {false, true})
          after[k].push_back(t.lora().get_moe_peft(l, MoePart(p), is_b));
  }
  EXPECT_NEAR(loss[1], loss[0], 1e-5 * loss[0]);
  ASSERT_EQ(after[0].size(), after[1].size());
  double worst = 0;
  for (size_t i = 0; i < after[0].size(); ++i) {
    ASSERT_EQ(after[0][i].size(), after[1][i].size());
    worst = std::max(worst, qlft_test::max_rel_error(after[1][i].data(), after[0][i].data(),
                                                     after[0][i].size()));
  }
  std::printf("[cuda_moe_lora] loss cpu %.7f cuda %.7f, factors after the step worst %.2e\n",
              loss[0], loss[1], worst);
  EXPECT_LT(worst, 1e-5);
}
