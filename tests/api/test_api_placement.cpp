// A model is only read by the trainers built on it (train/weight_placement.h): with a ZeRO-3
// trainer (one rank: the shards and gathers still replace the weights it reads) and an NVMe
// offload trainer alive on one loaded model, and both stepping, the model generates the same
// greedy text and exports the same merged bytes as before either existed. A trainer that
// converted the shared model (its weights moved into shards or a file) fails here: the second
// streaming trainer, the export (which needs the weights resident) or the text.
#include <gtest/gtest.h>

#include <string>

#include "api/api_session.h"
#include "qlft.h"
#include "support/test_support.h"

namespace {

int32_t append_text(const char* text, void* user) {
  *static_cast<std::string*>(user) += text;
  return 0;
}

std::string greedy(const qlft_model* m, const qlft_config* cfg) {
  std::string out;
  EXPECT_EQ(qlft_generate(m, nullptr, "Once upon a time", cfg, append_text, &out), QLFT_OK)
      << qlft_last_error();
  return out;
}

qlft_config* trainer_config(const char* key, const char* value, const std::string& dir) {
  qlft_config* c = nullptr;
  EXPECT_EQ(qlft_config_create(&c), QLFT_OK);
  for (const auto& kv : {std::pair<const char*, std::string>{"lora.r", "4"},
                         {"data.seq_len", "32"},
                         {"train.micro_batch", "2"},
                         {"train.max_steps", "8"},
                         {"threads", "1"},
                         {"seed", "5"},
                         {"offload.dir", dir},
                         {key, value}})
    EXPECT_EQ(qlft_config_set(c, kv.first, kv.second.c_str()), QLFT_OK) << qlft_last_error();
  return c;
}

double step_loss(qlft_trainer* t) {
  qlft_step_stats st{};
  st.struct_size = sizeof st;
  EXPECT_EQ(qlft_trainer_step(t, &st), QLFT_OK) << qlft_last_error();
  return st.loss;
}

}  // namespace

TEST(ApiPlacement, ModelGeneratesAndExportsWhileZero3AndNvmeTrainersExist) {
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  QLFT_NEED_SHARED(text, "data/tinyshakespeare.txt");
  const std::string dir = qlft_test::temp_dir("api-placement");
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
  ASSERT_EQ(qlft_dataset_load(s.model, text.c_str(), s.cfg, &s.data), QLFT_OK);

  // Before any streaming trainer: the text, a merged export (through a plain trainer whose
  // adapter is never trained, so both exports merge the same zero delta), a resident step's loss.
  const std::string text_before = greedy(s.model, s.cfg);
  ASSERT_FALSE(text_before.empty());
  qlft_config* plain_cfg = trainer_config("offload.params", "none", dir);
  qlft_trainer* exporter = nullptr;
  ASSERT_EQ(qlft_trainer_create(s.model, nullptr, plain_cfg, &exporter), QLFT_OK)
      << qlft_last_error();
  const std::string before = dir + "/before.gguf", during = dir + "/during.gguf";
  ASSERT_EQ(qlft_trainer_export_merged(exporter, before.c_str(), "gguf-f16"), QLFT_OK)
      << qlft_last_error();
  qlft_trainer* plain = nullptr;
  ASSERT_EQ(qlft_trainer_create(s.model, s.data, plain_cfg, &plain), QLFT_OK) << qlft_last_error();
  const double loss1 = step_loss(plain), loss2 = step_loss(plain);
  qlft_trainer_free(plain);

  qlft_config* z3_cfg = trainer_config("dist.zero_stage", "3", dir);
  qlft_config* nvme_cfg = trainer_config("offload.params", "nvme", dir);
  qlft_trainer *z3 = nullptr, *nvme = nullptr;
  ASSERT_EQ(qlft_trainer_create(s.model, s.data, z3_cfg, &z3), QLFT_OK) << qlft_last_error();
  ASSERT_EQ(qlft_trainer_create(s.model, s.data, nvme_cfg, &nvme), QLFT_OK) << qlft_last_error();
  // Both stream the same weights as the resident run reads: the same losses, step by step,
  // interleaved with generation and export on the model.
  EXPECT_EQ(step_loss(z3), loss1);
  EXPECT_EQ(step_loss(nvme), loss1);
  EXPECT_EQ(greedy(s.model, s.cfg), text_before);
  ASSERT_EQ(qlft_trainer_export_merged(exporter, during.c_str(), "gguf-f16"), QLFT_OK)
      << qlft_last_error();
  EXPECT_EQ(step_loss(z3), loss2);
  EXPECT_EQ(step_loss(nvme), loss2);
  EXPECT_EQ(greedy(s.model, s.cfg), text_before);
  const std::string a = qlft_test::read_text(before), b = qlft_test::read_text(during);
  EXPECT_GT(a.size(), 100000u);
  EXPECT_TRUE(a == b) << "the merged export changed while streaming trainers existed";

  qlft_trainer_free(nvme);
  qlft_trainer_free(z3);
  qlft_trainer_free(exporter);
  // And after them: the model as it was.
  EXPECT_EQ(greedy(s.model, s.cfg), text_before);
  qlft_config_free(nvme_cfg);
  qlft_config_free(z3_cfg);
  qlft_config_free(plain_cfg);
}
