// The trainer: accumulation and gradient checkpointing leave gradients unchanged (a second code
// path computes the same quantity), checkpointing lowers peak activation memory, checkpoints
// resume bit-exactly, a failed step leaves the trainer usable, and training lowers the loss.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>

#include "config/config.h"
#include "core/error.h"
#include "core/profile.h"
#include "core/threads.h"
#include "data/dataset.h"
#include "data/tokenizer_encoder.h"
#include "model/model.h"
#include "support/test_support.h"
#include "tokenizer/tokenizer.h"
#include "train/trainer.h"
#include "test_trainer_util.h"

using namespace qlft;
using trainer_test::grads_of;
using trainer_test::weights_of;

namespace {

struct Fixture {
  MemoryTracker tracker;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<data::TokenizerEncoder> enc;
  std::unique_ptr<data::Dataset> data;

  bool open(const std::string& text_path, int seq_len = 64) {
    std::string m = qlft_test::shared_file("models/stories260K.gguf");
    if (m.empty() || text_path.empty()) return false;
    LoadOptions lo;
    lo.quant_type = qlft::QuantType::Keep;
    model = load_model(&tracker, m, lo);
    tok = Tokenizer::from_gguf(*model->gguf);
    enc = std::make_unique<data::TokenizerEncoder>(*tok);
    Config c;
    c.set("data.path", text_path);
    c.set("data.seq_len", std::to_string(seq_len));
    c.set("data.eval_fraction", "0.02");
    data =
        std::make_unique<data::Dataset>(data::Dataset::build(qlft::parse_run_spec(c).data, *enc));
    return true;
  }
};

Config base_config() {
  Config c;
  c.set("lora.r", "4");
  c.set("lora.alpha", "8");
  c.set("optim.max_grad_norm", "0");  // raw gradients stay comparable
  c.set("optim.lr", "1e-3");
  c.set("train.max_steps", "3");
  c.set("seed", "7");
  return c;
}

}  // namespace

// The model and the tokenized dataset are built once for the whole suite.
class TrainerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    set_num_threads(1);
    std::string text = qlft_test::shared_file("data/tinyshakespeare.txt");
    shared_ = new Fixture();
    if (text.empty() || !shared_->open(text)) {
      delete shared_;
      shared_ = nullptr;
    }
  }
  static void TearDownTestSuite() {
    delete shared_;
    shared_ = nullptr;
  }
  void SetUp() override {
    if (!shared_)
      QLFT_SKIP("shared-missing")
          << "stories260K.gguf or tinyshakespeare.txt not found (set QLFT_SHARED_DIR)";
  }
  static Fixture* shared_;
  static Fixture& none() {
    static Fixture empty;
    return empty;
  }
  Fixture& f = shared_ ? *shared_ : none();
};
Fixture* TrainerTest::shared_ = nullptr;

TEST_F(TrainerTest, AccumulationChangesNoGradient) {
  // One step over the same 8 rows as 8x1, 4x2, 2x4 and 1x8 micro-batches.
  std::vector<std::vector<float>> g;
  for (int mb : {8, 4, 2, 1}) {
    Config c = base_config();
    c.set("train.micro_batch", std::to_string(mb));
    c.set("train.accumulation", std::to_string(8 / mb));
    c.set("lora.init_from", "");
    Trainer t(*f.model, &f.tracker, f.data.get(), qlft::parse_run_spec(c));
    // B starts at zero, which makes dA zero: take one step first so both are exercised, with
    // the same first step for every configuration (8 rows), then compare the second step.
    StepReport r;
    ASSERT_TRUE(t.step(&r));
    ASSERT_TRUE(t.step(&r));
    EXPECT_GT(r.trained_tokens, 0);
    g.push_back(grads_of(t));
  }
  for (size_t i = 1; i < g.size(); ++i) {
    ASSERT_EQ(g[i].size(), g[0].size());
    double err = qlft_test::max_rel_error(g[i].data(), g[0].data(), g[0].size());
    EXPECT_LT(err, 1e-5) << "configuration " << i;  // float reassociation only
  }
}

TEST_F(TrainerTest, CheckpointingChangesNoGradientAndLowersPeakActivations) {
  std::vector<float> g[2];
  uint64_t peak[2];
  for (int ck = 0; ck < 2; ++ck) {
    Config c = base_config();
    c.set("train.micro_batch", "4");
    c.set("train.grad_checkpointing", ck ? "1" : "0");
    Trainer t(*f.model, &f.tracker, f.data.get(), qlft::parse_run_spec(c));
    StepReport r;
    ASSERT_TRUE(t.step(&r));
    f.tracker.reset_peaks();
    ASSERT_TRUE(t.step(&r));
    g[ck] = grads_of(t);
    peak[ck] = f.tracker.snapshot().peak[QLFT_MEM_ACTIVATIONS];
  }
  EXPECT_LT(qlft_test::max_rel_error(g[1].data(), g[0].data(), g[0].size()), 1e-6);
  EXPECT_LT(peak[1], peak[0]) << "checkpointing every layer should store fewer activations";
}

TEST_F(TrainerTest, ResumeFromCheckpointIsBitExact) {
  Config c = base_config();
  c.set("train.max_steps", "6");
  c.set("lora.dropout", "0.1");  // dropout masks must replay too
  c.set("optim.name", "adamw8bit");
  Trainer straight(*f.model, &f.tracker, f.data.get(), qlft::parse_run_spec(c));
  StepReport r;
  while (straight.step(&r)) {
  }
  std::string dir = qlft_test::temp_dir("resume");
  std::string ckpt = dir + "/ck.safetensors";
  {
    Trainer first(*f.model, &f.tracker, f.data.get(), qlft::parse_run_spec(c));
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(first.step(&r));
    first.save_checkpoint(ckpt);
  }
  Trainer second(*f.model, &f.tracker, f.data.get(), qlft::parse_run_spec(c));
  second.resume(ckpt);
  EXPECT_EQ(second.steps_done(), 3);
  while (second.step(&r)) {
  }
  EXPECT_EQ(second.steps_done(), 6);
  std::vector<float> a = weights_of(straight), b = weights_of(second);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "resumed run diverged";
}

TEST_F(TrainerTest, ResumeRejectsMismatchAndCorruptionWithoutChangingState) {
  Config c = base_config();
  Trainer t(*f.model, &f.tracker, f.data.get(), qlft::parse_run_spec(c));
  StepReport r;
  ASSERT_TRUE(t.step(&r));
  std::string dir = qlft_test::temp_dir("resume-bad");
  t.save_checkpoint(dir + "/ck.safetensors");
  Config other = c;
  other.set("lora.r", "2");
  Trainer u(*f.model, &f.tracker, f.data.get(), qlft::parse_run_spec(other));
  std::vector<float> before = weights_of(u);
  try {
    u.resume(dir + "/ck.safetensors");
    FAIL() << "expected a settings mismatch";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("lora.r"), std::string::npos) << e.what();
  }
  EXPECT_EQ(weights_of(u), before);
  // A truncated checkpoint is a format error naming the file.
  std::vector<uint8_t> bytes = qlft_test::read_file(dir + "/ck.safetensors");
  qlft_test::write_file(dir + "/cut.safetensors", bytes.data(), bytes.size() / 2);
  try {
    t.resume(dir + "/cut.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_FORMAT);
    EXPECT_NE(std::string(e.what()).find("cut.safetensors"), std::string::npos);
  }
  EXPECT_EQ(t.steps_done(), 1);
}

TEST_F(TrainerTest, OutOfMemoryStepLeavesTrainerUsable) {
  Config c = base_config();
  c.set("train.max_steps", "2");
  Trainer t(*f.model, &f.tracker, f.data.get(), qlft::parse_run_spec(c));
  Trainer ref(*f.model, &f.tracker, f.data.get(), qlft::parse_run_spec(c));
  StepReport r;
  ASSERT_TRUE(ref.step(&r));
  // Fail the 5th allocation of the step, then retry with memory back.
  f.tracker.fail_nth_acquire(5);
  try {
    t.step(&r);
    FAIL() << "expected out of memory";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_OUT_OF_MEMORY);
  }
  f.tracker.fail_nth_acquire(0);
  EXPECT_EQ(t.steps_done(), 0);
  ASSERT_TRUE(t.step(&r));
  EXPECT_EQ(weights_of(t), weights_of(ref)) << "the retried step must equal an undisturbed one";
}

TEST_F(TrainerTest, TrainingLowersHeldOutLoss) {
  Config c = base_config();
  c.set("train.max_steps", "40");
  c.set("train.micro_batch", "4");
  c.set("optim.lr", "3e-3");
  c.set("optim.max_grad_norm", "1");
  c.set("lora.r", "8");
  c.set("lora.alpha", "16");
  Trainer t(*f.model, &f.tracker, f.data.get(), qlft::parse_run_spec(c));
  double before = t.evaluate(*f.data).loss;
  StepReport r;
  while (t.step(&r)) {
  }
  double after = t.evaluate(*f.data).loss;
  EXPECT_TRUE(std::isfinite(before));
  EXPECT_LT(after, before * 0.9) << "before " << before << " after " << after;
}

TEST_F(TrainerTest, Fp16HugeScaleOverflowsSkipsBacksOffThenTrains) {
  Config c = base_config();
  c.set("train.precision", "fp16");
  c.set("train.max_steps", "40");
  c.set("scaler.init_scale", "1e12");  // dy * scale overflows fp16 -> inf -> skip + back off
  Trainer t(*f.model, &f.tracker, f.data.get(), qlft::parse_run_spec(c));
  StepReport r;
  int skipped = 0, taken = 0;
  float last_scale = 2e30f;
  std::vector<float> w_before = weights_of(t);
  while (t.step(&r)) {
    for (float w : weights_of(t)) ASSERT_TRUE(std::isfinite(w)) << "step " << r.step;
    if (r.skipped) {
      ++skipped;
      EXPECT_LT(r.loss_scale, last_scale);
      EXPECT_EQ(taken, 0) << "a skip after training started means the scale never settled";
      EXPECT_EQ(weights_of(t), w_before) << "a skipped step must not change the weights";
    } else {
      ++taken;
    }
    last_scale = r.loss_scale;
  }
  EXPECT_GT(skipped, 0);
  EXPECT_GT(taken, 5) << "skipped " << skipped << ", final scale " << last_scale;
  EXPECT_NE(weights_of(t), w_before);
}

TEST_F(TrainerTest, Fp16TinyScaleGrowsBackAndWeightsStayFinite) {
  Config c = base_config();
  c.set("train.precision", "fp16");
  c.set("train.max_steps", "12");
  c.set("scaler.init_scale", "1e-6");
  c.set("scaler.growth_interval", "1");
  Trainer t(*f.model, &f.tracker, f.data.get(), qlft::parse_run_spec(c));
  StepReport r;
  std::vector<float> scales;
  while (t.step(&r)) {
    scales.push_back(r.loss_scale);
    for (float w : weights_of(t)) ASSERT_TRUE(std::isfinite(w));
  }
  ASSERT_EQ(scales.size(), 12u);
  for (size_t i = 1; i < scales.size(); ++i) EXPECT_FLOAT_EQ(scales[i], 2 * scales[i - 1]);
}

TEST_F(TrainerTest, Bf16TracksFp32) {
  std::vector<double> loss[2];
  for (int p = 0; p < 2; ++p) {
    Config c = base_config();
    c.set("train.max_steps", "5");
    c.set("train.precision", p ? "bf16" : "fp32");
    Trainer t(*f.model, &f.tracker, f.data.get(), qlft::parse_run_spec(c));
    StepReport r;
    while (t.step(&r)) loss[p].push_back(r.loss);
  }
  ASSERT_EQ(loss[0].size(), loss[1].size());
  bool any_diff = false;
  for (size_t i = 0; i < loss[0].size(); ++i) {
    EXPECT_NEAR(loss[1][i], loss[0][i], 0.02 * loss[0][i]) << "step " << i;
    any_diff |= loss[1][i] != loss[0][i];
  }
  EXPECT_TRUE(any_diff) << "bf16 autocast should change the arithmetic";
}

TEST_F(TrainerTest, ProfileCountsEveryOpOfTheStepsAfterTheFirst) {
  // QLFT_PROFILE: the file the trainer writes when it goes. The counts come from the model's
  // shape: each micro-batch runs one forward and one backward linear per projection and layer.
  const std::string path = qlft_test::temp_dir("profile") + "/profile.tsv";
  ASSERT_EQ(setenv("QLFT_PROFILE", path.c_str(), 1), 0);
  const int steps = 3, micro = 2;
  {
    Config c = base_config();
    c.set("train.micro_batch", "2");
    c.set("train.accumulation", std::to_string(micro));
    c.set("train.max_steps", std::to_string(steps));
    Trainer t(*f.model, &f.tracker, f.data.get(), qlft::parse_run_spec(c));
    StepReport r;
    while (t.step(&r)) {
    }
  }
  unsetenv("QLFT_PROFILE");
  prof::set_enabled(false);
  const std::vector<uint8_t> bytes = qlft_test::read_file(path);
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  std::string line;
  std::getline(in, line);
  EXPECT_NE(line.find("(2 steps)"), std::string::npos) << line;
  std::getline(in, line);                           // the header
  std::map<std::string, std::vector<double>> rows;  // path: calls, total, self, pct
  while (std::getline(in, line) && !line.empty()) {
    std::istringstream ls(line);
    std::string p, x;
    std::getline(ls, p, '\t');
    while (std::getline(ls, x, '\t')) rows[p].push_back(std::stod(x));
  }
  const int64_t passes = int64_t(steps - 1) * micro;
  const int64_t linears = passes * kProjCount * f.model->cfg.n_layers;
  ASSERT_EQ(rows.count("step"), 1u);
  EXPECT_EQ(rows["step"][0], steps - 1);
  EXPECT_EQ(rows["step/forward"][0], passes);
  EXPECT_EQ(rows["step/backward"][0], passes);
  EXPECT_EQ(rows["step/optimizer"][0], steps - 1);
  EXPECT_EQ(rows["step/forward/linear_fwd"][0], linears);
  EXPECT_EQ(rows["step/backward/linear_bwd"][0], linears);
  EXPECT_EQ(rows["step/forward/attention_fwd"][0], passes * f.model->cfg.n_layers);
  EXPECT_EQ(rows["step/backward/attention_bwd"][0], passes * f.model->cfg.n_layers);
  EXPECT_EQ(rows["step/forward/linear_cross_entropy"][0], passes);
  // Work timed inside attention's parallel regions (prof::TeamTimes) and the LoRA products:
  // children of their ops, within them.
  const std::pair<const char*, std::vector<const char*>> tiles[] = {
      {"step/forward/attention_fwd", {"tile_qk", "tile_pv"}},
      {"step/backward/attention_bwd", {"tile_qk", "tile_dp", "tile_dq", "tile_dkdv"}}};
  for (const auto& [op, products] : tiles) {
    double sum = 0;
    for (const char* product : products) {
      const std::string child = std::string(op) + "/" + product;
      ASSERT_EQ(rows.count(child), 1u) << child;
      EXPECT_GE(rows[child][0], rows[op][0]) << child;  // at least one product per call
      EXPECT_GT(rows[child][1], 0.0) << child;
      sum += rows[child][1];
    }
    EXPECT_LT(sum, rows[op][1]) << op;
  }
  ASSERT_EQ(rows.count("step/backward/linear_bwd/lora_grads"), 1u);
  EXPECT_GT(rows["step/backward/linear_bwd/lora_grads"][0], 0.0);
  // The rows' self times add up to the steps' wall time.
  double self = 0;
  for (const auto& [p, v] : rows) self += v[2];
  EXPECT_NEAR(self, rows["step"][1], 1e-3 * double(rows.size()) + 1e-6 * rows["step"][1]);
}
