// The preference objectives against TRL 1.16 (tests/reference/gen_preference_fixtures.py): on
// stories260K with a seeded LoRA (r 4, alpha 8, all projections, B != 0), 2 pairs of prompt +
// chosen / rejected ids, each objective's loss, TRL's logged metrics and the LoRA gradients of
// DPOTrainer._compute_loss (sigmoid, ipo), ORPOTrainer and CPOTrainer (simpo) get_batch_loss_
// metrics and KTOTrainer._compute_loss, within 1e-4 relative in fp32.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/backend.h"
#include "core/threads.h"
#include "model/llama.h"
#include "support/test_support.h"
#include "test_model_util.h"
#include "train/preference.h"

using namespace qlft;
using model_test::Fixture;

namespace {

constexpr int kT = 24;  // the fixture's padded row length

// Rows of ids [n, kT] with the loss on the tokens mask marks: target t = ids[t + 1] where
// mask[t + 1] (TRL's labels masked by completion_mask, shifted).
data::Batch rows_of(const std::vector<int32_t>& ids, const std::vector<int32_t>& mask) {
  data::Batch b;
  b.micro_batch = b.rows = static_cast<int>(ids.size() / kT);
  b.seq_len = kT;
  b.tokens = ids;
  b.targets.assign(ids.size(), kIgnoreIndex);
  for (int r = 0; r < b.rows; ++r)
    for (int t = 0; t + 1 < kT; ++t)
      if (mask[r * kT + t + 1]) b.targets[r * kT + t] = ids[r * kT + t + 1];
  for (int32_t x : b.targets) b.trained_tokens += x != kIgnoreIndex;
  return b;
}

struct Setup {
  MemoryTracker tracker;
  std::unique_ptr<Model> model;
  std::unique_ptr<Backend> be;
  std::unique_ptr<LoraAdapter> lora;
  std::unique_ptr<LlamaRunner> run;
};

double rel(double a, double b) {
  return std::fabs(a - b) / std::max(std::fabs(b), 1e-6);
}

void check_objective(const char* name, Objective o, PrefSpec s) {
  QLFT_NEED_SHARED(path, "models/stories260K.gguf");
  set_num_threads(1);
  Fixture fx(qlft_test::fixture_path("preference/preference.safetensors"));
  Setup st;
  st.model = load_model(&st.tracker, path, model_test::keep());
  st.be = make_cpu_backend(&st.tracker);
  LoraConfig lc;
  lc.r = 4;
  lc.alpha = 8;
  st.lora = std::make_unique<LoraAdapter>(&st.tracker, st.model->shapes, lc);
  model_test::load_lora(fx, *st.lora);
  st.run = std::make_unique<LlamaRunner>(*st.model, *st.be, st.lora.get());

  const std::vector<int32_t> ids = fx.i32("ids"), attn = fx.i32("attn"), comp = fx.i32("comp");
  PrefBatch b;
  b.rows = rows_of(ids, comp);
  if (o == Objective::Orpo) {  // the prompt's next tokens: real (attn) but not answer (comp)
    std::vector<int32_t> prompt(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) prompt[i] = attn[i] && !comp[i];
    b.prompt_targets = rows_of(ids, prompt).targets;
  }
  if (o == Objective::Kto) {
    b.kl_rows = rows_of(fx.i32("kto.kl_ids"), fx.i32("kto.kl_comp"));
    for (int32_t l : fx.i32("kto.label")) b.desirable.push_back(static_cast<uint8_t>(l));
  }
  s.objective = o;
  st.run->zero_lora_grads();
  PrefMetrics m = preference_forward_backward(*st.run, s, b, 1.f, 0);

  const std::string k = name;
  const double loss_ref = fx.f32(k + ".loss")[0];
  EXPECT_LT(rel(m.loss, loss_ref), 1e-4) << name << " loss ours " << m.loss << " TRL " << loss_ref;
  const std::vector<float> mr = fx.f32(k + ".metrics");
  const double ours[] = {m.rewards_chosen,     m.rewards_rejected, m.rewards_margins,
                         m.rewards_accuracies, m.logps_chosen,     m.logps_rejected};
  const char* names[] = {"rewards/chosen",     "rewards/rejected", "rewards/margins",
                         "rewards/accuracies", "logps/chosen",     "logps/rejected"};
  for (int i = 0; i < 6; ++i) {
    if (std::isnan(mr[i])) {  // TRL logs none: neither do we
      EXPECT_TRUE(std::isnan(ours[i])) << name << " " << names[i];
      continue;
    }
    // Margins are differences of near values: compared at the rewards' scale.
    const double scale = std::max({std::fabs(double(mr[i])), std::fabs(double(mr[0])), 1e-6});
    EXPECT_LT(std::fabs(ours[i] - mr[i]) / scale, 1e-4)
        << name << " " << names[i] << " ours " << ours[i] << " TRL " << mr[i];
  }
  if (fx.has(k + ".nll_loss"))
    EXPECT_LT(rel(m.nll_loss, fx.f32(k + ".nll_loss")[0]), 1e-4) << name << " nll_loss";
  if (fx.has(k + ".kl")) EXPECT_LT(rel(m.kl, fx.f32(k + ".kl")[0]), 1e-4) << name << " kl";

  double worst = 0;
  for (int l = 0; l < st.lora->n_layers(); ++l)
    for (int p = 0; p < kProjCount; ++p) {
      const Proj pr = static_cast<Proj>(p);
      const std::string g = k + ".l" + std::to_string(l) + "." + proj_peft_name(pr) + ".";
      for (auto part : {LoraAdapter::Part::dA, LoraAdapter::Part::dB}) {
        const bool isA = part == LoraAdapter::Part::dA;
        std::vector<float> ours_g = st.lora->get_hf(l, pr, part);
        std::vector<float> ref = fx.f32(g + (isA ? "dA" : "dB"));
        ASSERT_EQ(ours_g.size(), ref.size());
        const double e = qlft_test::max_rel_error(ours_g.data(), ref.data(), ref.size());
        worst = std::max(worst, e);
        EXPECT_LT(e, 1e-4) << g << (isA ? "dA" : "dB");
      }
    }
  std::printf("%s: loss %.6f (TRL %.6f), worst LoRA gradient error %.3g of each tensor's max\n",
              name, m.loss, loss_ref, worst);
}

PrefSpec base() {
  PrefSpec s;
  s.beta = 0.1;
  return s;
}

}  // namespace

TEST(Preference, DpoMatchesTrl) {
  check_objective("dpo", Objective::Dpo, base());
}
TEST(Preference, IpoMatchesTrl) {
  check_objective("ipo", Objective::Ipo, base());
}
TEST(Preference, OrpoMatchesTrl) {
  check_objective("orpo", Objective::Orpo, base());
}
TEST(Preference, SimpoMatchesTrl) {
  PrefSpec s;
  s.beta = 2.0;
  s.simpo_gamma = 0.5;
  s.cpo_alpha = 0.5;
  s.label_smoothing = 0.1;
  check_objective("simpo", Objective::Simpo, s);
}
TEST(Preference, KtoMatchesTrl) {
  PrefSpec s = base();
  s.desirable_weight = 1.0;
  s.undesirable_weight = 1.5;
  check_objective("kto", Objective::Kto, s);
}

// The derivative the backward uses, against central differences of the loss itself (a
// second path: a wrong sign or factor in d loss / d logp fails here before any model runs).
TEST(Preference, LossDerivativesMatchFiniteDifferences) {
  for (Objective o :
       {Objective::Dpo, Objective::Ipo, Objective::Orpo, Objective::Simpo, Objective::Kto}) {
    PrefSpec s;
    s.objective = o;
    s.beta = o == Objective::Simpo ? 2.0 : 0.1;
    s.cpo_alpha = 0.3;
    s.label_smoothing = 0.1;
    s.undesirable_weight = 1.5;
    PrefInput in;
    in.policy = {{-12.5, 5}, {-30.25, 9}, {-15.0, 6}, {-22.0, 7}};
    in.ref = {-13.0, -29.0, -14.0, -23.5};
    in.prompt_ce = {{8.0, 4}, {11.0, 5}, {0, 0}, {0, 0}};
    in.desirable = {1, 0, 1, 0};
    in.kl = 0.7;
    PrefGrad g;
    preference_loss(s, in, &g);
    for (size_t i = 0; i < in.policy.size(); ++i) {
      const double h = 1e-5;
      PrefInput a = in, b = in;
      a.policy[i].sum += h;
      b.policy[i].sum -= h;
      const double fd =
          (preference_loss(s, a, nullptr).loss - preference_loss(s, b, nullptr).loss) / (2 * h);
      EXPECT_NEAR(g.d_logp[i], fd, 1e-6 + 1e-5 * std::fabs(fd)) << name_of(o) << " row " << i;
      if (o == Objective::Orpo) {
        a = in, b = in;
        a.prompt_ce[i].sum += h;
        b.prompt_ce[i].sum -= h;
        const double fp =
            (preference_loss(s, a, nullptr).loss - preference_loss(s, b, nullptr).loss) / (2 * h);
        EXPECT_NEAR(g.d_prompt_ce[i], fp, 1e-6 + 1e-5 * std::fabs(fp)) << "orpo prompt row " << i;
      }
    }
  }
}
