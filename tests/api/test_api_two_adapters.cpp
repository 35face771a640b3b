// Two adapters on one loaded base: trainers A and B (different seeds, data and lora.r) train
// interleaved on one model, and the runtime's memory report still holds one model's weights (the
// bytes the model held before either trainer existed, not twice that). Each generates greedily
// with its own adapter; then each adapter, saved and loaded as a separate process would load it
// (a fresh runtime, a fresh model load, a fresh trainer), generates exactly the same token ids.
// A's ids differ from B's and from the base's, so an adapter that leaked into the other trainer
// or the model, or a save/load that lost it, fails here.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "api/api_session.h"
#include "qlft.h"
#include "support/test_support.h"

namespace {

// The settings of one trainer: its adapter's shape, its seed, and enough learning rate that a
// few steps move stories260K's greedy text (B trains on TinyStories, the model's own kind of
// text, so it needs the larger rate to move it).
qlft_config* trainer_config(const char* r, const char* seed, const char* lr) {
  qlft_config* c = nullptr;
  EXPECT_EQ(qlft_config_create(&c), QLFT_OK);
  for (const auto& kv : {std::pair<const char*, const char*>{"lora.r", r},
                         {"lora.alpha", "16"},
                         {"seed", seed},
                         {"data.seq_len", "32"},
                         {"train.micro_batch", "4"},
                         {"train.max_steps", "8"},
                         {"optim.lr", lr},
                         {"threads", "1"}})
    EXPECT_EQ(qlft_config_set(c, kv.first, kv.second), QLFT_OK) << qlft_last_error();
  return c;
}

// Greedy token ids from the prompt, with the trainer's adapter (or none).
std::vector<int32_t> greedy_ids(const qlft_model* m, const qlft_trainer* t,
                                const qlft_config* cfg) {
  std::vector<int32_t> ids;
  qlft_generation* g = nullptr;
  EXPECT_EQ(qlft_generation_create(m, t, "Once upon a time", cfg, nullptr, 0, &g), QLFT_OK)
      << qlft_last_error();
  if (!g) return ids;
  for (;;) {
    qlft_generated_token tok{};
    tok.struct_size = sizeof tok;
    if (qlft_generation_next(g, &tok) != QLFT_OK) {
      ADD_FAILURE() << qlft_last_error();
      break;
    }
    if (tok.id >= 0) ids.push_back(tok.id);
    if (tok.finish_reason != QLFT_FINISH_NONE) break;
  }
  qlft_generation_free(g);
  return ids;
}

uint64_t weights_reserved(const qlft_runtime* rt) {
  qlft_memory_report rep{};
  rep.struct_size = sizeof rep;
  EXPECT_EQ(qlft_runtime_memory_report(rt, &rep), QLFT_OK) << qlft_last_error();
  return rep.reserved[QLFT_MEM_WEIGHTS];
}

void step(qlft_trainer* t) {
  qlft_step_stats st{};
  st.struct_size = sizeof st;
  ASSERT_EQ(qlft_trainer_step(t, &st), QLFT_OK) << qlft_last_error();
}

// What a separate process does: load the base, create a trainer with the adapter's settings,
// load the saved adapter, generate.
std::vector<int32_t> ids_in_fresh_process(const std::string& model_path, const qlft_config* gen,
                                          const qlft_config* tcfg, const std::string& adapter) {
  qlft_test::Session s;
  EXPECT_EQ(qlft_runtime_create(gen, &s.rt), QLFT_OK);
  EXPECT_EQ(qlft_model_load(s.rt, model_path.c_str(), gen, &s.model), QLFT_OK) << qlft_last_error();
  EXPECT_EQ(qlft_trainer_create(s.model, nullptr, tcfg, &s.trainer), QLFT_OK) << qlft_last_error();
  EXPECT_EQ(qlft_trainer_load_adapter(s.trainer, adapter.c_str()), QLFT_OK) << qlft_last_error();
  return greedy_ids(s.model, s.trainer, gen);
}

}  // namespace

TEST(ApiTwoAdapters, OneBaseTwoTrainersGenerateAsSeparateProcesses) {
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  QLFT_NEED_SHARED(text_a, "data/tinyshakespeare.txt");
  QLFT_NEED_SHARED(text_b, "data/tinystories-sample.txt");
  const std::string dir = qlft_test::temp_dir("api-two-adapters");
  qlft_test::Session s;
  ASSERT_EQ(qlft_config_create(&s.cfg), QLFT_OK);
  s.set("quant.type", "nf4");
  s.set("threads", "1");
  s.set("data.seq_len", "32");
  s.set("generate.max_tokens", "24");
  s.set("generate.temperature", "0");  // greedy
  s.set("generate.stop_at_eos", "false");
  ASSERT_EQ(qlft_runtime_create(s.cfg, &s.rt), QLFT_OK);
  ASSERT_EQ(qlft_model_load(s.rt, model_path.c_str(), s.cfg, &s.model), QLFT_OK)
      << qlft_last_error();
  const uint64_t one_model = weights_reserved(s.rt);
  ASSERT_GT(one_model, 0u);

  qlft_dataset* data_b = nullptr;
  ASSERT_EQ(qlft_dataset_load(s.model, text_a.c_str(), s.cfg, &s.data), QLFT_OK)
      << qlft_last_error();
  ASSERT_EQ(qlft_dataset_load(s.model, text_b.c_str(), s.cfg, &data_b), QLFT_OK)
      << qlft_last_error();
  qlft_config* cfg_a = trainer_config("4", "5", "0.01");
  qlft_config* cfg_b = trainer_config("8", "11", "0.05");
  qlft_trainer* b = nullptr;
  ASSERT_EQ(qlft_trainer_create(s.model, s.data, cfg_a, &s.trainer), QLFT_OK) << qlft_last_error();
  ASSERT_EQ(qlft_trainer_create(s.model, data_b, cfg_b, &b), QLFT_OK) << qlft_last_error();
  qlft_trainer* a = s.trainer;
  for (int i = 0; i < 4; ++i) {
    step(a);
    step(b);
    // One copy of the base while both adapters train: the model's own bytes, not two models'.
    EXPECT_EQ(weights_reserved(s.rt), one_model) << "after step " << i + 1;
  }
  qlft_memory_report via_trainer{};
  via_trainer.struct_size = sizeof via_trainer;
  ASSERT_EQ(qlft_trainer_memory_report(b, &via_trainer), QLFT_OK);
  EXPECT_EQ(via_trainer.reserved[QLFT_MEM_WEIGHTS], one_model);
  EXPECT_EQ(via_trainer.peak[QLFT_MEM_WEIGHTS], one_model) << "a second copy existed at some time";

  const std::vector<int32_t> base = greedy_ids(s.model, nullptr, s.cfg);
  const std::vector<int32_t> with_a = greedy_ids(s.model, a, s.cfg);
  const std::vector<int32_t> with_b = greedy_ids(s.model, b, s.cfg);
  ASSERT_EQ(base.size(), 24u);
  ASSERT_EQ(with_a.size(), 24u);
  ASSERT_EQ(with_b.size(), 24u);
  EXPECT_NE(with_a, base) << "A's adapter did not change the text";
  EXPECT_NE(with_b, base) << "B's adapter did not change the text";
  EXPECT_NE(with_a, with_b) << "A and B generate the same ids";
  // Generating with one adapter leaves the model and the other trainer as they were.
  EXPECT_EQ(greedy_ids(s.model, nullptr, s.cfg), base);
  EXPECT_EQ(greedy_ids(s.model, a, s.cfg), with_a);

  const std::string dir_a = dir + "/adapter-a", dir_b = dir + "/adapter-b";
  ASSERT_EQ(qlft_trainer_save_adapter(a, dir_a.c_str(), "peft"), QLFT_OK) << qlft_last_error();
  ASSERT_EQ(qlft_trainer_save_adapter(b, dir_b.c_str(), "peft"), QLFT_OK) << qlft_last_error();
  qlft_trainer_free(b);
  qlft_dataset_free(data_b);

  EXPECT_EQ(ids_in_fresh_process(model_path, s.cfg, cfg_a, dir_a), with_a);
  EXPECT_EQ(ids_in_fresh_process(model_path, s.cfg, cfg_b, dir_b), with_b);
  qlft_config_free(cfg_b);
  qlft_config_free(cfg_a);
}
