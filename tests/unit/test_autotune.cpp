// The micro-batch auto-tuner (issue 10, done-when 4): for three memory.limit budgets on
// stories260K the search finds a micro-batch that trains without running out of memory while
// the next size up does run out (both proven here with real trial steps), in at most 6 trials,
// and the trainer after the search is identical to one that was given the result and never
// searched (checkpoint bytes: LoRA weights, optimizer state, schedule, data position; then the
// next step's loss). The cache makes the next run skip the search.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "config/config.h"
#include "core/error.h"
#include "core/threads.h"
#include "data/dataset.h"
#include "data/tokenizer_encoder.h"
#include "model/model.h"
#include "support/test_support.h"
#include "tokenizer/tokenizer.h"
#include "train/autotune.h"
#include "train/planner.h"
#include "train/trainer.h"

using namespace qlft;

namespace {

constexpr int kSeq = 128;
constexpr int kEffective = 24;  // divisible by 1, 2, 3, 4, 6, 8, 12, 24

Config base_config(const std::string& out) {
  Config c;
  c.set("data.seq_len", std::to_string(kSeq));
  c.set("lora.r", "8");
  c.set("lora.dropout", "0.05");
  c.set("optim.lr", "1e-3");
  c.set("train.max_steps", "3");
  c.set("train.output_dir", out);
  c.set("seed", "11");
  return c;
}

std::string read_all(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

bool all_grads_zero(Trainer& t) {
  for (const LoraAdapter::Param& p : t.lora().params())
    for (int64_t i = 0; i < p.n; ++i)
      if (p.g[i] != 0.f) return false;
  return true;
}

}  // namespace

TEST(AutotuneSearch, ConvergesFromThePlannersStart) {
  for (int K = 1; K <= 40; ++K)
    for (int start : {K - 2, K - 1, K, K + 1, K + 2}) {
      if (start < 1) continue;
      int calls = 0;
      auto fits = [&](int m, uint64_t*) {
        ++calls;
        return m <= K;
      };
      AutotuneResult r = search_micro_batch(fits, start, 64);
      EXPECT_EQ(r.max_fit, K) << "K " << K << " start " << start;
      EXPECT_EQ(r.first_fail, K + 1);
      EXPECT_LE(r.trials.size(), 6u);
      EXPECT_EQ(static_cast<size_t>(calls), r.trials.size());
    }
}

TEST(AutotuneSearch, HalvesThenBisectsAndKeepsARealFit) {
  // A start far above the truth: it backs off by 1, 2, 4, ..., then halves; whatever it keeps
  // did fit.
  auto fits = [](int m, uint64_t*) { return m <= 5; };
  AutotuneResult r = search_micro_batch(fits, 64, 64);
  EXPECT_LE(r.trials.size(), 10u);
  EXPECT_GE(r.max_fit, 1);
  EXPECT_LE(r.max_fit, 5);
  EXPECT_EQ(r.trials[1].micro_batch, 63);
  // The upper bound itself fits: one trial.
  AutotuneResult u = search_micro_batch([](int, uint64_t*) { return true; }, 8, 8);
  EXPECT_EQ(u.max_fit, 8);
  EXPECT_EQ(u.first_fail, 0);
  EXPECT_EQ(u.trials.size(), 1u);
  // Nothing fits.
  EXPECT_THROW(search_micro_batch([](int, uint64_t*) { return false; }, 4, 8), Error);
}

class AutotuneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string m = qlft_test::shared_file("models/stories260K.gguf");
    text_ = qlft_test::shared_file("data/tinyshakespeare.txt");
    if (m.empty() || text_.empty())
      QLFT_SKIP("shared-missing") << "stories260K.gguf or tinyshakespeare.txt";
    set_num_threads(2);
    LoadOptions lo;
    lo.quant_type = qlft::QuantType::Keep;
    model_ = load_model(&tracker_, m, lo);
    tok_ = Tokenizer::from_gguf(*model_->gguf);
    enc_ = std::make_unique<data::TokenizerEncoder>(*tok_);
    Config c = base_config("");
    c.set("data.path", text_);
    data_ =
        std::make_unique<data::Dataset>(data::Dataset::build(qlft::parse_run_spec(c).data, *enc_));
  }
  MemoryTracker tracker_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<data::TokenizerEncoder> enc_;
  std::unique_ptr<data::Dataset> data_;
  std::string text_;
};

TEST_F(AutotuneTest, ThreeBudgets) {
  const std::string dir = qlft_test::temp_dir("autotune");
  // Budgets between the planner's predictions for m and m + 1 (the planner is only the
  // search's start; the trials decide), one of them with a 10% safety margin.
  struct Budget {
    int m;
    double margin;
  } budgets[] = {{2, 0.0}, {5, 0.0}, {9, 0.10}};
  PlanSettings ps = PlanSettings::from_spec(qlft::parse_run_spec(base_config(dir)));
  ps.accumulation = 2;
  const WeightFootprint w = weight_footprint(*model_);
  int n = 0;
  for (const Budget& b : budgets) {
    SCOPED_TRACE("budget for micro-batch " + std::to_string(b.m));
    ps.micro_batch = b.m;
    const uint64_t lo = plan_memory(model_->cfg, w, ps).train_peak;
    ps.micro_batch = b.m + 1;
    const uint64_t hi = plan_memory(model_->cfg, w, ps).train_peak;
    const uint64_t limit = static_cast<uint64_t>(double(lo + (hi - lo) / 2) / (1.0 - b.margin));
    const std::string out = dir + "/run" + std::to_string(n++);

    Config c = base_config(out);
    c.set("train.micro_batch", "auto");
    c.set("train.effective_batch", std::to_string(kEffective));
    c.set("train.autotune_margin", std::to_string(b.margin));
    tracker_.set_limit(limit);
    Trainer a(*model_, &tracker_, data_.get(), qlft::parse_run_spec(c));
    const int micro = a.settings().micro_batch, acc = a.settings().accumulation;
    EXPECT_EQ(micro * acc, kEffective);

    // The search's record, from its cache file.
    nlohmann::json j = nlohmann::json::parse(read_all(out + "/autotune.json"));
    ASSERT_EQ(j["entries"].size(), 1u);
    const nlohmann::json e = j["entries"].begin().value();
    const int max_fit = e["max_fit"], first_fail = e["first_fail"];
    EXPECT_LE(e["trials"].get<int>(), 6);
    EXPECT_EQ(first_fail, max_fit + 1);
    EXPECT_LE(micro, max_fit);
    EXPECT_EQ(e["micro_batch"].get<int>(), micro);
    EXPECT_TRUE(all_grads_zero(a));

    // Prove both ends with real trial steps under the same budget, then train under the limit.
    const uint64_t trial_limit = static_cast<uint64_t>(double(limit) * (1.0 - b.margin));
    tracker_.set_limit(trial_limit);
    uint64_t peak = 0;
    EXPECT_TRUE(a.try_micro_batch(max_fit, kSeq, max_fit < kEffective, &peak));
    EXPECT_LE(peak, trial_limit);
    EXPECT_FALSE(a.try_micro_batch(max_fit + 1, kSeq, max_fit + 1 < kEffective, nullptr));
    EXPECT_TRUE(all_grads_zero(a));
    tracker_.set_limit(limit);

    // A trainer given the result that never searched (its own tracker, no limit).
    MemoryTracker other;
    Config cb = base_config(out + "-plain");
    cb.set("train.micro_batch", std::to_string(micro));
    cb.set("train.accumulation", std::to_string(acc));
    Trainer bt(*model_, &other, data_.get(), qlft::parse_run_spec(cb));
    a.save_checkpoint(out + "/a.safetensors");
    bt.save_checkpoint(out + "/b.safetensors");
    EXPECT_EQ(read_all(out + "/a.safetensors"), read_all(out + "/b.safetensors"));
    StepReport ra, rb;
    ASSERT_TRUE(a.step(&ra));  // under memory.limit: no out-of-memory
    ASSERT_TRUE(bt.step(&rb));
    EXPECT_EQ(ra.loss, rb.loss);
    EXPECT_EQ(ra.grad_norm, rb.grad_norm);
    a.save_checkpoint(out + "/a.safetensors");
    bt.save_checkpoint(out + "/b.safetensors");
    EXPECT_EQ(read_all(out + "/a.safetensors"), read_all(out + "/b.safetensors"));
    std::printf(
        "budget %s (margin %.2f): micro_batch %d x accumulation %d, largest fit %d, "
        "first failure %d, %d trials\n",
        format_bytes(limit).c_str(), b.margin, micro, acc, max_fit, first_fail,
        e["trials"].get<int>());
    tracker_.set_limit(0);
  }
}

TEST_F(AutotuneTest, CacheSkipsTheSearch) {
  const std::string out = qlft_test::temp_dir("autotune-cache");
  Config c = base_config(out);
  c.set("train.micro_batch", "auto");
  c.set("train.effective_batch", "8");
  PlanSettings ps = PlanSettings::from_spec(qlft::parse_run_spec(c));
  ps.accumulation = 2;
  ps.micro_batch = 3;
  const uint64_t limit =
      plan_memory(model_->cfg, weight_footprint(*model_), ps).train_peak * 21 / 20;
  tracker_.set_limit(limit);
  { Trainer a(*model_, &tracker_, data_.get(), qlft::parse_run_spec(c)); }
  const std::string cache = out + "/autotune.json";
  // Rewrite the entry with a result no search would give: the next trainer must take it.
  nlohmann::json j = nlohmann::json::parse(read_all(cache));
  ASSERT_EQ(j["entries"].size(), 1u);
  for (auto& e : j["entries"]) {
    EXPECT_GE(e["micro_batch"].get<int>(), 2);
    e["micro_batch"] = 1;
    e["accumulation"] = 8;
  }
  qlft_test::write_file(cache, j.dump().data(), j.dump().size());
  {
    Trainer b(*model_, &tracker_, data_.get(), qlft::parse_run_spec(c));
    EXPECT_EQ(b.settings().micro_batch, 1);
    EXPECT_EQ(b.settings().accumulation, 8);
  }
  // Another memory.limit is another entry (a new search).
  tracker_.set_limit(limit * 2);
  {
    Trainer b(*model_, &tracker_, data_.get(), qlft::parse_run_spec(c));
    EXPECT_GE(b.settings().micro_batch, 2);
  }
  EXPECT_EQ(nlohmann::json::parse(read_all(cache))["entries"].size(), 2u);
  tracker_.set_limit(0);
}

TEST_F(AutotuneTest, EffectiveBatchWithFixedMicroBatch) {
  Config c = base_config(qlft_test::temp_dir("autotune-fixed"));
  c.set("train.micro_batch", "4");
  c.set("train.effective_batch", "12");
  {
    Trainer t(*model_, &tracker_, data_.get(), qlft::parse_run_spec(c));
    EXPECT_EQ(t.settings().micro_batch, 4);
    EXPECT_EQ(t.settings().accumulation, 3);
  }
  c.set("train.accumulation", "2");  // disagrees with 12 / 4
  EXPECT_THROW(Trainer(*model_, &tracker_, data_.get(), qlft::parse_run_spec(c)), Error);
  c.set("train.accumulation", "3");
  EXPECT_NO_THROW(Trainer(*model_, &tracker_, data_.get(), qlft::parse_run_spec(c)));
  c.set("train.effective_batch", "10");  // not a multiple of 4
  EXPECT_THROW(Trainer(*model_, &tracker_, data_.get(), qlft::parse_run_spec(c)), Error);
}

TEST(AutotuneConfig, MicroBatchAcceptsAuto) {
  Config c;
  c.set("train.micro_batch", "auto");
  EXPECT_EQ(c.get("train.micro_batch"), "auto");
  c.set("train.micro_batch", "AUTO");
  EXPECT_EQ(c.get("train.micro_batch"), "auto");
  EXPECT_THROW(c.set("train.micro_batch", "automatic"), Error);
  EXPECT_THROW(c.set("train.micro_batch", "0"), Error);
  c.set("train.micro_batch", "7");
  EXPECT_EQ(c.get_int("train.micro_batch"), 7);
}

// The cache tells sharded and offloaded runs apart (their memory differs), and a ZeRO stage on
// one rank searches like stage 0 there (same state, no exchange buffer), ending in a step that
// fits the limit.
TEST_F(AutotuneTest, CacheKeyHasRanksStageAndOffload) {
  const std::string out = qlft_test::temp_dir("autotune-zero");
  Config c = base_config(out);
  c.set("train.micro_batch", "2");
  std::string keys[3];
  const char* stages[3] = {"0", "1", "3"};
  for (int i = 0; i < 3; ++i) {
    MemoryTracker tr;
    LoadOptions lo;
    lo.quant_type = qlft::QuantType::Keep;
    auto m = load_model(&tr, qlft_test::shared_file("models/stories260K.gguf"), lo);
    c.set("dist.zero_stage", stages[i]);
    Trainer t(*m, &tr, nullptr, qlft::parse_run_spec(c));
    keys[i] = autotune_cache_key(t.autotune_inputs(qlft::parse_run_spec(c)));
    EXPECT_NE(keys[i].find(std::string("zero_stage=") + stages[i]), std::string::npos) << keys[i];
    EXPECT_NE(keys[i].find("ranks=1"), std::string::npos);
  }
  EXPECT_NE(keys[0], keys[1]);
  EXPECT_NE(keys[1], keys[2]);
  c.set("dist.zero_stage", "0");
  c.set("offload.optimizer", "nvme");
  c.set("offload.dir", out);
  {
    Trainer t(*model_, &tracker_, nullptr, qlft::parse_run_spec(c));
    EXPECT_NE(autotune_cache_key(t.autotune_inputs(qlft::parse_run_spec(c))), keys[0]);
  }

  // micro_batch=auto at stage 0 and stage 2 under the same limit: the same shape.
  Config a = base_config(out + "/s0");
  a.set("train.micro_batch", "auto");
  a.set("train.autotune_cache", "off");
  PlanSettings ps = PlanSettings::from_spec(qlft::parse_run_spec(a));
  ps.micro_batch = 3;
  tracker_.set_limit(plan_memory(model_->cfg, weight_footprint(*model_), ps).train_peak * 11 / 10);
  int micro[2];
  for (int i = 0; i < 2; ++i) {
    a.set("dist.zero_stage", i ? "2" : "0");
    Trainer t(*model_, &tracker_, data_.get(), qlft::parse_run_spec(a));
    micro[i] = t.settings().micro_batch;
    StepReport r;
    ASSERT_TRUE(t.step(&r));
  }
  EXPECT_EQ(micro[0], micro[1]);
  EXPECT_GE(micro[0], 2);
  tracker_.set_limit(0);
}
