// Issue 49 criterion 2: DPO on stories260K learns a preference from a real source, and costs no
// more memory than SFT on the same rows plus the reference pass.
//
// Pairs from TinyStories (../shared/data/tinystories-sample.txt): prompt = a story's first
// sentence, chosen = its real second sentence, rejected = the same words shuffled (seeded). They
// are written as preference JSON lines and read back through the data path (data/preference.h).
// The held-out accuracy is TRL's rewards/accuracies on pairs never trained on: the share whose
// implicit reward margin beta ((pc - rc) - (pr - rr)) is > 0 (before training every margin is 0
// since the adapter starts as B = 0: counted as a coin flip, 50%).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "config/config.h"
#include "core/threads.h"
#include "data/preference.h"
#include "data/tokenizer_encoder.h"
#include "support/preference_pairs.h"
#include "support/test_support.h"
#include "test_model_util.h"
#include "tokenizer/tokenizer.h"
#include "train/planner.h"
#include "train/trainer.h"

using namespace qlft;

namespace {

Config dpo_config() {
  Config c;
  c.set("lora.r", "8");
  c.set("lora.alpha", "16");
  c.set("lora.dropout", "0");
  c.set("optim.lr", "2e-3");
  c.set("sched.name", "constant");
  c.set("train.precision", "fp32");
  c.set("train.objective", "dpo");
  c.set("pref.beta", "0.1");
  return c;
}

std::vector<PrefBatch> batches_of(const std::vector<data::PrefExample>& ex, size_t first,
                                  size_t pairs, int32_t pad) {
  std::vector<const data::PrefExample*> p;
  for (size_t i = first; i < first + pairs && i < ex.size(); ++i) p.push_back(&ex[i]);
  return {make_pref_batch(p, Objective::Dpo, pad)};
}

// Held-out accuracy of the implicit reward margin (ties count half).
double held_out_accuracy(Trainer& t, const std::vector<data::PrefExample>& ex, size_t first,
                         int32_t pad) {
  double acc = 0;
  size_t n = 0;
  for (size_t i = first; i < ex.size(); i += 8) {
    PrefBatch b = batches_of(ex, i, 8, pad)[0];
    std::vector<SeqLogp> pol;
    std::vector<double> ref;
    preference_logps(t.runner(), b.rows, true, &pol, &ref);
    const size_t P = pol.size() / 2;
    for (size_t k = 0; k < P; ++k) {
      const double m = (pol[k].sum - ref[k]) - (pol[P + k].sum - ref[P + k]);
      acc += m > 0 ? 1 : m == 0 ? 0.5 : 0;
      ++n;
    }
  }
  return acc / static_cast<double>(n);
}

// stories260K (fp32) and one DPO micro-batch of 8 TinyStories pairs read back through the data
// path (the memory tests' set-up).
struct Pairs8 {
  MemoryTracker tracker;
  std::unique_ptr<Model> model;
  std::vector<PrefBatch> batches;
  Pairs8(const std::string& model_path, const std::string& stories, const char* name) {
    set_num_threads(2);
    const std::string path = qlft_test::temp_dir(name) + "/pairs.jsonl";
    {
      std::ofstream f(path);
      f << qlft_test::make_pairs_jsonl(stories, 8);
    }
    data::DropLog log;
    std::vector<data::PrefRecord> recs =
        data::read_preference_records(path, false, data::ReadOptions{}, log);
    model = load_model(&tracker, model_path, model_test::keep());
    auto tok = Tokenizer::from_gguf(*model->gguf);
    data::TokenizerEncoder enc(*tok);
    std::vector<data::PrefExample> ex;
    for (const data::PrefRecord& r : recs) ex.push_back(data::tokenize_preference(r, false, enc));
    batches = batches_of(ex, 0, 8, enc.pad_id());
  }
};

}  // namespace

TEST(PreferenceRun, DpoLearnsHeldOutPreferences) {
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  QLFT_NEED_SHARED(stories, "data/tinystories-sample.txt");
  set_num_threads(2);
  const size_t kTrain = 256, kHeld = 64, kPairs = 8;
  const std::string dir = qlft_test::temp_dir("pref_run");
  const std::string path = dir + "/pairs.jsonl";
  {
    std::ofstream f(path);
    f << qlft_test::make_pairs_jsonl(stories, kTrain + kHeld);
  }
  data::DropLog log;
  std::vector<data::PrefRecord> recs =
      data::read_preference_records(path, false, data::ReadOptions{}, log);
  ASSERT_EQ(recs.size(), kTrain + kHeld);

  MemoryTracker tracker;
  auto model = load_model(&tracker, model_path, model_test::keep());
  auto tok = Tokenizer::from_gguf(*model->gguf);
  data::TokenizerEncoder enc(*tok);
  std::vector<data::PrefExample> ex;
  for (const data::PrefRecord& r : recs) ex.push_back(data::tokenize_preference(r, false, enc));
  const int32_t pad = enc.pad_id();

  Trainer t(*model, &tracker, nullptr, parse_run_spec(dpo_config()));
  const double before = held_out_accuracy(t, ex, kTrain, pad);
  EXPECT_NEAR(before, 0.5, 1e-9);  // B = 0: policy = reference, every margin 0

  const auto t0 = std::chrono::steady_clock::now();
  PrefMetrics m;
  const int epochs = 2;
  for (int e = 0; e < epochs; ++e)
    for (size_t i = 0; i < kTrain; i += kPairs) {
      StepReport r;
      t.step_pref(batches_of(ex, i, kPairs, pad), &r, &m);
      ASSERT_FALSE(r.skipped);
    }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double after = held_out_accuracy(t, ex, kTrain, pad);
  std::printf(
      "DPO stories260K: %zu train pairs x %d epochs (%lld steps of %zu pairs, %.1f s); "
      "held-out accuracy %.3f -> %.3f; last step loss %.4f margins %.3f train acc %.3f\n",
      kTrain, epochs, static_cast<long long>(t.steps_done()), kPairs, secs, before, after, m.loss,
      m.rewards_margins, m.rewards_accuracies);
  EXPECT_GE(after, 0.8);
}

// One DPO step's peak against an SFT step on the same rows plus an inference pass over them
// (what the reference pass holds), all measured by the tracker from the same baseline: the base
// is not copied and the objective's extra cost is the reference pass alone.
TEST(PreferenceRun, DpoPeakIsSftPlusReferencePass) {
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  QLFT_NEED_SHARED(stories, "data/tinystories-sample.txt");
  Pairs8 p(model_path, stories, "pref_mem");
  MemoryTracker& tracker = p.tracker;
  const std::unique_ptr<Model>& model = p.model;
  const std::vector<PrefBatch>& b = p.batches;
  const uint64_t weights = tracker.snapshot().allocated[static_cast<int>(MemCategory::Weights)];

  Trainer t(*model, &tracker, nullptr, parse_run_spec(dpo_config()));
  StepReport r;
  t.step_pref(b, &r);  // first: one-time allocations (optimizer state) out of the way
  auto measure = [&](const std::function<void()>& f) {
    t.runner().release();
    tracker.reset_peaks();
    const uint64_t base = tracker.budgeted_reserved();
    f();
    return tracker.budgeted_peak() - base;
  };
  const uint64_t dpo = measure([&] { t.step_pref(b, &r); });
  Config sc = dpo_config();
  sc.set("train.objective", "sft");
  Trainer sft(*model, &tracker, nullptr, parse_run_spec(sc));
  sft.step_on({b[0].rows}, &r);
  const uint64_t sft_peak = measure([&] {
    sft.runner().release();
    sft.step_on({b[0].rows}, &r);
  });
  TokenBatch tb{b[0].rows.micro_batch, b[0].rows.seq_len, b[0].rows.tokens.data(),
                b[0].rows.targets.data()};
  const uint64_t ref = measure([&] {
    sft.runner().eval_loss(tb);
    sft.runner().release();
  });
  std::printf("peaks above the step's start: DPO %llu, SFT %llu, inference pass %llu bytes\n",
              static_cast<unsigned long long>(dpo), static_cast<unsigned long long>(sft_peak),
              static_cast<unsigned long long>(ref));
  EXPECT_LE(dpo, sft_peak + ref);
  EXPECT_EQ(tracker.snapshot().allocated[static_cast<int>(MemCategory::Weights)], weights)
      << "a trainer copied the base";
}

// The planner knows a pair trains on two rows (PlanSettings::rows_per_example) and that DPO's
// reference pass holds a scratch layer beside the policy's stored activations
// (PlanSettings::reference_pass): its prediction for a DPO step of 8 pairs at the batch's padded
// length is the tracker's peak over building the trainer and two steps, within 1% (every
// category but activations exact), and above the SFT plan of twice the rows.
TEST(PreferenceRun, PlannerCountsTwoRowsPerPair) {
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  QLFT_NEED_SHARED(stories, "data/tinystories-sample.txt");
  Pairs8 p(model_path, stories, "pref_plan");
  MemoryTracker& tracker = p.tracker;
  const std::unique_ptr<Model>& model = p.model;
  const std::vector<PrefBatch>& b = p.batches;
  Config c = dpo_config();
  c.set("train.micro_batch", "8");
  c.set("data.seq_len", std::to_string(b[0].rows.seq_len));
  const PlanSettings ps = PlanSettings::from_spec(parse_run_spec(c));
  EXPECT_EQ(ps.rows_per_example, 2);
  const MemoryPlan plan = plan_memory(model->cfg, weight_footprint(*model), ps);
  tracker.reset_peaks();
  {
    Trainer t(*model, &tracker, nullptr, parse_run_spec(c));
    StepReport r;
    t.step_pref(b, &r);
    t.step_pref(b, &r);
  }
  const uint64_t measured = tracker.snapshot().total_peak;
  std::printf("DPO, 8 pairs of %d tokens: planned %llu, measured %llu bytes\n", b[0].rows.seq_len,
              static_cast<unsigned long long>(plan.train_peak),
              static_cast<unsigned long long>(measured));
  const MemorySnapshot m = tracker.snapshot();
  for (int cat = 0; cat < QLFT_MEM_COMMUNICATION; ++cat)
    std::printf("  %s planned %llu, measured %llu\n", mem_category_name(MemCategory(cat)),
                static_cast<unsigned long long>(plan.train[cat]),
                static_cast<unsigned long long>(m.peak[cat]));
  for (int cat = 0; cat < QLFT_MEM_COMMUNICATION; ++cat)
    if (cat != QLFT_MEM_ACTIVATIONS) EXPECT_EQ(plan.train[cat], m.peak[cat]);
  EXPECT_LE(std::fabs(double(plan.train_peak) - double(measured)) / double(measured), 0.01);
  Config sc = c;
  sc.set("train.objective", "sft");
  sc.set("train.micro_batch", "16");
  const MemoryPlan sft = plan_memory(model->cfg, weight_footprint(*model),
                                     PlanSettings::from_spec(parse_run_spec(sc)));
  EXPECT_GT(plan.train[QLFT_MEM_ACTIVATIONS], sft.train[QLFT_MEM_ACTIVATIONS]);
  EXPECT_LE(std::fabs(double(sft.train_peak) - double(measured)) / double(measured), 0.20)
      << "the SFT plan of twice the rows is the DPO step but for the reference pass";
}

// pref.precompute_ref (TRL's precompute_ref_log_probs): the first trainer computes every
// example's reference log-probabilities once and writes them beside the data; a second one
// (a resumed run, another epoch) reads them and runs no reference pass, with the same losses
// bit for bit; both follow the run that measures the reference every step (batches of other
// compositions: within 1e-6); a damaged file is made again.
TEST(PreferenceRun, PrecomputedReferenceIsCachedBesideTheData) {
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  QLFT_NEED_SHARED(stories, "data/tinystories-sample.txt");
  set_num_threads(2);
  const std::string dir = qlft_test::temp_dir("pref_ref");
  const std::string path = dir + "/pairs.jsonl";
  {
    std::ofstream f(path);
    f << qlft_test::make_pairs_jsonl(stories, 8);
  }
  MemoryTracker tracker;
  auto model = load_model(&tracker, model_path, model_test::keep());
  auto tok = Tokenizer::from_gguf(*model->gguf);
  data::TokenizerEncoder enc(*tok);
  Config c = dpo_config();
  c.set("data.path", path);
  c.set("train.micro_batch", "4");
  c.set("train.max_steps", "2");
  c.set("seed", "5");
  const RunSpec live_spec = parse_run_spec(c);
  const PrefSet set = PrefSet::load(live_spec.data, Objective::Dpo, enc);
  auto losses = [&](const RunSpec& spec, bool* loaded) {
    Trainer t(*model, &tracker, nullptr, spec, &set);
    std::vector<double> l;
    StepReport r;
    while (t.step(&r)) l.push_back(r.loss);
    if (loaded) *loaded = t.reference_loaded();
    return l;
  };
  const std::vector<double> live = losses(live_spec, nullptr);
  c.set("pref.precompute_ref", "true");
  const RunSpec spec = parse_run_spec(c);
  bool loaded = true;
  const std::vector<double> first = losses(spec, &loaded);
  EXPECT_FALSE(loaded) << "the first run computes the reference";
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().rfind("pairs.jsonl.qlft-ref-", 0) == 0)
      files.push_back(e.path().string());
  ASSERT_EQ(files.size(), 1u) << "one cache file beside the data";
  const std::vector<double> second = losses(spec, &loaded);
  EXPECT_TRUE(loaded) << "the second run reads the file";
  EXPECT_EQ(first, second);
  ASSERT_EQ(live.size(), first.size());
  for (size_t i = 0; i < live.size(); ++i) EXPECT_NEAR(first[i], live[i], 1e-6) << "step " << i;
  std::filesystem::resize_file(files[0], std::filesystem::file_size(files[0]) - 8);
  const std::vector<double> third = losses(spec, &loaded);
  EXPECT_FALSE(loaded) << "a damaged file is made again";
  EXPECT_EQ(third, first);
  std::filesystem::remove_all(dir);
}
