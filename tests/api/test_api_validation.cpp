// What the C ABI refuses before it works, and how its messages read (issue 44): a trainer
// without data does not "train"; messages name the entry point called (not "operator()", not
// another function) and the file at fault (not a config.json beside a .txt); a GGUF whose
// vocabulary and embedding disagree, NaN eps, more KV heads than heads and zero-sized tensors
// are refused by the model load and by the estimate alike (one check, model.h
// check_model_config); offload.dir, the MPI plugin and lora.init_from are checked when the
// runtime is created, before any model or data loads. Hostile files are built here.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstring>
#include <string>

#include "api/api_session.h"
#include "qlft.h"
#include "support/format_cases.h"
#include "support/test_support.h"

namespace {

bool starts_with(const std::string& s, const std::string& p) {
  return s.compare(0, p.size(), p) == 0;
}
bool has(const std::string& s, const std::string& p) {
  return s.find(p) != std::string::npos;
}

std::string write_gguf(const std::string& dir, const std::string& name,
                       const qlft_test::RawGguf& g) {
  const std::vector<uint8_t> b = g.build();
  const std::string p = dir + "/" + name;
  qlft_test::write_file(p, b.data(), b.size());
  return p;
}

// The status and message of qlft_model_load and of qlft_estimate_memory on path.
struct Both {
  int32_t load = QLFT_OK, estimate = QLFT_OK;
  std::string load_msg, estimate_msg;
};
Both load_and_estimate(const std::string& path) {
  Both b;
  qlft_test::Session s;
  EXPECT_EQ(qlft_config_create(&s.cfg), QLFT_OK);
  s.set("quant.type", "keep");
  EXPECT_EQ(qlft_runtime_create(s.cfg, &s.rt), QLFT_OK) << qlft_last_error();
  b.load = qlft_model_load(s.rt, path.c_str(), s.cfg, &s.model);
  b.load_msg = qlft_last_error();
  qlft_memory_estimate e{};
  e.struct_size = sizeof e;
  b.estimate = qlft_estimate_memory(nullptr, path.c_str(), s.cfg, &e);
  b.estimate_msg = qlft_last_error();
  return b;
}

qlft_test::RawKV* kv(qlft_test::RawGguf& g, const char* key) {
  qlft_test::RawKV* k = g.find_kv(key);
  EXPECT_NE(k, nullptr) << key;
  return k;
}

}  // namespace

TEST(ApiValidation, TinyModelLoadsAndEstimates) {  // the base the cases below change
  const std::string dir = qlft_test::temp_dir("api_valid_ok");
  const Both b = load_and_estimate(write_gguf(dir, "ok.gguf", qlft_test::tiny_llama_gguf()));
  EXPECT_EQ(b.load, QLFT_OK) << b.load_msg;
  EXPECT_EQ(b.estimate, QLFT_OK) << b.estimate_msg;
}

TEST(ApiValidation, VocabularySmallerThanEmbeddingIsRefusedAtLoad) {
  const std::string dir = qlft_test::temp_dir("api_valid_vocab");
  qlft_test::TinySpec spec;
  spec.vocab = 32;
  qlft_test::RawGguf g = qlft_test::tiny_llama_gguf(spec);
  std::vector<std::string> toks;
  for (int i = 0; i < 10; ++i) toks.push_back("t" + std::to_string(i));
  *kv(g, "tokenizer.ggml.tokens") = qlft_test::kv_str_array("tokenizer.ggml.tokens", toks);
  const std::string p = write_gguf(dir, "vocab.gguf", g);
  const Both b = load_and_estimate(p);
  EXPECT_EQ(b.load, QLFT_ERR_FORMAT) << b.load_msg;
  EXPECT_TRUE(has(b.load_msg, "vocab.gguf: the vocabulary has 10 tokens")) << b.load_msg;
  EXPECT_TRUE(has(b.load_msg, "'token_embd.weight' has 32 rows")) << b.load_msg;
  EXPECT_EQ(b.estimate, QLFT_ERR_FORMAT) << b.estimate_msg;
  EXPECT_TRUE(has(b.estimate_msg, "the vocabulary has 10 tokens")) << b.estimate_msg;
}

TEST(ApiValidation, ShapeSanityIsTheSameForLoadAndEstimate) {
  const std::string dir = qlft_test::temp_dir("api_valid_shape");
  struct Case {
    const char* name;
    void (*edit)(qlft_test::RawGguf&);
    const char* message;
  };
  const Case cases[] = {
      {"nan_eps",
       [](qlft_test::RawGguf& g) {
         *kv(g, "llama.attention.layer_norm_rms_epsilon") =
             qlft_test::kv_f32("llama.attention.layer_norm_rms_epsilon", std::nanf(""));
       },
       "rms eps (nan)"},
      {"kv_heads_above_heads",
       [](qlft_test::RawGguf& g) {
         *kv(g, "llama.attention.head_count_kv") =
             qlft_test::kv_u32("llama.attention.head_count_kv", 4);
       },
       "head count 2 is not a multiple of the KV head count 4"},
      {"zero_dimension",
       [](qlft_test::RawGguf& g) {
         g.find("blk.0.attn_q.weight")->ne = {8, 0};
       },
       "attn_q.weight"},
  };
  for (const Case& c : cases) {
    qlft_test::RawGguf g = qlft_test::tiny_llama_gguf();
    c.edit(g);
    const Both b = load_and_estimate(write_gguf(dir, std::string(c.name) + ".gguf", g));
    EXPECT_EQ(b.load, QLFT_ERR_FORMAT) << c.name << ": " << b.load_msg;
    EXPECT_EQ(b.estimate, QLFT_ERR_FORMAT) << c.name << ": " << b.estimate_msg;
    EXPECT_TRUE(has(b.load_msg, c.message)) << c.name << ": " << b.load_msg;
    EXPECT_TRUE(has(b.estimate_msg, c.message)) << c.name << ": " << b.estimate_msg;
  }
}

TEST(ApiValidation, TextFileIsNotAModelWhateverIsBesideIt) {
  const std::string dir = qlft_test::temp_dir("api_valid_txt");
  const std::string cfg = qlft_test::tiny_hf_config();
  qlft_test::write_file(dir + "/config.json", cfg.data(), cfg.size());
  qlft_test::write_file(dir + "/notes.txt", "hello\n", 6);
  qlft_test::Session s;
  ASSERT_EQ(qlft_config_create(&s.cfg), QLFT_OK);
  ASSERT_EQ(qlft_runtime_create(s.cfg, &s.rt), QLFT_OK) << qlft_last_error();
  EXPECT_EQ(qlft_model_load(s.rt, (dir + "/notes.txt").c_str(), s.cfg, &s.model), QLFT_ERR_FORMAT);
  const std::string m = qlft_last_error();
  EXPECT_TRUE(has(m, "notes.txt: not a model")) << m;
  EXPECT_FALSE(has(m, "config.json:")) << m;
}

TEST(ApiValidation, MessagesNameTheFunctionCalled) {
  QLFT_NEED_SHARED(model, "models/stories260K.gguf");
  qlft_test::Session s;
  ASSERT_EQ(qlft_config_create(&s.cfg), QLFT_OK);
  s.set("threads", "1");
  ASSERT_EQ(qlft_runtime_create(s.cfg, &s.rt), QLFT_OK) << qlft_last_error();
  ASSERT_EQ(qlft_model_load(s.rt, model.c_str(), s.cfg, &s.model), QLFT_OK) << qlft_last_error();
  ASSERT_EQ(qlft_trainer_create(s.model, nullptr, s.cfg, &s.trainer), QLFT_OK) << qlft_last_error();

  // A trainer without data has nothing to train on: an error, not QLFT_OK.
  EXPECT_EQ(qlft_trainer_train(s.trainer, nullptr, nullptr), QLFT_ERR_INVALID_ARGUMENT);
  std::string m = qlft_last_error();
  EXPECT_TRUE(starts_with(m, "qlft_trainer_train: ")) << m;
  EXPECT_TRUE(has(m, "no training data")) << m;

  EXPECT_EQ(qlft_trainer_memory_report(s.trainer, nullptr), QLFT_ERR_INVALID_ARGUMENT);
  m = qlft_last_error();
  EXPECT_TRUE(starts_with(m, "qlft_trainer_memory_report: ")) << m;
  EXPECT_EQ(qlft_runtime_memory_report(s.rt, nullptr), QLFT_ERR_INVALID_ARGUMENT);
  m = qlft_last_error();
  EXPECT_TRUE(starts_with(m, "qlft_runtime_memory_report: ")) << m;

  EXPECT_EQ(qlft_trainer_evaluate(s.trainer, nullptr, nullptr), QLFT_ERR_INVALID_ARGUMENT);
  m = qlft_last_error();
  EXPECT_TRUE(starts_with(m, "qlft_trainer_evaluate: ")) << m;

  const std::string dir = qlft_test::temp_dir("api_valid_msgs");
  const std::string text = "Once upon a time there was a little cat.\n";
  qlft_test::write_file(dir + "/d.txt", text.data(), text.size());
  s.set("data.seq_len", "16");
  ASSERT_EQ(qlft_dataset_load(s.model, (dir + "/d.txt").c_str(), s.cfg, &s.data), QLFT_OK)
      << qlft_last_error();
  EXPECT_EQ(qlft_dataset_get_stats(s.data, nullptr), QLFT_ERR_INVALID_ARGUMENT);
  m = qlft_last_error();
  EXPECT_TRUE(starts_with(m, "qlft_dataset_get_stats: ")) << m;
}

TEST(ApiValidation, RuntimeChecksWhatTheRunWillNeed) {
  const std::string dir = qlft_test::temp_dir("api_valid_rt");
  struct Case {
    const char* key;
    std::string value;
    int32_t status;
    const char* message;
  };
  qlft_test::write_file(dir + "/file", "x", 1);
  const Case cases[] = {
      {"offload.dir", dir + "/missing", QLFT_ERR_IO, "offload.dir"},
      {"offload.dir", dir + "/file", QLFT_ERR_IO, "is not a directory"},
      {"lora.init_from", dir + "/no-adapter", QLFT_ERR_IO, "no-adapter/adapter_config.json"},
  };
  for (const Case& c : cases) {
    qlft_test::Session s;
    ASSERT_EQ(qlft_config_create(&s.cfg), QLFT_OK);
    s.set(c.key, c.value.c_str());
    EXPECT_EQ(qlft_runtime_create(s.cfg, &s.rt), c.status) << c.key << "=" << c.value;
    const std::string m = qlft_last_error();
    EXPECT_TRUE(has(m, c.message)) << c.key << ": " << m;
  }
  // The MPI plugin: a path that does not exist is named (dist.backend=mpi), before any load.
  const char* old = std::getenv("QLFT_MPI_PLUGIN");
  const std::string saved = old ? old : "";
  const std::string missing = dir + "/not-installed/libqlft-mpi.so";
  setenv("QLFT_MPI_PLUGIN", missing.c_str(), 1);
  {
    qlft_test::Session s;
    ASSERT_EQ(qlft_config_create(&s.cfg), QLFT_OK);
    s.set("dist.backend", "mpi");
    EXPECT_EQ(qlft_runtime_create(s.cfg, &s.rt), QLFT_ERR_UNSUPPORTED);
    const std::string m = qlft_last_error();
    EXPECT_TRUE(has(m, missing)) << m;
  }
  if (old)
    setenv("QLFT_MPI_PLUGIN", saved.c_str(), 1);
  else
    unsetenv("QLFT_MPI_PLUGIN");
}
