// parse_run_spec (config/run_spec.h): every enum against the key table's own choices, the values
// it resolves (micro_batch=auto, dist.zero3_prefetch=auto, train.autotune_cache, sizes), and its
// errors naming the key.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/keys.h"
#include "config/run_spec.h"
#include "core/error.h"

using namespace qlft;

namespace {

std::vector<std::string> choices_of(const char* key) {
  const KeyDef* k = find_key(key);
  EXPECT_NE(k, nullptr) << key;
  std::vector<std::string> out;
  std::stringstream ss(k ? k->choices : "");
  std::string item;
  while (std::getline(ss, item, '|')) out.push_back(item);
  return out;
}

// Every choice the key table offers for `key` parses (read back through `get`) to a value whose
// name_of is that choice, and distinct choices give distinct values.
template <class E, class Get>
void expect_every_choice(const char* key, Get get) {
  SCOPED_TRACE(key);
  const std::vector<std::string> choices = choices_of(key);
  ASSERT_FALSE(choices.empty());
  std::vector<int> seen;
  for (const std::string& c : choices) {
    Config cfg;
    cfg.set(key, c);
    const E v = get(parse_run_spec(cfg));
    EXPECT_EQ(std::string(name_of(v)), c);
    for (int s : seen) EXPECT_NE(s, static_cast<int>(v)) << c;
    seen.push_back(static_cast<int>(v));
  }
}

}  // namespace

TEST(RunSpec, EveryEnumChoiceOfTheKeyTableHasItsValue) {
  expect_every_choice<BackendKind>("backend", [](const RunSpec& s) { return s.backend.kind; });
  expect_every_choice<Precision>("train.precision",
                                 [](const RunSpec& s) { return s.backend.precision; });
  expect_every_choice<QuantType>("quant.type", [](const RunSpec& s) { return s.quant.type; });
  expect_every_choice<OptimizerKind>("optim.name", [](const RunSpec& s) { return s.optim.kind; });
  expect_every_choice<ScheduleKind>("sched.name", [](const RunSpec& s) { return s.sched.kind; });
  expect_every_choice<OffloadTarget>("offload.optimizer",
                                     [](const RunSpec& s) { return s.offload.optimizer; });
  expect_every_choice<OffloadTarget>("offload.params",
                                     [](const RunSpec& s) { return s.offload.params; });
  expect_every_choice<DistBackend>("dist.backend", [](const RunSpec& s) { return s.dist.backend; });
}

TEST(RunSpec, DefaultsAreTheKeyTables) {
  const RunSpec s = parse_run_spec(Config());
  EXPECT_EQ(s.backend.kind, BackendKind::Cpu);
  EXPECT_EQ(s.backend.precision, Precision::FP32);
  EXPECT_FALSE(is_low_precision(s.backend.precision));
  EXPECT_FALSE(s.train.micro_batch.is_auto);
  EXPECT_EQ(s.train.micro_batch.n, 4);
  EXPECT_FALSE(s.train.accumulation_set);
  EXPECT_EQ(s.lora.r, 8);
  EXPECT_EQ(s.lora.target_modules.size(), 7u);
  EXPECT_EQ(s.lora.seed, 42u);
  EXPECT_EQ(s.train.seed, 42u);
  EXPECT_EQ(s.data.max_record_bytes, 1u << 20);
  EXPECT_EQ(s.dist.row_chunk_bytes, 2048u << 10);
  EXPECT_EQ(s.dist.bucket_bytes, 256u << 10);
  EXPECT_EQ(s.train.autotune_cache, "qlft-out/autotune.json");
  EXPECT_FALSE(s.log.set);
}

TEST(RunSpec, ResolvesWhatTheSettingsLeaveOpen) {
  Config c;
  c.set("train.micro_batch", "AUTO");
  c.set("train.accumulation", "3");
  c.set("memory.limit", "2G");
  c.set("dist.row_chunk_kib", "3");
  c.set("train.output_dir", "/runs/a");
  c.set("seed", "7");
  c.set("train.precision", "bf16");
  c.set("log.level", "debug");
  RunSpec s = parse_run_spec(c);
  EXPECT_TRUE(s.train.micro_batch.is_auto);
  EXPECT_EQ(s.train.micro_batch.n, 1);
  EXPECT_TRUE(s.train.accumulation_set);
  EXPECT_EQ(s.train.accumulation, 3);
  EXPECT_EQ(s.memory.limit, 2ull << 30);
  EXPECT_EQ(s.dist.row_chunk_bytes, 3u * 1024);
  EXPECT_EQ(s.train.autotune_cache, "/runs/a/autotune.json");
  EXPECT_EQ(s.lora.seed, 7u);
  EXPECT_EQ(s.train.seed, 7u);
  EXPECT_TRUE(is_low_precision(s.backend.precision));
  EXPECT_TRUE(s.log.set);
  EXPECT_EQ(s.log.level, QLFT_LOG_DEBUG);
  c.set("train.autotune_cache", "off");
  EXPECT_EQ(parse_run_spec(c).train.autotune_cache, "");
  c.set("train.autotune_cache", "/tmp/c.json");
  EXPECT_EQ(parse_run_spec(c).train.autotune_cache, "/tmp/c.json");

  // dist.zero3_prefetch=auto: on unless the ranks talk over MPI.
  Config d;
  EXPECT_TRUE(parse_run_spec(d).dist.prefetch);
  d.set("dist.backend", "mpi");
  EXPECT_FALSE(parse_run_spec(d).dist.prefetch);
  d.set("dist.zero3_prefetch", "true");
  EXPECT_TRUE(parse_run_spec(d).dist.prefetch);
  d.set("dist.backend", "nccl");
  d.set("dist.zero3_prefetch", "false");
  EXPECT_FALSE(parse_run_spec(d).dist.prefetch);
}

TEST(RunSpec, ErrorsNameTheKey) {
  Config c;
  c.set("data.vars", "name=x,oops");
  try {
    parse_run_spec(c);
    ADD_FAILURE() << "expected QLFT_ERR_INVALID_ARGUMENT";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("data.vars"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("oops"), std::string::npos) << e.what();
  }
}
