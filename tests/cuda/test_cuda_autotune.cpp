// Issue 18, done-when 6: device-memory planning and train.micro_batch=auto on backend=cuda.
//
// memory.limit is the device's budget there (the runtime sets the tracker's limit on device
// bytes; the host's weights and adapter copy are outside it). stories260K (NF4, r=8, AdamW on the
// device) at seq 64:
//  - PlannerPredictsTheDevicePeak: the planner's device training peak (MemoryPlan::
//    device_train_peak, from the CUDA workspace model and the caching allocator's rounding) is
//    within 10% of the tracker's measured device live peak of a real step, at three
//    micro-batches.
//  - ThreeDeviceBudgets: under three budgets placed between the planner's predictions for m and
//    m + 1, the search ends on a size that trains while the next size up runs out of device
//    memory (each proven again here by a trial step under the budget, and the failure shown to be
//    the device allocator's out-of-memory), the three sizes differ, and a training step runs
//    under the budget.
//  - DISABLED_SmolLM2PlannerPredictsTheDevicePeak: the first check on SmolLM2-135M (minutes a
//    step in the emulator; by hand or on a GPU).
//  - DISABLED_SmolLM2ShapedOnDevice: the same on a SmolLM2-135M-shaped model with random weights
//    ($QLFT_SMOL_DIR, bench/make_shaped_model.py; the GPU check's way, since the GGUF cannot
//    travel to the device machine) at seq 512, fp32 and bf16, and with offload.params=cpu +
//    offload.optimizer=cpu: the device peak within 10% of the planner's, no device optimizer
//    state, and each step's host->device bytes equal to the planner's prediction.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda_plugin.h"
#include "config/config.h"
#include "core/error.h"
#include "core/threads.h"
#include "cuda_test_util.h"
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

constexpr int kSeq = 64;

Config base_config(const std::string& out) {
  Config c;
  c.set("backend", "cuda");
  c.set("data.seq_len", std::to_string(kSeq));
  c.set("lora.r", "8");
  c.set("optim.name", "adamw");
  c.set("optim.lr", "1e-3");
  c.set("train.max_steps", "2");
  c.set("train.output_dir", out);
  c.set("threads", "1");
  c.set("seed", "5");
  return c;
}

std::string read_all(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

double rel(uint64_t a, uint64_t b) {
  return (double(a) - double(b)) / double(b);
}

class CudaAutotuneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    QLFT_NEED_GPU();
    text_ = qlft_test::shared_file("data/tinyshakespeare.txt");
    if (text_.empty()) QLFT_SKIP("shared-missing") << "tinyshakespeare.txt";
    set_num_threads(1);
    // As qlft_runtime_create does for backend=cuda: memory.limit budgets device bytes.
    tracker_.set_limit_space(MemSpace::Device);
  }
  void TearDown() override { tracker_.set_limit(0); }

  // Loads models/<name> (NF4, its GGUF tokenizer) and the Shakespeare text at seq; false
  // (skipped) when absent.
  bool load(const char* name, int seq) {
    const std::string m = qlft_test::shared_file(std::string("models/") + name);
    if (m.empty()) return false;
    load_from(m, "", seq);
    return true;
  }
  // An HF model directory (tokenizer.json beside it), NF4, at seq.
  void load_dir(const std::string& dir, int seq) { load_from(dir, dir + "/tokenizer.json", seq); }

  // The model at path (NF4), the tokenizer from tokenizer_json or else the model's GGUF, and the
  // Shakespeare text at seq.
  void load_from(const std::string& path, const std::string& tokenizer_json, int seq) {
    LoadOptions lo;
    lo.quant_type = qlft::QuantType::NF4;
    model_ = load_model(&tracker_, path, lo);
    tok_ = tokenizer_json.empty() ? Tokenizer::from_gguf(*model_->gguf)
                                  : Tokenizer::from_hf_json_file(tokenizer_json);
    enc_ = std::make_unique<data::TokenizerEncoder>(*tok_);
    Config c = base_config("");
    c.set("data.path", text_);
    c.set("data.seq_len", std::to_string(seq));
    data_ =
        std::make_unique<data::Dataset>(data::Dataset::build(qlft::parse_run_spec(c).data, *enc_));
  }

  MemoryPlan plan(const Config& c, int micro_batch) const {
    PlanSettings ps = PlanSettings::from_spec(qlft::parse_run_spec(c));
    ps.micro_batch = micro_batch;
    return plan_memory(model_->cfg, weight_footprint(*model_), ps);
  }

  // One training step at micro-batch m: the planner's device peak against the tracker's device
  // live peak (within 10%), the persistent device categories against the tracker's. streamed:
  // offload.params=cpu (the weights' device peak is the stream's pair of units; a second step's
  // host->device bytes are the planner's).
  void check_device_plan(Config c, int m, bool streamed = false) {
    SCOPED_TRACE("micro-batch " + std::to_string(m));
    c.set("train.micro_batch", std::to_string(m));
    const MemoryPlan p = plan(c, m);
    ASSERT_TRUE(p.device);
    // A fresh process's allocator: blocks cached by an earlier case (another precision or
    // micro-batch) would be handed out for requests down to half their size and counted whole.
    cuda_plugin::get("test").empty_cache(&tracker_);
    Trainer t(*model_, &tracker_, data_.get(), qlft::parse_run_spec(c));
    tracker_.reset_peaks();
    StepReport r;
    ASSERT_TRUE(t.step(&r));
    if (streamed) {
      StepReport r2;
      ASSERT_TRUE(t.step(&r2));
      std::printf("micro-batch %d: host->device %llu B a step, planned %llu B\n", m,
                  static_cast<unsigned long long>(r2.moved.host_to_device),
                  static_cast<unsigned long long>(p.device_h2d_per_step));
      EXPECT_EQ(r2.moved.host_to_device, p.device_h2d_per_step);
      // Device -> host: the host step's gradients, plus the scalars (loss, norm).
      EXPECT_GE(r2.moved.device_to_host, p.device_d2h_per_step);
      EXPECT_LE(r2.moved.device_to_host, p.device_d2h_per_step + 64);
    }
    const MemorySnapshot s = tracker_.snapshot();
    std::printf(
        "micro-batch %d: device planned %s, tracker live peak %s (%+.1f%%), with the "
        "allocator's cache %s; host planned %s, host now %s\n",
        m, format_bytes(p.device_train_peak).c_str(), format_bytes(s.device_live_peak).c_str(),
        100 * rel(p.device_train_peak, s.device_live_peak),
        format_bytes(s.device_total_peak).c_str(),
        format_bytes(p.train_peak - p.device_train_peak).c_str(),
        format_bytes(s.total_reserved - s.device_total).c_str());
    for (int i = 0; i < kMemCategoryCount; ++i)
      std::printf("  %-13s planned %12llu  tracker peak %12llu\n",
                  mem_category_name(static_cast<MemCategory>(i)),
                  static_cast<unsigned long long>(p.device_train[i]),
                  static_cast<unsigned long long>(s.device_peak[i]));
    EXPECT_LE(std::fabs(rel(p.device_train_peak, s.device_live_peak)), 0.10);
    // The adapter's device copy, its gradients and the device AdamW state are made before any
    // block is freed: exact. The weights are uploaded during the step, and the allocator may
    // hand a weight a cached block of up to twice its size (seen: +2.5 KiB of 400 KiB).
    for (MemCategory k : {MemCategory::Adapter, MemCategory::Gradients, MemCategory::Optimizer})
      EXPECT_EQ(p.device_train[int(k)], s.device_reserved[int(k)]) << mem_category_name(k);
    const int wi = int(MemCategory::Weights);
    EXPECT_LE(
        std::fabs(rel(p.device_train[wi], streamed ? s.device_peak[wi] : s.device_reserved[wi])),
        0.02);
  }

  MemoryTracker tracker_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<data::TokenizerEncoder> enc_;
  std::unique_ptr<data::Dataset> data_;
  std::string text_;
};

}  // namespace

TEST_F(CudaAutotuneTest, PlannerPredictsTheDevicePeak) {
  if (!load("stories260K.gguf", kSeq)) QLFT_SKIP("shared-missing") << "stories260K.gguf";
  const std::string out = qlft_test::temp_dir("cuda-plan");
  for (int m : {1, 4, 8}) check_device_plan(base_config(out), m);
  Config bf16 = base_config(out);
  bf16.set("train.precision", "bf16");
  for (int m : {1, 4}) check_device_plan(bf16, m);
}

// 8-bit AdamW and paged 8-bit AdamW step on the device (train/device_adamw8bit.cpp): the
// planner puts their state in device memory (per-tensor device blocks; paged: managed
// allocations at their exact size) and none on the host. Rank 64: tensors on both state paths.
TEST_F(CudaAutotuneTest, PlannerPredictsTheDevice8bitState) {
  if (!load("stories260K.gguf", kSeq)) QLFT_SKIP("shared-missing") << "stories260K.gguf";
  const std::string out = qlft_test::temp_dir("cuda-plan-8bit");
  for (const char* optim : {"adamw8bit", "paged_adamw8bit"}) {
    SCOPED_TRACE(optim);
    Config c = base_config(out);
    c.set("optim.name", optim);
    c.set("lora.r", "64");
    const MemoryPlan p = plan(c, 1);
    // All of it on the device (train[] is host + device), nothing on the host.
    EXPECT_GT(p.device_train[int(MemCategory::Optimizer)], 0u);
    EXPECT_EQ(p.train[int(MemCategory::Optimizer)], p.device_train[int(MemCategory::Optimizer)]);
    check_device_plan(c, 1);
  }
}

// The same on SmolLM2-135M (q4_1 GGUF quantized to NF4) at micro-batch 1 and 2 x seq 128, where
// the 64 MiB weight panels, the cross-entropy logits chunk over a 49,152-token vocabulary and the
// allocator's 2 MiB rounding matter. Minutes a step in the emulator: run by hand
// (--gtest_also_run_disabled_tests), or on a GPU.
TEST_F(CudaAutotuneTest, DISABLED_SmolLM2PlannerPredictsTheDevicePeak) {
  if (!load("smollm2-135m-instruct-q4_1.gguf", 128))
    QLFT_SKIP("shared-missing") << "smollm2-135m-instruct-q4_1.gguf";
  const std::string out = qlft_test::temp_dir("cuda-plan-smollm2");
  Config c = base_config(out);
  c.set("data.seq_len", "128");
  for (int m : {1, 2}) check_device_plan(c, m);
}

TEST_F(CudaAutotuneTest, DISABLED_SmolLM2ShapedOnDevice) {
  const char* dir = std::getenv("QLFT_SMOL_DIR");
  if (!dir || !*dir) QLFT_SKIP("shared-missing") << "QLFT_SMOL_DIR (bench/make_shaped_model.py)";
  load_dir(dir, 512);
  const std::string out = qlft_test::temp_dir("cuda-plan-smol");
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    Config c = base_config(out);
    c.set("data.seq_len", "512");
    c.set("train.precision", precision);
    for (int m : {1, 4}) check_device_plan(c, m);
    Config o = c;
    o.set("offload.params", "cpu");
    o.set("offload.optimizer", "cpu");
    check_device_plan(o, 4, /*streamed=*/true);
  }
}

// Issue 18 done-when 2 and 5 on SmolLM2-135M shapes ($QLFT_SMOL_DIR), micro-batch 1 x 128 with
// accumulation 2 and gradient checkpointing: backend=cuda's loss curve follows backend=cpu's
// (fp32, within 1e-4 relative per step) with AdamW (the device step) and paged 8-bit AdamW (the
// host step), and offload.params=cpu + offload.optimizer=cpu gives the same curve. Too slow for
// the emulator (minutes a step): run on a GPU by scripts/gpu_check.sh memory.
TEST_F(CudaAutotuneTest, DISABLED_SmolLM2ShapedCurvesFollowCpu) {
  const char* dir = std::getenv("QLFT_SMOL_DIR");
  if (!dir || !*dir) QLFT_SKIP("shared-missing") << "QLFT_SMOL_DIR (bench/make_shaped_model.py)";
  load_dir(dir, 128);
  const std::string out = qlft_test::temp_dir("cuda-curves-smol");
  auto curve = [&](const Config& c) {
    Trainer t(*model_, &tracker_, data_.get(), qlft::parse_run_spec(c));
    std::vector<double> loss;
    StepReport r;
    while (t.step(&r)) loss.push_back(r.loss);
    return loss;
  };
  for (const char* optim : {"adamw", "paged_adamw8bit"}) {
    SCOPED_TRACE(optim);
    Config c = base_config(out);
    c.set("data.seq_len", "128");
    c.set("train.micro_batch", "1");
    c.set("train.accumulation", "2");
    c.set("train.grad_checkpointing", "2");
    c.set("train.max_steps", "3");
    c.set("optim.name", optim);
    Config cpu = c;
    cpu.set("backend", "cpu");
    cpu.set("threads", "8");
    Config off = c;
    off.set("offload.params", "cpu");
    off.set("offload.optimizer", "cpu");
    const std::vector<double> g = curve(c), h = curve(cpu), o = curve(off);
    ASSERT_EQ(g.size(), 3u);
    ASSERT_EQ(h.size(), g.size());
    ASSERT_EQ(o.size(), g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      std::printf("%s step %zu: cuda %.9g cpu %.9g (%.2e) offload %.9g (%.2e)\n", optim, i + 1,
                  g[i], h[i], std::fabs(g[i] - h[i]) / std::fabs(h[i]), o[i],
                  std::fabs(o[i] - g[i]) / std::fabs(g[i]));
      EXPECT_LE(std::fabs(g[i] - h[i]), 1e-4 * std::fabs(h[i])) << "step " << i + 1;
      EXPECT_LE(std::fabs(o[i] - g[i]), 1e-4 * std::fabs(g[i])) << "step " << i + 1;
    }
  }
}

// stories260K with offload.params=cpu + offload.optimizer=cpu: the planner's device peak, the
// stream's weight peak and a step's host->device bytes (the emulator's check of the above).
TEST_F(CudaAutotuneTest, OffloadPlannerPredictsTheDevicePeakAndBytes) {
  if (!load("stories260K.gguf", kSeq)) QLFT_SKIP("shared-missing") << "stories260K.gguf";
  Config c = base_config(qlft_test::temp_dir("cuda-plan-offload"));
  c.set("offload.params", "cpu");
  c.set("offload.optimizer", "cpu");
  check_device_plan(c, 4, /*streamed=*/true);
}

// offload.params=cpu streams each trainer's own copy of the weights through its own device
// memory (train/weight_placement.h): two such trainers on one model step side by side to the
// same loss, and the model is never converted (no stream, its host weights in place).
TEST_F(CudaAutotuneTest, OffloadedTrainersShareTheModel) {
  if (!load("stories260K.gguf", kSeq)) QLFT_SKIP("shared-missing") << "stories260K.gguf";
  Config c = base_config(qlft_test::temp_dir("cuda-offload-two"));
  c.set("offload.params", "cpu");
  const void* embd = model_->tok_embd.data.data();
  // The weights stay in host memory once: the trainers' streams read the model's bytes in place
  // (no copy of them); only their device units come on top, in device memory. The tracker
  // counts each host block in whole 64-byte lines.
  uint64_t model_bytes = 0;
  for_each_weight_buffer(static_cast<const Model&>(*model_),
                         [&](int, const Buffer& b) { model_bytes += (b.size() + 63) / 64 * 64; });
  auto host_weights = [&] {
    const MemorySnapshot m = tracker_.snapshot();
    return m.reserved[QLFT_MEM_WEIGHTS] - m.device_reserved[QLFT_MEM_WEIGHTS];
  };
  ASSERT_GT(model_bytes, 0u);
  EXPECT_EQ(host_weights(), model_bytes);
  {
    Trainer first(*model_, &tracker_, data_.get(), qlft::parse_run_spec(c));
    Trainer second(*model_, &tracker_, data_.get(), qlft::parse_run_spec(c));
    EXPECT_TRUE(model_->stream == nullptr);
    EXPECT_TRUE(first.placement().model().stream != nullptr);
    EXPECT_TRUE(second.placement().model().stream != nullptr);
    EXPECT_EQ(host_weights(), model_bytes);
    StepReport a, b;
    EXPECT_TRUE(first.step(&a));
    EXPECT_TRUE(second.step(&b));
    EXPECT_EQ(a.loss, b.loss);
    EXPECT_EQ(host_weights(), model_bytes);
  }
  EXPECT_TRUE(model_->stream == nullptr);
  EXPECT_EQ(model_->tok_embd.data.data(), embd);
  EXPECT_FALSE(model_->tok_embd.data.on_device());
  Trainer next(*model_, &tracker_, data_.get(), qlft::parse_run_spec(c));
  StepReport r;
  EXPECT_TRUE(next.step(&r));
}

TEST_F(CudaAutotuneTest, ThreeDeviceBudgets) {
  if (!load("stories260K.gguf", kSeq)) QLFT_SKIP("shared-missing") << "stories260K.gguf";
  const std::string dir = qlft_test::temp_dir("cuda-autotune");
  std::set<int> found;
  int n = 0;
  for (int target : {1, 3, 6}) {
    SCOPED_TRACE("budget for micro-batch " + std::to_string(target));
    const std::string out = dir + "/run" + std::to_string(n++);
    Config c = base_config(out);
    c.set("train.micro_batch", "auto");
    c.set("train.autotune_margin", "0");
    // Halfway between the planner's device peaks for target and target + 1.
    const uint64_t lo = plan(c, target).device_train_peak,
                   hi = plan(c, target + 1).device_train_peak;
    ASSERT_LT(lo, hi);
    const uint64_t limit = lo + (hi - lo) / 2;
    tracker_.set_limit(limit);
    Trainer a(*model_, &tracker_, data_.get(), qlft::parse_run_spec(c));
    const int micro = a.settings().micro_batch;

    // The search's record, from its cache file.
    const nlohmann::json j = nlohmann::json::parse(read_all(out + "/autotune.json"));
    ASSERT_EQ(j["entries"].size(), 1u);
    const nlohmann::json e = j["entries"].begin().value();
    const int max_fit = e["max_fit"], first_fail = e["first_fail"];
    EXPECT_EQ(micro, max_fit);
    EXPECT_EQ(first_fail, max_fit + 1);
    EXPECT_LE(e["trials"].get<int>(), 6);
    found.insert(micro);

    // Both ends again by trial steps under the budget: the largest fit trains, one more does not.
    uint64_t peak = 0;
    EXPECT_TRUE(a.try_micro_batch(max_fit, kSeq, false, &peak));
    EXPECT_LE(peak, limit);
    EXPECT_FALSE(a.try_micro_batch(max_fit + 1, kSeq, false, nullptr));
    // The planner's device prediction at the size found, against the trial's measured peak.
    const uint64_t planned = plan(c, max_fit).device_train_peak;
    EXPECT_LE(std::fabs(rel(planned, peak)), 0.10);

    // That failure is the device allocator's out-of-memory (the budget counts device bytes).
    {
      const int m = max_fit + 1;
      std::vector<int32_t> tok(size_t(m) * kSeq), pos(tok.size()), docs(tok.size(), 0);
      for (size_t i = 0; i < tok.size(); ++i) {
        tok[i] = int32_t((i * 7 + 1) % model_->cfg.vocab);
        pos[i] = int32_t(i % kSeq);
      }
      TokenBatch b;
      b.batch = m;
      b.seq = kSeq;
      b.tokens = tok.data();
      b.targets = tok.data();
      b.positions = pos.data();
      b.doc_ids = docs.data();
      std::string msg;
      try {
        a.runner().forward(b, 1.f / float(tok.size()), 1);
        a.runner().backward();
      } catch (const Error& err) {
        EXPECT_EQ(err.status(), QLFT_ERR_OUT_OF_MEMORY);
        msg = err.what();
      }
      a.runner().release();
      a.lora().zero_grad();
      EXPECT_NE(msg.find("device memory"), std::string::npos) << msg;
    }

    // And training runs under the budget at the size found, from an empty allocator cache as
    // after a search (the failed tries above left blocks of the larger size cached).
    cuda_plugin::get("test").empty_cache(&tracker_);
    StepReport r;
    ASSERT_TRUE(a.step(&r));
    EXPECT_LE(tracker_.snapshot().device_total, limit);
    std::printf(
        "budget %s: micro_batch %d (largest fit %d, first failure %d, %d trials; trial "
        "peak %s, planned %s, %+.1f%%)\n",
        format_bytes(limit).c_str(), micro, max_fit, first_fail, e["trials"].get<int>(),
        format_bytes(peak).c_str(), format_bytes(planned).c_str(), 100 * rel(planned, peak));
    tracker_.set_limit(0);
  }
  EXPECT_EQ(found.size(), 3u) << "each budget gives its own micro-batch";
}
