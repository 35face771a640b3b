// DPO through the C ABI as a program would drive it: a dataset loaded under
// train.objective=dpo reads preference records, a trainer made with the same objective steps
// on them (the reference pass inside each step), and the mismatches are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>

#include "api/api_session.h"
#include "qlft.h"
#include "support/preference_pairs.h"
#include "support/test_support.h"

using qlft_test::Session;

TEST(ApiPreference, DpoTrainerStepsOnPreferenceRecords) {
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  QLFT_NEED_SHARED(stories, "data/tinystories-sample.txt");
  const std::string path = qlft_test::temp_dir("api_pref") + "/pairs.jsonl";
  {
    std::ofstream f(path);
    f << qlft_test::make_pairs_jsonl(stories, 64);
  }
  Session s;
  ASSERT_EQ(qlft_config_create(&s.cfg), QLFT_OK);
  s.set("quant.type", "keep");
  s.set("threads", "1");
  s.set("train.objective", "dpo");
  s.set("pref.beta", "0.1");
  s.set("optim.lr", "2e-3");
  s.set("sched.name", "constant");
  s.set("train.micro_batch", "8");
  s.set("data.epochs", "2");
  ASSERT_EQ(qlft_runtime_create(s.cfg, &s.rt), QLFT_OK);
  ASSERT_EQ(qlft_model_load(s.rt, model_path.c_str(), s.cfg, &s.model), QLFT_OK);
  ASSERT_EQ(qlft_dataset_load(s.model, path.c_str(), s.cfg, &s.data), QLFT_OK) << qlft_last_error();
  qlft_dataset_stats st{};
  st.struct_size = sizeof(st);
  ASSERT_EQ(qlft_dataset_get_stats(s.data, &st), QLFT_OK);
  EXPECT_EQ(st.records, 64u);

  // An sft trainer on preference data is refused, naming the objectives.
  qlft_config* sft = nullptr;
  ASSERT_EQ(qlft_config_create(&sft), QLFT_OK);
  qlft_trainer* bad = nullptr;
  EXPECT_EQ(qlft_trainer_create(s.model, s.data, sft, &bad), QLFT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qlft_last_error()).find("train.objective"), std::string::npos);
  qlft_config_free(sft);

  ASSERT_EQ(qlft_trainer_create(s.model, s.data, s.cfg, &s.trainer), QLFT_OK) << qlft_last_error();
  std::vector<float> losses;
  std::vector<qlft_step_stats> stats;
  qlft_step_stats r{};
  r.struct_size = sizeof(r);
  int32_t rc;
  while ((rc = qlft_trainer_step(s.trainer, &r)) == QLFT_OK)
    losses.push_back(r.loss), stats.push_back(r);
  EXPECT_EQ(rc, QLFT_ERR_INVALID_ARGUMENT);  // complete: 64 pairs x 2 epochs / 8 = 16 steps
  ASSERT_EQ(losses.size(), 16u);
  // Step 1: B = 0, so the policy is the reference and every pair's loss is -log sigmoid(0).
  EXPECT_NEAR(losses[0], std::log(2.0), 1e-5);
  EXPECT_LT(losses.back(), 0.5 * std::log(2.0)) << "DPO did not learn the pairs";

  // The step's TRL metrics in the stats. Step 1: the policy is the reference, so every reward
  // (beta x (policy - reference log-probability)) is 0.
  EXPECT_NEAR(stats[0].rewards_chosen, 0.0, 1e-6);
  EXPECT_NEAR(stats[0].rewards_rejected, 0.0, 1e-6);
  EXPECT_NEAR(stats[0].rewards_margins, 0.0, 1e-6);
  for (size_t i = 0; i < stats.size(); ++i) {
    const qlft_step_stats& x = stats[i];
    SCOPED_TRACE("step " + std::to_string(i + 1));
    EXPECT_NEAR(x.rewards_margins, x.rewards_chosen - x.rewards_rejected, 1e-9);
    // The share of a micro-batch's 8 pairs (one micro-batch a step) ranked right.
    EXPECT_GE(x.rewards_accuracies, 0.0);
    EXPECT_LE(x.rewards_accuracies, 1.0);
    EXPECT_NEAR(x.rewards_accuracies * 8, std::round(x.rewards_accuracies * 8), 1e-9);
    // Summed answer log-probabilities: negative, and the chosen (real story text) and rejected
    // (corrupted) answers differ.
    EXPECT_LT(x.logps_chosen, 0.0);
    EXPECT_LT(x.logps_rejected, 0.0);
    EXPECT_NE(x.logps_chosen, x.logps_rejected);
    // The loss is the mean of -log sigmoid(margin_i), a convex function: at least its value at
    // the mean margin (Jensen).
    EXPECT_GE(x.loss, std::log1p(std::exp(-x.rewards_margins)) - 1e-5);
    // DPO logs no NLL term nor KL.
    EXPECT_TRUE(std::isnan(x.nll_loss));
    EXPECT_TRUE(std::isnan(x.kl));
  }
  EXPECT_GT(stats.back().rewards_margins, 0.0);
  EXPECT_GE(stats.back().rewards_accuracies, 0.75) << "DPO did not learn to rank the pairs";
}

// An sft step logs no preference metrics: every field is NaN.
TEST(ApiPreference, SftStepHasNoPreferenceMetrics) {
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  QLFT_NEED_SHARED(stories, "data/tinystories-sample.txt");
  Session s;
  ASSERT_EQ(qlft_config_create(&s.cfg), QLFT_OK);
  s.set("quant.type", "keep");
  s.set("threads", "1");
  s.set("data.seq_len", "64");
  s.set("train.micro_batch", "2");
  s.set("train.max_steps", "1");
  ASSERT_EQ(qlft_runtime_create(s.cfg, &s.rt), QLFT_OK);
  ASSERT_EQ(qlft_model_load(s.rt, model_path.c_str(), s.cfg, &s.model), QLFT_OK);
  ASSERT_EQ(qlft_dataset_load(s.model, stories.c_str(), s.cfg, &s.data), QLFT_OK)
      << qlft_last_error();
  ASSERT_EQ(qlft_trainer_create(s.model, s.data, s.cfg, &s.trainer), QLFT_OK) << qlft_last_error();
  qlft_step_stats r{};
  r.struct_size = sizeof(r);
  ASSERT_EQ(qlft_trainer_step(s.trainer, &r), QLFT_OK) << qlft_last_error();
  EXPECT_TRUE(std::isfinite(r.loss));
  for (double v : {r.rewards_chosen, r.rewards_rejected, r.rewards_margins, r.rewards_accuracies,
                   r.logps_chosen, r.logps_rejected, r.nll_loss, r.kl})
    EXPECT_TRUE(std::isnan(v));
}
