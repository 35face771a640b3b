// Fault injection across a whole training step, and the non-finite diagnostic.
//
// Sweep: for every N, the N-th tracked allocation of one optimizer step fails (the step has two
// micro-batches and gradient checkpointing, so forward, recompute, backward, clipping and the
// optimizer all run; then a checkpoint is written). Each failure must surface as
// QLFT_ERR_OUT_OF_MEMORY, bring the tracker back to its pre-step totals in every category (no
// leaked Buffer), leave the trainer as before the step, and a retry with memory back must equal
// an undisturbed trainer's step bit for bit (loss and every LoRA weight). The sweep ends at the
// first N past the step's last allocation, which is how the allocations are counted.
//
// Only qlft::Buffer allocations go through the tracker (and so through fail_nth_acquire):
// std::vector/std::string scratch in readers, the data path and checkpoint metadata is not
// counted; the budget (memory.limit) covers Buffers only, so these are the ones that must fail
// cleanly.
//
// Non-finite: a huge LoRA weight in one layer makes that layer's output inf; with
// train.on_nonfinite=stop the error names that layer and tensor. An fp16 loss scale that
// overflows only in backward is named as a backward gradient of the last layer.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <memory>

#include "config/config.h"
#include "core/error.h"
#include "core/threads.h"
#include "data/dataset.h"
#include "data/tokenizer_encoder.h"
#include "model/model.h"
#include "support/test_support.h"
#include "tokenizer/tokenizer.h"
#include "train/trainer.h"
#include "test_trainer_util.h"

using namespace qlft;
using trainer_test::weights_of;

namespace {

struct Fixture {
  MemoryTracker tracker;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<data::TokenizerEncoder> enc;
  std::unique_ptr<data::Dataset> data;
  std::string dir;

  bool open() {
    std::string m = qlft_test::shared_file("models/stories260K.gguf");
    std::string text = qlft_test::shared_file("data/tinyshakespeare.txt");
    if (m.empty() || text.empty()) return false;
    LoadOptions lo;
    lo.quant_type = qlft::QuantType::Keep;
    model = load_model(&tracker, m, lo);
    tok = Tokenizer::from_gguf(*model->gguf);
    enc = std::make_unique<data::TokenizerEncoder>(*tok);
    // A small slice of the text keeps tokenization fast; the step needs only a few rows.
    dir = qlft_test::temp_dir("fault_sweep");
    std::vector<uint8_t> all = qlft_test::read_file(text);
    const std::string slice = dir + "/slice.txt";
    qlft_test::write_file(slice, all.data(), std::min<size_t>(all.size(), 6000));
    Config c;
    c.set("data.path", slice);
    c.set("data.seq_len", "32");
    c.set("data.eval_fraction", "0");
    data =
        std::make_unique<data::Dataset>(data::Dataset::build(qlft::parse_run_spec(c).data, *enc));
    return true;
  }
};

Config sweep_config() {
  Config c;
  c.set("lora.r", "4");
  c.set("lora.alpha", "8");
  c.set("optim.lr", "1e-2");
  c.set("optim.max_grad_norm", "1");
  c.set("train.max_steps", "3");
  c.set("train.micro_batch", "2");
  c.set("train.accumulation", "2");
  c.set("train.grad_checkpointing", "2");  // layers 0, 2, 4 recompute in backward
  c.set("seed", "11");
  return c;
}

void expect_same_totals(const MemorySnapshot& a, const MemorySnapshot& b, const std::string& at) {
  EXPECT_EQ(a.total_reserved, b.total_reserved) << at;
  for (int i = 0; i < kMemCategoryCount; ++i) {
    EXPECT_EQ(a.allocated[i], b.allocated[i])
        << at << ": " << mem_category_name(static_cast<MemCategory>(i));
    EXPECT_EQ(a.reserved[i], b.reserved[i])
        << at << ": " << mem_category_name(static_cast<MemCategory>(i));
  }
}

}  // namespace

class FaultSweep : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // One thread: a throw inside an OpenMP region terminates with any team size, and one thread
    // keeps the sweep fast on a loaded machine.
    set_num_threads(1);
    shared_ = new Fixture();
    if (!shared_->open()) {
      delete shared_;
      shared_ = nullptr;
    }
  }
  static void TearDownTestSuite() {
    delete shared_;
    shared_ = nullptr;
  }
  void SetUp() override {
    if (!shared_) {
      if (std::getenv("QLFT_REQUIRE_SHARED")) FAIL() << "stories260K.gguf / tinyshakespeare.txt";
      QLFT_SKIP("shared-missing")
          << "stories260K.gguf or tinyshakespeare.txt not found (set QLFT_SHARED_DIR)";
    }
  }
  void sweep(const Config& c, const char* label);
  static Fixture* shared_;
  Fixture& f() { return *shared_; }
};
Fixture* FaultSweep::shared_ = nullptr;

void FaultSweep::sweep(const Config& c, const char* label) {
  MemoryTracker& tr = f().tracker;
  // The undisturbed reference: one step, and its checkpoint.
  Trainer ref(*f().model, &tr, f().data.get(), qlft::parse_run_spec(c));
  const std::vector<float> w_init = weights_of(ref);
  StepReport want;
  ASSERT_TRUE(ref.step(&want));
  ASSERT_TRUE(std::isfinite(want.loss));
  const std::vector<float> w_want = weights_of(ref);
  ASSERT_NE(w_want, w_init) << "the step must change the weights for the comparison to mean much";
  const std::string ckpt = f().dir + "/" + label + ".ckpt";

  const uint64_t kMaxAllocs = 20000;
  // Under a sanitizer every step is ~20x slower: there every 7th index is failed (plus the end
  // of the sweep), which still reaches every kind of allocation of the step.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  const uint64_t stride = 7;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  const uint64_t stride = 7;
#else
  const uint64_t stride = 1;
#endif
#else
  const uint64_t stride = 1;
#endif
  uint64_t n = 1;
  for (; n <= kMaxAllocs; n += stride) {
    const std::string at = std::string(label) + ", allocation " + std::to_string(n);
    Trainer t(*f().model, &tr, f().data.get(), qlft::parse_run_spec(c));
    const MemorySnapshot before = tr.snapshot();
    tr.fail_nth_acquire(n);
    StepReport got;
    bool failed = false;
    try {
      t.step(&got);
      t.save_checkpoint(ckpt);
    } catch (const Error& e) {
      failed = true;
      EXPECT_EQ(e.status(), QLFT_ERR_OUT_OF_MEMORY) << at << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("[injected fault]"), std::string::npos) << at;
      if (std::getenv("QLFT_SWEEP_VERBOSE")) std::printf("%s: %s\n", at.c_str(), e.what());
    }
    tr.fail_nth_acquire(0);
    if (!failed) {
      // n is past the last allocation of step + checkpoint: this attempt ran clean.
      EXPECT_EQ(got.loss, want.loss) << at;
      EXPECT_EQ(weights_of(t), w_want) << at;
      break;
    }
    if (std::getenv("QLFT_SWEEP_VERBOSE"))
      std::printf("  after: total %+lld bytes\n",
                  static_cast<long long>(tr.snapshot().total_reserved - before.total_reserved));
    expect_same_totals(tr.snapshot(), before, at);
    EXPECT_EQ(t.steps_done(), 0) << at;
    EXPECT_EQ(weights_of(t), w_init) << at << ": a failed step must not touch the weights";
    // Memory is back: the same step completes and equals the undisturbed one.
    ASSERT_TRUE(t.step(&got)) << at;
    EXPECT_EQ(got.loss, want.loss) << at;
    ASSERT_EQ(weights_of(t), w_want) << at;
    if (::testing::Test::HasFailure()) break;  // one broken index is enough to read
  }
  ASSERT_LE(n, kMaxAllocs) << "the step never ran out of allocations to fail";
  // With a stride the last attempt only bounds the count: the step has n - 1 or fewer.
  const uint64_t allocations = n - 1;
  std::printf(
      "[ fault sweep ] %s: %llu tracked allocations in one step + checkpoint, failed in turn"
      " (every %llu-th index)\n",
      label, static_cast<unsigned long long>(allocations), static_cast<unsigned long long>(stride));
  EXPECT_GT(allocations, 50u) << "a step of a 5-layer model allocates far more than this";
}

TEST_F(FaultSweep, EveryAllocationOfAStepFailsCleanlyAdamW) {
  sweep(sweep_config(), "adamw");
}

TEST_F(FaultSweep, EveryAllocationOfAStepFailsCleanlyBf16AdamW8bit) {
  Config c = sweep_config();
  c.set("train.precision", "bf16");
  c.set("optim.name", "adamw8bit");
  sweep(c, "bf16-adamw8bit");
}

// ---- non-finite values -------------------------------------------------------------------------

TEST_F(FaultSweep, NonFiniteStopNamesTheLayerWhereItAppeared) {
  Config c = sweep_config();
  c.set("train.grad_checkpointing", "1");  // the diagnosis must still see every layer
  c.set("train.on_nonfinite", "stop");
  c.set("train.max_nonfinite", "2");
  Trainer t(*f().model, &f().tracker, f().data.get(), qlft::parse_run_spec(c));
  // Layer 2's down_proj LoRA: A and B huge, so x A^T B^T overflows float there and only there.
  LoraSlot& s = t.lora().slot(2, Proj::Down);
  ASSERT_TRUE(s.active());
  for (size_t i = 0; i < s.A.size() / 4; ++i) s.A.as<float>()[i] = 1e30f;
  for (size_t i = 0; i < s.B.size() / 4; ++i) s.B.as<float>()[i] = 1e30f;
  StepReport r;
  ASSERT_TRUE(t.step(&r));  // the first skip is tolerated (max_nonfinite 2)
  EXPECT_TRUE(r.skipped);
  try {
    t.step(&r);
    FAIL() << "expected a numerical error on the second non-finite step";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_NUMERICAL);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("layer 2 mlp down_proj output"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(forward)"), std::string::npos) << msg;
  }
  EXPECT_EQ(f().tracker.snapshot().allocated[static_cast<int>(MemCategory::Activations)], 0u)
      << "the diagnosis must free what it allocated";
}

TEST_F(FaultSweep, NonFiniteOnlyInBackwardIsNamedAsAGradient) {
  Config c = sweep_config();
  c.set("train.precision", "fp16");
  c.set("scaler.init_scale", "1e30");  // the scaled loss gradient overflows fp16 in backward
  c.set("train.on_nonfinite", "stop");
  c.set("train.max_nonfinite", "1");
  Trainer t(*f().model, &f().tracker, f().data.get(), qlft::parse_run_spec(c));
  StepReport r;
  try {
    t.step(&r);
    FAIL() << "expected a numerical error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_NUMERICAL);
    const std::string msg = e.what();
    // The loss itself is finite; the first inf is a gradient, and backward starts at layer 4.
    EXPECT_EQ(msg.find("(forward)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(backward)"), std::string::npos) << msg;
    EXPECT_TRUE(msg.find("loss gradient at the output head") != std::string::npos ||
                msg.find("layer 4 mlp down_proj lora_") != std::string::npos)
        << msg;
  }
}

TEST_F(FaultSweep, SkipPolicyNeverStops) {
  Config c = sweep_config();
  c.set("train.on_nonfinite", "skip");
  c.set("train.max_nonfinite", "1");
  Trainer t(*f().model, &f().tracker, f().data.get(), qlft::parse_run_spec(c));
  LoraSlot& s = t.lora().slot(0, Proj::Q);
  for (size_t i = 0; i < s.A.size() / 4; ++i) s.A.as<float>()[i] = NAN;
  StepReport r;
  int steps = 0;
  while (t.step(&r)) {
    EXPECT_TRUE(r.skipped);
    ++steps;
  }
  EXPECT_EQ(steps, 3);
  EXPECT_EQ(t.nonfinite_in_row(), 3);
}
