// Training with LoRA on an MoE model's experts / router (lora.target_modules w1 / w2 / w3 / gate)
// on the CUDA backend (the emulator in the cuda-emu build): the runner's device copy of the
// adapter (its flat A / B arrays, the device optimizers) does not carry the expert factors, so
// the Trainer and a runner over a device backend refuse them by name (QLFT_ERR_UNSUPPORTED naming
// the setting and the backend) instead of ignoring them. (Generation carries them: the
// Generator's own device copies, test_cuda_generate.)
#include <gtest/gtest.h>

#include <functional>
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

namespace {

void expect_refused(const std::function<void()>& f, const char* what) {
  try {
    f();
    ADD_FAILURE() << what << ": expert LoRA on backend=cuda was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.status(), QLFT_ERR_UNSUPPORTED) << what << ": " << m;
    EXPECT_NE(m.find("lora.target_modules w1 / w2 / w3 / gate"), std::string::npos) << m;
    EXPECT_NE(m.find("backend=cuda"), std::string::npos) << m;
  }
}

}  // namespace

TEST(CudaMoeLora, ExpertLoraRefusedByName) {
  QLFT_NEED_GPU();
  MemoryTracker tr;
  tr.set_limit_space(MemSpace::Device);
  auto m = load_model(&tr, qlft_test::fixture_path("families/syn_mixtral"), model_test::keep());
  Config c;
  c.set("backend", "cuda");
  c.set("train.precision", "fp32");
  c.set("lora.r", "4");
  c.set("lora.target_modules", "q_proj,w2,gate");
  c.set("data.seq_len", "16");
  c.set("train.micro_batch", "2");
  const RunSpec spec = parse_run_spec(c);
  expect_refused([&] { Trainer t(*m, &tr, nullptr, spec); }, "Trainer");

  LoraConfig lc;
  lc.r = 4;
  lc.set_targets("q_proj,w2,gate");
  LoraAdapter lora(&tr, m->shapes, lc);
  auto be = gpu_backend(&tr, Precision::FP32);
  std::vector<int32_t> tok(16, 7);
  TokenBatch b;
  b.batch = 1;
  b.seq = 16;
  b.tokens = tok.data();
  std::vector<float> logits(size_t(16) * m->cfg.vocab);
  expect_refused(
      [&] {
        LlamaRunner run(*m, *be, &lora);
        run.logits(b, MatF(logits.data(), 16, m->cfg.vocab));
      },
      "LlamaRunner");
}
