// Issue 44 through the C ABI, as an embedding program would call it: no writer replaces an input
// of its trainer or a file of its run (the model it loaded, the run's metrics), whatever the
// spelling (symlink, hard link, `..`), and every refusal is QLFT_ERR_INVALID_ARGUMENT naming
// both paths with the input byte-identical; saves keep the permissions of what they replace.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "api/api_session.h"
#include "qlft.h"
#include "support/test_support.h"

namespace fs = std::filesystem;
using qlft_test::Session;

namespace {

std::vector<uint8_t> bytes(const std::string& p) {
  return qlft_test::read_file(p);
}
mode_t mode_of(const std::string& p) {
  struct stat st;
  EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

// A trainer on a copy of stories260K (the refusal is tested on the copy, so a failing test
// cannot destroy the shared model) with its run directory under `dir`.
void open_trainer(Session& s, const std::string& model, const std::string& text,
                  const std::string& dir) {
  ASSERT_EQ(qlft_config_create(&s.cfg), QLFT_OK);
  s.set("quant.type", "keep");
  s.set("train.max_steps", "1");
  s.set("data.seq_len", "32");
  s.set("threads", "1");
  s.set("train.output_dir", (dir + "/run").c_str());
  ASSERT_EQ(qlft_runtime_create(s.cfg, &s.rt), QLFT_OK);
  ASSERT_EQ(qlft_model_load(s.rt, model.c_str(), s.cfg, &s.model), QLFT_OK) << qlft_last_error();
  ASSERT_EQ(qlft_dataset_load(s.model, text.c_str(), s.cfg, &s.data), QLFT_OK) << qlft_last_error();
  ASSERT_EQ(qlft_trainer_create(s.model, s.data, s.cfg, &s.trainer), QLFT_OK) << qlft_last_error();
}

void expect_refused(int32_t st, const std::string& out, const std::string& input) {
  const std::string msg = qlft_last_error();
  EXPECT_EQ(st, QLFT_ERR_INVALID_ARGUMENT) << msg;
  EXPECT_NE(msg.find(out), std::string::npos) << msg;
  EXPECT_NE(msg.find(input), std::string::npos) << msg;
}

}  // namespace

// Item 2: qlft_trainer_export_merged over the model file the trainer uses.
TEST(ApiOutputs, MergedExportOverTheLoadedModelIsRefused) {
  QLFT_NEED_SHARED(shared_model, "models/stories260K.gguf");
  QLFT_NEED_SHARED(shared_text, "data/tinyshakespeare.txt");
  const std::string dir = qlft_test::temp_dir("api_outputs_model");
  const std::string model = dir + "/m.gguf", text = dir + "/data.txt";
  fs::copy_file(shared_model, model);
  fs::copy_file(shared_text, text);
  fs::create_symlink("m.gguf", dir + "/link.gguf");
  fs::create_hard_link(model, dir + "/hard.gguf");
  fs::create_directories(dir + "/sub");
  fs::create_directories(dir + "/run");
  const std::vector<uint8_t> before = bytes(model);
  Session s;
  open_trainer(s, model, text, dir);
  for (const std::string& out :
       {model, dir + "/link.gguf", dir + "/hard.gguf", dir + "/sub/../m.gguf"}) {
    expect_refused(qlft_trainer_export_merged(s.trainer, out.c_str(), "gguf-f16"), out, model);
    EXPECT_TRUE(bytes(model) == before) << out;
  }
  // The training data is an input too; a file of the run other than the checkpoint is the
  // run's own (its metrics, its lock).
  const std::vector<uint8_t> data_before = bytes(text);
  expect_refused(qlft_trainer_save_adapter(s.trainer, text.c_str(), "gguf"), text, text);
  EXPECT_TRUE(bytes(text) == data_before);
  expect_refused(qlft_trainer_save_checkpoint(s.trainer, (dir + "/run/metrics.jsonl").c_str()),
                 dir + "/run/metrics.jsonl", "metrics.jsonl");
  // Beside it is fine, and the written file is a model.
  const std::string merged = dir + "/merged.gguf";
  ASSERT_EQ(qlft_trainer_export_merged(s.trainer, merged.c_str(), "gguf-f16"), QLFT_OK)
      << qlft_last_error();
  EXPECT_GT(fs::file_size(merged), 1000u);
  EXPECT_TRUE(bytes(model) == before);
}

// Item 3: qlft_report_write with the run's metrics.jsonl as its output.
TEST(ApiOutputs, ReportOverTheRunsMetricsIsRefused) {
  const std::string dir = qlft_test::temp_dir("api_outputs_report");
  const std::string metrics = dir + "/metrics.jsonl";
  const std::string text = "{\"step\": 1, \"loss\": 2.0}\n{\"step\": 2, \"loss\": 1.5}\n";
  { std::ofstream(metrics) << text; }
  fs::create_symlink("metrics.jsonl", dir + "/m.link");
  for (const std::string& out : {metrics, dir + "/m.link", dir + "/./metrics.jsonl"}) {
    qlft_report_options o{};
    o.struct_size = sizeof o;
    o.output_path = out.c_str();
    expect_refused(qlft_report_write(dir.c_str(), &o), out, metrics);
    const std::vector<uint8_t> after = bytes(metrics);
    EXPECT_EQ(std::string(after.begin(), after.end()), text);
  }
  qlft_report_options o{};
  o.struct_size = sizeof o;
  const std::string lock = dir + "/.qlft.lock";
  o.output_path = lock.c_str();
  EXPECT_EQ(qlft_report_write(dir.c_str(), &o), QLFT_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(qlft_report_write(dir.c_str(), nullptr), QLFT_OK) << qlft_last_error();
  EXPECT_TRUE(fs::exists(dir + "/report.html"));
}

// Item 10: saves keep the permissions of what they replace (checkpoint, both adapters).
TEST(ApiOutputs, SavesKeepTheModeOfTheFilesTheyReplace) {
  QLFT_NEED_SHARED(model, "models/stories260K.gguf");
  QLFT_NEED_SHARED(text, "data/tinyshakespeare.txt");
  const std::string dir = qlft_test::temp_dir("api_outputs_mode");
  Session s;
  open_trainer(s, model, text, dir);
  const std::string ckpt = dir + "/ck.safetensors", gguf = dir + "/a.gguf", peft = dir + "/ad";
  ASSERT_EQ(qlft_trainer_save_checkpoint(s.trainer, ckpt.c_str()), QLFT_OK) << qlft_last_error();
  ASSERT_EQ(qlft_trainer_save_adapter(s.trainer, gguf.c_str(), "gguf"), QLFT_OK);
  ASSERT_EQ(qlft_trainer_save_adapter(s.trainer, peft.c_str(), "peft"), QLFT_OK);
  for (const std::string& p :
       {ckpt, gguf, peft + "/adapter_model.safetensors", peft + "/adapter_config.json"})
    ASSERT_EQ(::chmod(p.c_str(), 0600), 0) << p;
  ASSERT_EQ(::chmod(peft.c_str(), 0700), 0);
  ASSERT_EQ(qlft_trainer_save_checkpoint(s.trainer, ckpt.c_str()), QLFT_OK);
  ASSERT_EQ(qlft_trainer_save_adapter(s.trainer, gguf.c_str(), "gguf"), QLFT_OK);
  ASSERT_EQ(qlft_trainer_save_adapter(s.trainer, peft.c_str(), "peft"), QLFT_OK);
  for (const std::string& p :
       {ckpt, gguf, peft + "/adapter_model.safetensors", peft + "/adapter_config.json"})
    EXPECT_EQ(mode_of(p), 0600u) << p;
  EXPECT_EQ(mode_of(peft), 0700u);
}
