// Calling into a trainer from its own progress callback: the calls that would step or replace
// the state under the running qlft_trainer_train are refused with a message saying why, saving
// works (the CLI checkpoints there), and qlft_trainer_free is deferred to the loop's end.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "api/api_session.h"
#include "qlft.h"
#include "support/test_support.h"

namespace {

struct Calls {
  qlft_trainer* trainer = nullptr;
  std::string dir;
  int32_t step = -1, train = -1, resume = -1, load = -1, save = -1;
  std::string step_error;
  bool free_it = false;
  int calls = 0;
};

int32_t reenter(const qlft_step_stats*, void* user) {
  Calls* c = static_cast<Calls*>(user);
  ++c->calls;
  if (c->free_it) {
    qlft_trainer_free(c->trainer);
    return 0;
  }
  qlft_step_stats st{};
  st.struct_size = sizeof(st);
  c->step = qlft_trainer_step(c->trainer, &st);
  c->step_error = qlft_last_error();
  c->train = qlft_trainer_train(c->trainer, nullptr, nullptr);
  std::string ckpt = c->dir + "/ckpt.safetensors";
  c->save = qlft_trainer_save_checkpoint(c->trainer, ckpt.c_str());
  c->resume = qlft_trainer_resume(c->trainer, ckpt.c_str());
  c->load = qlft_trainer_load_adapter(c->trainer, c->dir.c_str());
  return 0;
}

class Reentry : public ::testing::Test {
 protected:
  void SetUp() override {
    QLFT_NEED_SHARED(model, "models/stories260K.gguf");
    QLFT_NEED_SHARED(text, "data/tinyshakespeare.txt");
    ASSERT_EQ(qlft_config_create(&s.cfg), QLFT_OK);
    for (auto [k, v] : {std::pair{"threads", "1"},
                        {"quant.type", "keep"},
                        {"data.seq_len", "32"},
                        {"train.micro_batch", "2"},
                        {"train.max_steps", "2"},
                        {"lora.r", "4"}})
      s.set(k, v);
    ASSERT_EQ(qlft_runtime_create(s.cfg, &s.rt), QLFT_OK) << qlft_last_error();
    ASSERT_EQ(qlft_model_load(s.rt, model.c_str(), s.cfg, &s.model), QLFT_OK) << qlft_last_error();
    ASSERT_EQ(qlft_dataset_load(s.model, text.c_str(), s.cfg, &s.data), QLFT_OK)
        << qlft_last_error();
    ASSERT_EQ(qlft_trainer_create(s.model, s.data, s.cfg, &s.trainer), QLFT_OK)
        << qlft_last_error();
    dir = std::filesystem::temp_directory_path() / ("qlft-reentry-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
  }
  void TearDown() override { std::filesystem::remove_all(dir); }
  qlft_test::Session s;
  std::filesystem::path dir;
};

TEST_F(Reentry, StateChangingCallsAreRefusedSavingWorks) {
  Calls c;
  c.trainer = s.trainer;
  c.dir = dir.string();
  ASSERT_EQ(qlft_trainer_train(s.trainer, reenter, &c), QLFT_OK) << qlft_last_error();
  EXPECT_EQ(c.calls, 2);  // the refused step did not add a step
  EXPECT_EQ(c.step, QLFT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(c.step_error.find("qlft_trainer_step: called from the trainer's own progress callback"),
            std::string::npos)
      << c.step_error;
  EXPECT_EQ(c.train, QLFT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(c.resume, QLFT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(c.load, QLFT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(c.save, QLFT_OK);
  EXPECT_TRUE(std::filesystem::exists(dir / "ckpt.safetensors"));
  // Outside the callback the same calls work again.
  EXPECT_EQ(qlft_trainer_resume(s.trainer, (dir / "ckpt.safetensors").c_str()), QLFT_OK)
      << qlft_last_error();
}

TEST_F(Reentry, FreeFromTheCallbackIsDeferred) {
  Calls c;
  c.trainer = s.trainer;
  c.free_it = true;
  s.trainer = nullptr;  // the callback frees it
  EXPECT_EQ(qlft_trainer_train(c.trainer, reenter, &c), QLFT_ERR_CANCELLED);
  EXPECT_NE(std::string(qlft_last_error()).find("the progress callback freed the trainer"),
            std::string::npos);
  EXPECT_EQ(c.calls, 1);
}

}  // namespace
