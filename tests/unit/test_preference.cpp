// The preference objectives against TRL 1.16 (tests/reference/gen_preference_fixtures.py): on
// stories260K with a seeded LoRA (r 4, alpha 8, all projections, B != 0), 2 pairs of prompt +
// chosen / rejected ids, each objective's loss, TRL's logged metrics and the LoRA gradients of
// DPOTrainer._compute_loss (sigmoid, ipo), ORPOTrainer and CPOTrainer (simpo) get_batch_loss_
// metrics and KTOTrainer._compute_loss, within 1e-4 relative in fp32.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "backend/backend.h"
#include "core/error.h"
#include "core/threads.h"
#include "data/preference.h"
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

// ---- data: records and TRL's tokenization (a byte encoder: ids are the bytes) ----------------

namespace {

std::string write_jsonl(const std::string& name, const std::string& text) {
  const std::string p = qlft_test::temp_dir("pref_data") + "/" + name;
  FILE* f = std::fopen(p.c_str(), "wb");
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
  return p;
}

std::vector<int32_t> bytes(const std::string& s) {
  return {s.begin(), s.end()};
}

// The QLFT_ERR_FORMAT message reading path gives.
std::string format_error(const std::string& path, bool kto) {
  data::DropLog log;
  try {
    data::read_preference_records(path, kto, data::ReadOptions{}, log);
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_FORMAT);
    return e.what();
  }
  return "";
}

}  // namespace

TEST(PreferenceData, PairsTokenizeAsTrl) {
  // BOS (256) + prompt, then the answer with EOS appended as text ("</s>", id 257).
  const std::string p =
      write_jsonl("pairs.jsonl",
                  "{\"prompt\": \"ab\", \"chosen\": \"c\", \"rejected\": \"de\"}\n"
                  "\n"
                  "{\"prompt\": \"x\", \"chosen\": \"y</s>\", \"rejected\": \"z\"}\n");
  data::DropLog log;
  auto recs = data::read_preference_records(p, false, data::ReadOptions{}, log);
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[1].where, p + ":3");
  data::ByteEncoder enc;
  data::PrefExample e = data::tokenize_preference(recs[0], false, enc);
  EXPECT_EQ(e.prompt, (std::vector<int32_t>{256, 'a', 'b'}));
  EXPECT_EQ(e.chosen, (std::vector<int32_t>{'c', 257}));
  EXPECT_EQ(e.rejected, (std::vector<int32_t>{'d', 'e', 257}));
  e = data::tokenize_preference(recs[1], false, enc);  // an EOS already there is not doubled
  EXPECT_EQ(e.chosen, (std::vector<int32_t>{'y', 257}));

  // The batch: chosen rows, then rejected rows, right-padded; targets on the answers only.
  data::PrefExample a = data::tokenize_preference(recs[0], false, enc);
  PrefBatch b = make_pref_batch({&a}, Objective::Dpo, 0);
  ASSERT_EQ(b.rows.micro_batch, 2);
  ASSERT_EQ(b.rows.seq_len, 6);  // 256 a b d e 257
  EXPECT_EQ(b.rows.tokens,
            (std::vector<int32_t>{256, 'a', 'b', 'c', 257, 0, 256, 'a', 'b', 'd', 'e', 257}));
  const int32_t I = kIgnoreIndex;
  EXPECT_EQ(b.rows.targets, (std::vector<int32_t>{I, I, 'c', 257, I, I, I, I, 'd', 'e', 257, I}));
  b = make_pref_batch({&a}, Objective::Orpo, 0);
  EXPECT_EQ(b.prompt_targets, (std::vector<int32_t>{'a', 'b', I, I, I, I, 'a', 'b', I, I, I, I}));
}

TEST(PreferenceData, ConversationsTokenizeAfterTheGenerationPrompt) {
  const std::string p = write_jsonl(
      "chat.jsonl",
      "{\"prompt\": [{\"role\": \"user\", \"content\": \"hi\"}], \"chosen\": [{\"role\": "
      "\"assistant\", \"content\": \"yo\"}], \"rejected\": [{\"role\": \"assistant\", "
      "\"content\": \"no\"}]}\n");
  data::DropLog log;
  auto recs = data::read_preference_records(p, false, data::ReadOptions{}, log);
  ASSERT_EQ(recs.size(), 1u);
  ASSERT_TRUE(recs[0].chat);
  data::ByteEncoder enc({"<s>", "</s>", "<|im_start|>", "<|im_end|>"});
  data::ChatTemplate t;
  t.kind = data::TemplateKind::ChatML;
  data::PrefExample e = data::tokenize_preference(recs[0], false, enc, &t);
  const std::string prompt = enc.decode(e.prompt.data(), e.prompt.size());
  EXPECT_NE(prompt.find("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
            std::string::npos)
      << prompt;
  EXPECT_EQ(prompt.size() - prompt.rfind("assistant\n"), 10u) << prompt;  // ends there
  EXPECT_EQ(enc.decode(e.chosen.data(), e.chosen.size()), "yo<|im_end|>\n");
  EXPECT_EQ(enc.decode(e.rejected.data(), e.rejected.size()), "no<|im_end|>\n");
  EXPECT_THROW(data::tokenize_preference(recs[0], false, enc, nullptr), Error);
}

TEST(PreferenceData, BadRecordsNameFileAndLine) {
  std::string m =
      format_error(write_jsonl("bad1.jsonl",
                               "{\"prompt\": \"a\", \"chosen\": \"b\", \"rejected\": \"c\"}\n"
                               "{\"prompt\": \"a\", \"chosen\": \"b\"}\n"),
                   false);
  EXPECT_NE(m.find("bad1.jsonl:2"), std::string::npos) << m;
  EXPECT_NE(m.find("rejected"), std::string::npos) << m;
  m = format_error(write_jsonl("bad2.jsonl",
                               "{\"prompt\": \"a\", \"completion\": \"b\", "
                               "\"label\": \"yes\"}\n"),
                   true);
  EXPECT_NE(m.find("bad2.jsonl:1"), std::string::npos) << m;
  EXPECT_NE(m.find("label"), std::string::npos) << m;
  m = format_error(write_jsonl("bad3.jsonl", "\n\n{\"prompt\": 3, \"chosen\"\n"), false);
  EXPECT_NE(m.find("bad3.jsonl:3"), std::string::npos) << m;
  m = format_error(write_jsonl("bad4.jsonl",
                               "{\"prompt\": [{\"role\": \"user\"}], "
                               "\"chosen\": \"b\", \"rejected\": \"c\"}\n"),
                   false);
  EXPECT_NE(m.find("bad4.jsonl:1"), std::string::npos) << m;
  EXPECT_NE(m.find("content"), std::string::npos) << m;
  // on_error=skip: counted, the good records kept.
  data::ReadOptions skip;
  skip.skip_bad = true;
  data::DropLog log;
  auto recs = data::read_preference_records(
      write_jsonl("bad5.jsonl",
                  "{\"prompt\": \"a\", \"chosen\": \"b\", \"rejected\": \"c\"}\n"
                  "not json\n"),
      false, skip, log);
  EXPECT_EQ(recs.size(), 1u);
  EXPECT_EQ(log.count, 1u);
}
