// The training half of the C ABI, used as a C program would: the reference fine-tune
// (stories260K on Shakespeare, NF4, r=8, bf16, paged 8-bit AdamW, checkpointing every layer,
// micro-batch 4 x accumulation 4) must cut held-out loss by 30% within 200 steps; progress
// callbacks cancel; errors carry codes and messages.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "api/api_session.h"
#include "qlft.h"
#include "support/test_support.h"

namespace {

using qlft_test::Session;

// stories260K on Shakespeare, 32-token rows, one thread: a trainer that steps in milliseconds.
void open_small_trainer(Session& s, const std::string& model_path, const std::string& text,
                        const char* max_steps) {
  ASSERT_EQ(qlft_config_create(&s.cfg), QLFT_OK);
  s.set("quant.type", "keep");
  s.set("train.max_steps", max_steps);
  s.set("data.seq_len", "32");
  s.set("threads", "1");
  ASSERT_EQ(qlft_runtime_create(s.cfg, &s.rt), QLFT_OK);
  ASSERT_EQ(qlft_model_load(s.rt, model_path.c_str(), s.cfg, &s.model), QLFT_OK);
  ASSERT_EQ(qlft_dataset_load(s.model, text.c_str(), s.cfg, &s.data), QLFT_OK);
  ASSERT_EQ(qlft_trainer_create(s.model, s.data, s.cfg, &s.trainer), QLFT_OK);
}

int32_t count_steps(const qlft_step_stats* s, void* user) {
  EXPECT_GE(s->struct_size, sizeof(uint32_t));
  EXPECT_TRUE(std::isfinite(s->loss));
  ++*static_cast<int*>(user);
  return 0;
}

int32_t cancel_at_3(const qlft_step_stats* s, void*) {
  return s->step >= 3 ? 1 : 0;
}

}  // namespace

TEST(ApiTrain, ReferenceFineTuneCutsHeldOutLossBy30Percent) {
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  QLFT_NEED_SHARED(text, "data/tinyshakespeare.txt");
  Session s;
  ASSERT_EQ(qlft_config_create(&s.cfg), QLFT_OK);
  s.set("quant.type", "nf4");
  s.set("lora.r", "8");
  s.set("lora.alpha", "16");
  s.set("train.precision", "bf16");
  s.set("optim.name", "paged_adamw8bit");
  s.set("optim.lr", "5e-3");
  s.set("sched.name", "cosine");
  s.set("sched.warmup_steps", "10");
  s.set("train.grad_checkpointing", "1");
  s.set("train.micro_batch", "4");
  s.set("train.accumulation", "4");
  s.set("train.max_steps", "200");
  s.set("data.seq_len", "64");
  s.set("data.eval_fraction", "0.02");
  s.set("threads", "1");
  ASSERT_EQ(qlft_runtime_create(s.cfg, &s.rt), QLFT_OK) << qlft_last_error();
  ASSERT_EQ(qlft_model_load(s.rt, model_path.c_str(), s.cfg, &s.model), QLFT_OK)
      << qlft_last_error();
  qlft_model_details d{};
  d.struct_size = sizeof d;
  ASSERT_EQ(qlft_model_info(s.model, &d), QLFT_OK);
  EXPECT_STREQ(d.quant_type, "nf4");
  ASSERT_EQ(qlft_dataset_load(s.model, text.c_str(), s.cfg, &s.data), QLFT_OK) << qlft_last_error();
  ASSERT_EQ(qlft_trainer_create(s.model, s.data, s.cfg, &s.trainer), QLFT_OK) << qlft_last_error();

  qlft_eval_result before{}, after{};
  before.struct_size = after.struct_size = sizeof before;
  ASSERT_EQ(qlft_trainer_evaluate(s.trainer, nullptr, &before), QLFT_OK) << qlft_last_error();
  int steps = 0;
  ASSERT_EQ(qlft_trainer_train(s.trainer, count_steps, &steps), QLFT_OK) << qlft_last_error();
  EXPECT_EQ(steps, 200);
  ASSERT_EQ(qlft_trainer_evaluate(s.trainer, nullptr, &after), QLFT_OK);
  EXPECT_LE(after.loss, 0.7 * before.loss) << "before " << before.loss << " after " << after.loss;
  EXPECT_NEAR(after.perplexity, std::exp(after.loss), 1e-6 * after.perplexity);

  qlft_memory_report m{};
  m.struct_size = sizeof m;
  ASSERT_EQ(qlft_trainer_memory_report(s.trainer, &m), QLFT_OK);
  EXPECT_GT(m.reserved[QLFT_MEM_ADAPTER], 0u);
  EXPECT_GT(m.reserved[QLFT_MEM_OPTIMIZER], 0u);
  EXPECT_GT(m.peak[QLFT_MEM_ACTIVATIONS], 0u);
  EXPECT_GT(m.process_peak_rss, 0u);
}

TEST(ApiTrain, ProgressCallbackCancelsAndTrainingResumesAfterwards) {
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  QLFT_NEED_SHARED(text, "data/tinyshakespeare.txt");
  Session s;
  open_small_trainer(s, model_path, text, "6");
  if (HasFatalFailure()) return;
  EXPECT_EQ(qlft_trainer_train(s.trainer, cancel_at_3, nullptr), QLFT_ERR_CANCELLED);
  EXPECT_NE(std::string(qlft_last_error()).find("cancel"), std::string::npos);
  qlft_step_stats st{};
  st.struct_size = sizeof st;
  ASSERT_EQ(qlft_trainer_step(s.trainer, &st), QLFT_OK) << qlft_last_error();
  EXPECT_EQ(st.step, 4u);
  int steps = 0;
  ASSERT_EQ(qlft_trainer_train(s.trainer, count_steps, &steps), QLFT_OK);
  EXPECT_EQ(steps, 2);
  EXPECT_EQ(qlft_trainer_step(s.trainer, &st), QLFT_ERR_INVALID_ARGUMENT);  // complete
}

// A cancel sent while nothing runs must not stop the next run.
TEST(ApiTrain, CancelWhileIdleIsDiscarded) {
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  QLFT_NEED_SHARED(text, "data/tinyshakespeare.txt");
  Session s;
  open_small_trainer(s, model_path, text, "3");
  if (HasFatalFailure()) return;
  qlft_trainer_cancel(s.trainer);
  qlft_step_stats st{};
  st.struct_size = sizeof st;
  ASSERT_EQ(qlft_trainer_step(s.trainer, &st), QLFT_OK) << qlft_last_error();
  qlft_trainer_cancel(s.trainer);
  int steps = 0;
  ASSERT_EQ(qlft_trainer_train(s.trainer, count_steps, &steps), QLFT_OK) << qlft_last_error();
  EXPECT_EQ(steps, 2);
}

TEST(ApiTrain, BadInputsGetCodesAndMessages) {
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  Session s;
  ASSERT_EQ(qlft_config_create(&s.cfg), QLFT_OK);
  EXPECT_EQ(qlft_config_set(s.cfg, "lora.r", "abc"), QLFT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qlft_last_error()).find("lora.r"), std::string::npos);
  s.set("quant.type", "keep");
  ASSERT_EQ(qlft_runtime_create(s.cfg, &s.rt), QLFT_OK);
  EXPECT_EQ(qlft_model_load(s.rt, "/nonexistent/model.gguf", s.cfg, &s.model), QLFT_ERR_IO);
  EXPECT_NE(std::string(qlft_last_error()).find("/nonexistent/model.gguf"), std::string::npos);
  EXPECT_EQ(s.model, nullptr);
  ASSERT_EQ(qlft_model_load(s.rt, model_path.c_str(), s.cfg, &s.model), QLFT_OK);
  EXPECT_EQ(qlft_dataset_load(s.model, "/nonexistent/data.txt", s.cfg, &s.data), QLFT_ERR_IO);
  EXPECT_EQ(s.data, nullptr);
  ASSERT_EQ(qlft_trainer_create(s.model, nullptr, s.cfg, &s.trainer), QLFT_OK);
  qlft_step_stats st{};
  st.struct_size = sizeof st;
  EXPECT_EQ(qlft_trainer_step(s.trainer, &st), QLFT_ERR_INVALID_ARGUMENT);  // no data
  EXPECT_EQ(qlft_trainer_save_adapter(s.trainer, "/tmp/x", "onnx"), QLFT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(qlft_trainer_load_adapter(s.trainer, "/nonexistent/adapter"), QLFT_ERR_IO);
  EXPECT_EQ(qlft_trainer_resume(s.trainer, "/nonexistent/ck.safetensors"), QLFT_ERR_IO);
  qlft_trainer_cancel(nullptr);  // no-op
}
