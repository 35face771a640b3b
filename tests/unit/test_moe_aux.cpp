// The mixture-of-experts load-balancing auxiliary loss (moe.aux_loss; model/moe.h moe_aux_loss)
// against transformers' MixtralForCausalLM and Qwen3MoeForCausalLM called with
// output_router_logits=True (tests/reference/gen_moe_aux_fixtures.py: syn_mixtral and
// syn_qwen3_moe with their attention LoRA, fp32): the loss (cross-entropy +
// router_aux_loss_coef x load_balancing_loss_func) and every LoRA gradient, with and without an
// attention mask, with every layer checkpointed too; the trainer's settings and padding rows.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "config/config.h"
#include "config/run_spec.h"
#include "core/threads.h"
#include "test_model_util.h"
#include "train/trainer.h"

using namespace qlft;
using namespace model_test;
using qlft_test::max_rel_error;

namespace {

constexpr double kTol = 1e-4;

// syn_<family> with config.json edited: output_router_logits true, router_aux_loss_coef coef.
std::string aux_model_dir(const std::string& family, double coef) {
  return edited_model_dir(
      qlft_test::fixture_path("families/syn_" + family),
      [&](nlohmann::json& j) {
        j["output_router_logits"] = true;
        j["router_aux_loss_coef"] = coef;
      },
      "moe_aux");
}

struct AuxRun {
  LossResult loss;
  std::unique_ptr<LoraAdapter> lora;
};

// One training forward and backward of the fixture's batch with case c's targets (and its
// attention mask when use_mask), the loss weighted coef.
AuxRun run_case(MemoryTracker& tr, const Model& m, const Fixture& ref, const Fixture& aux,
                const std::string& c, bool use_mask, bool ckpt, float coef) {
  auto be = make_cpu_backend(&tr);
  AuxRun out;
  out.lora = std::make_unique<LoraAdapter>(&tr, m.shapes, lora_config_of(ref));
  load_lora(ref, *out.lora);
  LlamaRunner run(m, *be, out.lora.get());
  run.set_moe_aux_loss(coef);
  run.set_checkpoint_all(ckpt);
  std::vector<int32_t> tok = ref.i32("tokens"), tgt = aux.i32(c + ".targets"),
                       mask32 = aux.i32(c + ".mask");
  std::vector<uint8_t> mask(mask32.begin(), mask32.end());
  const std::vector<int64_t> shp = ref.shape("tokens");
  TokenBatch b;
  b.batch = static_cast<int>(shp[0]);
  b.seq = static_cast<int>(shp[1]);
  b.tokens = tok.data();
  b.targets = tgt.data();
  if (use_mask) b.attention_mask = mask.data();
  out.loss = run.forward(b);
  run.backward();
  return out;
}

// The family's two cases against its fixture.
void check_family(const std::string& family) {
  SCOPED_TRACE(family);
  set_num_threads(1);
  const Fixture ref(qlft_test::fixture_path("families/syn_" + family + ".lora.safetensors"));
  const Fixture aux(qlft_test::fixture_path("moe_aux/syn_" + family + "_aux.safetensors"));
  const double coef = std::stod(aux.meta("router_aux_loss_coef"));
  MemoryTracker tr;
  auto model = load_model(&tr, aux_model_dir(family, coef), keep());
  const int grads = 2 * 4 * model->cfg.n_layers;  // q, k, v, o: A and B
  // config.json's output_router_logits and router_aux_loss_coef are read.
  EXPECT_TRUE(model->cfg.moe.aux_loss);
  EXPECT_FLOAT_EQ(model->cfg.moe.aux_coef, static_cast<float>(coef));
  for (const char* c : {"full", "pad"}) {
    // The auxiliary term moves the gradients well past the tolerance (the test can fail).
    const std::vector<float> with = aux.f32(std::string(c) + ".l0.q_proj.gA"),
                             without = aux.f32(std::string(c) + ".nocoef.l0.q_proj.gA");
    EXPECT_GT(max_rel_error(without.data(), with.data(), with.size()), 100 * kTol) << c;
    const double loss = aux.f32(std::string(c) + ".loss")[0],
                 lb = aux.f32(std::string(c) + ".aux")[0];
    for (bool ckpt : {false, true}) {
      SCOPED_TRACE(std::string(c) + (ckpt ? " checkpointed" : ""));
      AuxRun r = run_case(tr, *model, ref, aux, c, true, ckpt, model->cfg.moe.aux_coef);
      EXPECT_NEAR(r.loss.mean(), loss, kTol * loss);
      EXPECT_NEAR(r.loss.moe_aux / coef, lb, kTol * lb);
      EXPECT_EQ(check_lora_grads(*r.lora, aux, std::string(c) + ".", kTol), grads);
    }
  }
  // The mask matters: without it the padded case's padding rows count.
  AuxRun r = run_case(tr, *model, ref, aux, "pad", false, false, model->cfg.moe.aux_coef);
  const double lb = aux.f32("pad.aux")[0];
  EXPECT_GT(std::fabs(r.loss.moe_aux / coef - lb), 10 * kTol * lb);
  // Off (coefficient 0): the cross-entropy alone, as transformers without output_router_logits.
  r = run_case(tr, *model, ref, aux, "full", true, false, 0.f);
  const double ce = aux.f32("full.ce")[0];
  EXPECT_NEAR(r.loss.mean(), ce, kTol * ce);
  EXPECT_EQ(r.loss.moe_aux, 0.0);
}

// Mixtral: 2 layers of 4 experts, top-2 renormalised.
TEST(MoeAux, MixtralLossAndLoraGradientsMatchTransformers) {
  check_family("mixtral");
}

// Qwen3-MoE: experts on layers 0 and 2 only (mlp_only_layers [1]: layer 1's dense MLP has no
// router, so the loss averages over two layers' rows), top-2 not renormalised.
TEST(MoeAux, Qwen3MoeLossAndLoraGradientsMatchTransformers) {
  check_family("qwen3_moe");
}

// The trainer: moe.aux_loss=auto follows config.json's output_router_logits; a last batch's
// padding row (micro-batch 3, 2 rows of data) is left out of the loss as transformers' batch of
// the 2 rows has it: the step reports the fixture's loss. A preference objective is refused.
TEST(MoeAux, TrainerFollowsTheConfigAndLeavesOutPaddingRows) {
  set_num_threads(1);
  const Fixture ref(qlft_test::fixture_path("families/syn_mixtral.lora.safetensors"));
  const Fixture aux(qlft_test::fixture_path("moe_aux/syn_mixtral_aux.safetensors"));
  MemoryTracker tr;
  auto model = load_model(
      &tr, aux_model_dir("mixtral", std::stod(aux.meta("router_aux_loss_coef"))), keep());
  data::Batch b;
  const std::vector<int64_t> shp = ref.shape("tokens");
  b.rows = static_cast<int>(shp[0]);
  b.micro_batch = b.rows + 1;
  b.seq_len = static_cast<int>(shp[1]);
  b.tokens = ref.i32("tokens");
  b.targets = aux.i32("full.targets");
  for (int32_t t : b.targets) b.trained_tokens += t != data::kIgnoreIndex;
  b.tokens.resize(size_t(b.micro_batch) * size_t(b.seq_len), 0);
  b.targets.resize(b.tokens.size(), data::kIgnoreIndex);
  Config c;  // the fixture's LoRA (r 4, alpha 8 on the attention) over the batch's shape
  for (const auto& [k, v] : {std::pair<const char*, std::string>{"lora.r", "4"},
                             {"lora.alpha", "8"},
                             {"lora.target_modules", "q_proj,k_proj,v_proj,o_proj"},
                             {"data.seq_len", std::to_string(b.seq_len)},
                             {"train.micro_batch", std::to_string(b.micro_batch)}})
    c.set(k, v);
  {
    Trainer t(*model, &tr, nullptr, parse_run_spec(c));
    load_lora(ref, t.lora());
    StepReport rep;
    t.step_on({b}, &rep);
    const double loss = aux.f32("full.loss")[0];
    EXPECT_NEAR(rep.loss, loss, kTol * loss);
  }
  c.set("train.objective", "dpo");
  try {
    Trainer t(*model, &tr, nullptr, parse_run_spec(c));
    ADD_FAILURE() << "dpo with the load-balancing loss was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("moe.aux_loss"), std::string::npos) << e.what();
  }
}

TEST(MoeAux, SettingsAndRefusals) {
  Config c;
  RunSpec s = parse_run_spec(c);
  EXPECT_EQ(s.train.moe_aux_loss, -1);  // auto: the model's output_router_logits
  EXPECT_LT(s.train.moe_aux_coef, 0);   // auto: its router_aux_loss_coef
  c.set("moe.aux_loss", "on");
  c.set("moe.aux_loss_coef", "0.5");
  s = parse_run_spec(c);
  EXPECT_EQ(s.train.moe_aux_loss, 1);
  EXPECT_DOUBLE_EQ(s.train.moe_aux_coef, 0.5);
  c.set("moe.aux_loss", "off");
  EXPECT_EQ(parse_run_spec(c).train.moe_aux_loss, 0);
  for (const char* bad : {"-1", "x"}) {
    try {
      c.set("moe.aux_loss_coef", bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("moe.aux_loss_coef"), std::string::npos) << e.what();
    }
  }
  // A model without experts, and a negative weight, are refused by name.
  MemoryTracker tr;
  auto dense = load_model(&tr, qlft_test::fixture_path("families/syn_qwen3"), keep());
  auto be = make_cpu_backend(&tr);
  LlamaRunner run(*dense, *be, nullptr);
  try {
    run.set_moe_aux_loss(0.01f);
    ADD_FAILURE() << "a dense model took the auxiliary loss";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("moe.aux_loss"), std::string::npos) << e.what();
  }
  EXPECT_THROW(run.set_moe_aux_loss(-1.f), Error);
}

}  // namespace
