// What a run reads and writes, refused when it is not what it claims (issue 16): YAML duplicate
// keys, integer limits as printed, optim.eps 0, setting names in messages that exist,
// adapter_config.json values out of their settings' ranges, a .gguf given as a PEFT directory,
// invalid UTF-8 in a .txt, a checkpoint whose data was corrupted, a diverged adapter; and the
// PEFT directory written whole with the record of how its base was stored (issue 15).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "config/config.h"
#include "config/config_file.h"
#include "config/keys.h"
#include "core/error.h"
#include "data/records.h"
#include "model/model.h"
#include "support/test_support.h"
#include "train/adapter_io.h"
#include "train/trainer.h"

using namespace qlft;
namespace fs = std::filesystem;

namespace {

void write_text(const std::string& p, const std::string& s) {
  std::ofstream(p, std::ios::binary) << s;
}
std::string read_text(const std::string& p) {
  std::vector<uint8_t> b = qlft_test::read_file(p);
  return std::string(b.begin(), b.end());
}
// Runs f, which must throw an Error with status st whose message holds every one of parts.
template <class F>
void expect_error(F f, int32_t st, std::vector<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), st) << e.what();
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(RunInputs, YamlDuplicateKeysAreRefusedNamingBothLines) {
  Config c;
  expect_error([&] { load_config_text(c, "threads: 1\nseed: 3\nthreads: 2\n", "run.yaml"); },
               QLFT_ERR_INVALID_ARGUMENT, {"run.yaml:3", "threads is set twice", "line 1"});
  // The same setting nested and dotted.
  expect_error([&] { load_config_text(c, "lora:\n  r: 4\nlora.r: 8\n", "run.yaml"); },
               QLFT_ERR_INVALID_ARGUMENT, {"run.yaml:3", "lora.r is set twice", "line 2"});
  EXPECT_EQ(c.get("threads"), Config().get("threads"));  // nothing applied
}

TEST(RunInputs, EveryIntegerLimitAsPrintedIsAcceptedAndExponentsWork) {
  Config c;
  for (size_t i = 0; i < key_count(); ++i) {
    const KeyDef& k = key_at(i);
    if (k.type != KeyType::Int) continue;
    // key_allowed is what docs/CONFIG.md prints: "lo..hi" (or ">= lo", maybe "or words").
    std::string allowed = key_allowed(k);
    allowed = allowed.substr(0, allowed.find(" or "));
    size_t dots = allowed.find("..");
    if (dots == std::string::npos) continue;
    for (std::string limit : {allowed.substr(0, dots), allowed.substr(dots + 2)}) {
      SCOPED_TRACE(std::string(k.name) + " = " + limit);
      EXPECT_NO_THROW(c.set(k.name, limit));
    }
  }
  c.set("train.max_steps", "1e15");
  EXPECT_EQ(c.get_int("train.max_steps"), 1000000000000000LL);
  c.set("train.save_every", "2.5e2");
  EXPECT_EQ(c.get_int("train.save_every"), 250);
  EXPECT_THROW(c.set("train.save_every", "2.5"), Error);  // not a whole number
  EXPECT_THROW(c.set("train.max_steps", "1e16"), Error);  // above the limit
}

TEST(RunInputs, OptimEpsZeroIsRefused) {
  Config c;
  expect_error([&] { c.set("optim.eps", "0"); }, QLFT_ERR_INVALID_ARGUMENT, {"optim.eps"});
  EXPECT_NO_THROW(c.set("optim.eps", "1e-12"));
}

// Every `group.name` written inside a string literal of the sources, where group is a settings
// group, must be a real setting: a message telling the user to set a key that does not exist
// (train.checkpointing for train.grad_checkpointing) is a dead end.
TEST(RunInputs, EverySettingNamedInAMessageExists) {
  std::set<std::string> groups;
  for (size_t i = 0; i < key_count(); ++i) {
    std::string n = key_at(i).name;
    if (n.find('.') != std::string::npos) groups.insert(n.substr(0, n.find('.')));
  }
  std::string alt;
  for (const auto& g : groups) alt += (alt.empty() ? "" : "|") + g;
  const std::regex literal(R"("(?:[^"\\\n]|\\.)*")");
  const std::regex key("(?:^|[^A-Za-z0-9_./-])((?:" + alt +
                       R"()\.[a-z][a-z0-9_]*)(?![A-Za-z0-9_/]))");
  const std::set<std::string> file_ext = {"txt",         "json", "jsonl", "gguf",
                                          "safetensors", "yaml", "md"};
  std::vector<std::string> bad;
  size_t files = 0;
  for (const char* dir : {"src", "tools"})
    for (const auto& e :
         fs::recursive_directory_iterator(std::string(QLFT_SOURCE_DIR) + "/" + dir)) {
      std::string ext = e.path().extension().string();
      if (ext != ".cpp" && ext != ".h" && ext != ".cu") continue;
      ++files;
      std::ifstream in(e.path());
      std::string line;
      int n = 0;
      while (std::getline(in, line)) {
        ++n;
        for (std::sregex_iterator it(line.begin(), line.end(), literal), end; it != end; ++it) {
          std::string lit = it->str();
          for (std::sregex_iterator k(lit.begin(), lit.end(), key); k != end; ++k) {
            std::string name = (*k)[1];
            if (file_ext.count(name.substr(name.find('.') + 1))) continue;  // a file name
            if (find_key(name)) continue;
            // A group prefix of several keys ("lora.*" is written as lora.<x>): must start one.
            bool prefix = false;
            for (size_t i = 0; i < key_count(); ++i)
              prefix |= std::string(key_at(i).name).rfind(name + "_", 0) == 0;
            if (!prefix) bad.push_back(e.path().string() + ":" + std::to_string(n) + ": " + name);
          }
        }
      }
    }
  EXPECT_GT(files, 100u);
  EXPECT_TRUE(bad.empty()) << [&] {
    std::string s;
    for (const auto& b : bad) s += b + "\n";
    return s;
  }();
}

TEST(RunInputs, InvalidUtf8InATextFileIsRefusedNamingTheLine) {
  const std::string dir = qlft_test::temp_dir("run_inputs_utf8");
  const std::string p = dir + "/d.txt";
  write_text(p, "fine text\n\nmore fine\nbad \xff\xfe byte\n\nlast \xe2\x82\xac ok\n");
  data::ReadOptions opt;
  data::DropLog log;
  expect_error([&] { data::read_records(p, opt, log); }, QLFT_ERR_FORMAT,
               {p + ":4", "0xff is not valid UTF-8"});
  opt.skip_bad = true;
  std::vector<data::Record> r = data::read_records(p, opt, log);
  ASSERT_EQ(r.size(), 2u);  // the bad document is dropped, the euro sign is fine
  EXPECT_EQ(log.by_reason["invalid_utf8"], 1u);
  // A sequence cut off at the end of the file is invalid too.
  write_text(p, "cut \xe2\x82");
  opt.skip_bad = false;
  EXPECT_THROW(data::read_records(p, opt, log), Error);
}

TEST(RunInputs, AGgufGivenAsAPeftDirectorySaysWhatItIs) {
  const std::string dir = qlft_test::temp_dir("run_inputs_gguf");
  write_text(dir + "/adapter.gguf", "GGUF");
  expect_error([&] { read_peft_config(dir + "/adapter.gguf"); }, QLFT_ERR_INVALID_ARGUMENT,
               {"adapter.gguf: not a directory", "PEFT directory", "llama.cpp"});
}

TEST(RunInputs, AdapterConfigValuesAreHeldToTheirSettingsRanges) {
  const std::string dir = qlft_test::temp_dir("run_inputs_peft_cfg");
  auto cfg = [&](const std::string& extra) {
    write_text(
        dir + "/adapter_config.json",
        "{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": [\"q_proj\"]" + extra + "}");
  };
  for (const char* v : {"1e30", "-2", "0"}) {
    cfg(std::string(", \"lora_alpha\": ") + v);
    expect_error([&] { read_peft_config(dir); }, QLFT_ERR_FORMAT, {"lora_alpha", "lora.alpha"});
  }
  cfg(", \"lora_alpha\": 8, \"lora_dropout\": 1.5");
  expect_error([&] { read_peft_config(dir); }, QLFT_ERR_FORMAT, {"lora_dropout", "lora.dropout"});
  cfg(", \"lora_alpha\": 8, \"lora_dropout\": 0.1");
  LoraConfig c = read_peft_config(dir);
  EXPECT_EQ(c.alpha, 8.0f);
}

class RunInputsModel : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string m = qlft_test::shared_file("models/stories260K.gguf");
    if (m.empty())
      QLFT_SKIP("shared-missing") << "stories260K.gguf not found (set QLFT_SHARED_DIR)";
    LoadOptions lo;
    lo.quant_type = qlft::QuantType::Keep;
    model_ = load_model(&tracker_, m, lo);
  }
  Config config() const {
    Config c;
    c.set("lora.r", "4");
    c.set("train.max_steps", "1");
    c.set("seed", "9");
    return c;
  }
  MemoryTracker tracker_;
  std::unique_ptr<Model> model_;
};

TEST_F(RunInputsModel, ACorruptedCheckpointIsRefusedOnResume) {
  const std::string path = qlft_test::temp_dir("run_inputs_ckpt") + "/checkpoint.safetensors";
  Trainer t(*model_, &tracker_, nullptr, qlft::parse_run_spec(config()));
  t.save_checkpoint(path);
  std::vector<uint8_t> bytes = qlft_test::read_file(path);
  // The last bytes are tensor data (the header is at the front): flip one bit there.
  bytes[bytes.size() - 3] ^= 0x10;
  qlft_test::write_file(path, bytes.data(), bytes.size());
  Trainer fresh(*model_, &tracker_, nullptr, qlft::parse_run_spec(config()));
  expect_error([&] { fresh.resume(path); }, QLFT_ERR_FORMAT, {path, "corrupted", "checksum"});
  bytes[bytes.size() - 3] ^= 0x10;  // restored: loads
  qlft_test::write_file(path, bytes.data(), bytes.size());
  EXPECT_NO_THROW(fresh.resume(path));
}

TEST_F(RunInputsModel, ADivergedAdapterIsNeverWrittenOverTheLastFiniteOne) {
  const std::string dir = qlft_test::temp_dir("run_inputs_nan");
  const std::string ckpt = dir + "/checkpoint.safetensors";
  Trainer t(*model_, &tracker_, nullptr, qlft::parse_run_spec(config()));
  t.save_checkpoint(ckpt);
  save_peft_adapter(t.lora(), dir + "/adapter", "m");
  save_gguf_lora_adapter(t.lora(), dir + "/adapter.gguf");
  const auto ckpt_old = qlft_test::read_file(ckpt);
  const auto peft_old = qlft_test::read_file(dir + "/adapter/adapter_model.safetensors");
  const auto gguf_old = qlft_test::read_file(dir + "/adapter.gguf");
  t.lora().params()[0].w[1] = NAN;
  expect_error([&] { t.save_checkpoint(ckpt); }, QLFT_ERR_NUMERICAL, {ckpt, "non-finite"});
  expect_error([&] { save_peft_adapter(t.lora(), dir + "/adapter", "m"); }, QLFT_ERR_NUMERICAL,
               {"non-finite"});
  expect_error([&] { save_gguf_lora_adapter(t.lora(), dir + "/adapter.gguf"); }, QLFT_ERR_NUMERICAL,
               {"non-finite"});
  EXPECT_EQ(qlft_test::read_file(ckpt), ckpt_old);
  EXPECT_EQ(qlft_test::read_file(dir + "/adapter/adapter_model.safetensors"), peft_old);
  EXPECT_EQ(qlft_test::read_file(dir + "/adapter.gguf"), gguf_old);
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

TEST_F(RunInputsModel, ThePeftDirectoryIsReplacedWholeWithItsBaseRecord) {
  const std::string parent = qlft_test::temp_dir("run_inputs_peft_whole");
  const std::string dir = parent + "/adapter";
  Trainer t(*model_, &tracker_, nullptr, qlft::parse_run_spec(config()));
  save_peft_adapter(t.lora(), dir, "m", BaseStorage{"nf4", true, 64});
  write_text(dir + "/adapter_model.bin", "an older adapter's weights");
  t.lora().params()[0].w[0] += 1.0f;
  save_peft_adapter(t.lora(), dir, "m", BaseStorage{"keep", false, 128});
  // A new directory, not files written into the old one.
  EXPECT_FALSE(fs::exists(dir + "/adapter_model.bin"));
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(parent)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, std::set<std::string>{"adapter"});
  // The base record is a settings fragment the config loader reads.
  Config c;
  load_config_file(c, dir + "/" + kBaseStorageFile);
  EXPECT_EQ(c.get("quant.type"), "keep");
  EXPECT_FALSE(c.get_bool("quant.double_quant"));
  EXPECT_EQ(c.get_int("quant.blocksize"), 128);
  Trainer back(*model_, &tracker_, nullptr, qlft::parse_run_spec(config()));
  load_peft_adapter(back.lora(), dir);
  EXPECT_EQ(back.lora().params()[0].w[0], t.lora().params()[0].w[0]);

  // A directory holding anything else (here a model) is refused, never replaced.
  const std::string other = parent + "/models";
  fs::create_directories(other);
  write_text(other + "/m.gguf", "GGUF...");
  expect_error([&] { save_peft_adapter(t.lora(), other, "m"); }, QLFT_ERR_INVALID_ARGUMENT,
               {other, "m.gguf", "not part of a PEFT adapter"});
  EXPECT_EQ(read_text(other + "/m.gguf"), "GGUF...");
  EXPECT_FALSE(fs::exists(other + "/adapter_config.json"));
}
