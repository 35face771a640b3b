// LoRA on a whole MoE model's experts and routers (LoraAdapter's MoE slots, LlamaRunner passing
// them to moe_fwd / moe_bwd) against PEFT 0.21 on transformers 5's MixtralForCausalLM and
// Qwen3MoeForCausalLM (tests/reference/gen_moe_lora_fixtures.py: target_modules q_proj, v_proj,
// w1, w2, w3, gate (qwen3_moe: gate_proj, up_proj, down_proj, gate), which PEFT rewrites into
// target_parameters experts.gate_up_proj (rank 2r, alpha 2 alpha), experts.down_proj and
// gate.weight).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/run_spec.h"
#include "core/threads.h"
#include "model/moe.h"
#include "test_model_util.h"
#include "formats/json_file.h"
#include "train/adapter_io.h"
#include "train/merge_export.h"
#include "train/planner.h"
#include "train/trainer.h"

using namespace qlft;
using namespace model_test;
using qlft_test::max_rel_error;

namespace {

constexpr double kTol = 1e-4;
const char* const kPartKey[kMoePartCount] = {"gate_up", "down", "router"};

Fixture moe_lora_fixture(const std::string& family = "mixtral") {
  return Fixture(qlft_test::fixture_path("moe_lora/syn_" + family + ".moe_lora.safetensors"));
}
std::string mixtral(const char* file = "") {
  return qlft_test::fixture_path(std::string("families/syn_mixtral") + file);
}
std::string key(int l, int p, const char* what) {
  return "l" + std::to_string(l) + "." + kPartKey[p] + "." + what;
}

// The fixture's factors into a (every one of them: the adapter's size is the fixture's).
void load_moe_lora(const Fixture& f, LoraAdapter& a) {
  load_lora_modules(f, a);
  uint64_t n = 0;
  for (const auto& [name, t] : f.t)
    if (name.size() > 2 && (name.compare(name.size() - 2, 2, ".A") == 0 ||
                            name.compare(name.size() - 2, 2, ".B") == 0))
      n += t->numel();
  EXPECT_EQ(a.n_params(), n);
}

// A family's fixture, its model (safetensors, as stored) and the fixture's adapter on it.
struct FamilyAdapter {
  explicit FamilyAdapter(const std::string& family)
      : f(moe_lora_fixture(family)),
        model(load_model(&tr, qlft_test::fixture_path("families/syn_" + family), keep())),
        lora(&tr, model->shapes, lora_config_of(f)) {
    load_moe_lora(f, lora);
  }
  Fixture f;
  MemoryTracker tr;
  std::unique_ptr<Model> model;
  LoraAdapter lora;
};

}  // namespace

// Logits, loss and every LoRA gradient (q, v, each MoE layer's experts' gate_up and down, the
// router; qwen3_moe's dense layer 1 not adapted beyond q / v, as PEFT) of syn_mixtral and
// syn_qwen3_moe (safetensors and llama.cpp's GGUF) vs PEFT's; checkpointing (the recomputed
// layer runs the experts' LoRA again) gives the same gradients.
TEST(MoeLora, MatchesPeft) {
  set_num_threads(1);
  for (const std::string family : {"mixtral", "qwen3_moe"}) {
    const Fixture f = moe_lora_fixture(family);
    const std::string dir = qlft_test::fixture_path("families/syn_" + family);
    for (const std::string& path : {dir, dir + ".gguf"}) {
      SCOPED_TRACE(path);
      MemoryTracker tr;
      auto model = load_model(&tr, path, keep());
      auto be = make_cpu_backend(&tr);
      LoraAdapter lora(&tr, model->shapes, lora_config_of(f));
      load_moe_lora(f, lora);
      LlamaRunner run(*model, *be, &lora);
      std::vector<int32_t> tok = f.i32("tokens"), tgt = f.i32("targets");
      TokenBatch b;
      b.batch = 2;
      b.seq = 16;
      b.tokens = tok.data();
      b.targets = tgt.data();
      const int V = model->cfg.vocab;
      std::vector<float> logits(size_t(b.rows()) * V);
      const LossResult ev = run.logits(b, MatF(logits.data(), b.rows(), V));
      const std::vector<float> ref = f.f32("logits");
      ASSERT_EQ(ref.size(), logits.size());
      const double el = max_rel_error(logits.data(), ref.data(), ref.size());
      EXPECT_LT(el, kTol) << "logits";
      const double loss = f.f32("loss")[0];
      EXPECT_NEAR(ev.mean(), loss, kTol * loss);
      auto grads = [&] {
        lora.zero_grad();
        EXPECT_NEAR(run.forward(b).mean(), loss, kTol * loss) << "training loss";
        run.backward();
        std::vector<float> g;
        for (auto& p : lora.params()) g.insert(g.end(), p.g, p.g + p.n);
        return g;
      };
      const std::vector<float> g0 = grads();
      double worst = 0;
      int n = check_lora_grads(lora, f, "", kTol, &worst), fixture_grads = 0;
      for (const auto& [name, t] : f.t)
        fixture_grads += name.size() > 3 && name.compare(name.size() - 3, 2, ".g") == 0;
      for (int l = 0; l < lora.n_layers(); ++l)
        for (int p = 0; p < kMoePartCount; ++p)
          for (bool is_b : {false, true}) {
            if (!f.has(key(l, p, is_b ? "gB" : "gA"))) continue;
            const std::vector<float> g = lora.get_moe_peft(l, MoePart(p), is_b, true),
                                     gr = f.f32(key(l, p, is_b ? "gB" : "gA"));
            ASSERT_EQ(g.size(), gr.size()) << key(l, p, is_b ? "gB" : "gA");
            const double e = max_rel_error(g.data(), gr.data(), g.size());
            EXPECT_LT(e, kTol) << key(l, p, is_b ? "gB" : "gA");
            worst = std::max(worst, e);
            ++n;
          }
      EXPECT_EQ(n, fixture_grads);
      std::printf("[moe_lora] %s: logits %.2e, %d LoRA gradients, worst %.2e\n", path.c_str(), el,
                  n, worst);
      run.set_checkpoint_all(true);
      EXPECT_EQ(grads(), g0) << "checkpointed";
      // Control: without the experts' and routers' factors (the attention's alone) the logits
      // move.
      LoraConfig qv_cfg = lora_config_of(f);
      qv_cfg.set_targets("q_proj,v_proj");
      LoraAdapter qv(&tr, model->shapes, qv_cfg);
      load_lora(f, qv);
      LlamaRunner run_qv(*model, *be, &qv);
      run_qv.logits(b, MatF(logits.data(), b.rows(), V));
      EXPECT_GT(max_rel_error(logits.data(), ref.data(), ref.size()), 1e-3) << "q / v alone";
    }
  }
}

// PEFT's names and rules: w1 / w3 / w2 / gate (and the target_parameters' own names) adapt the
// experts and the router, gate_up at rank 2r and alpha 2 alpha (rsLoRA: 2 alpha / sqrt(2r));
// w1 without w3 is refused as PEFT refuses it, the router on a dense model, dropout / DoRA on the
// experts (PEFT's ParamWrapper refuses them); A starts as PEFT's kaiming-uniform, B at zero.
TEST(MoeLora, AdapterFollowsPeftsRules) {
  MemoryTracker tr;
  auto model = load_model(&tr, mixtral(), keep());
  LoraConfig c;
  c.r = 2;
  c.alpha = 3;
  c.set_targets("mlp.experts.gate_up_proj,experts.down_proj,mlp.gate.weight");
  EXPECT_TRUE(c.router);
  EXPECT_TRUE(c.targets[int(Proj::Gate)] && c.targets[int(Proj::Up)] && c.targets[int(Proj::Down)]);
  EXPECT_FALSE(c.targets[int(Proj::Q)]);
  for (bool rs : {false, true}) {
    c.use_rslora = rs;
    LoraAdapter a(&tr, model->shapes, c);
    const MoeLoraSlot& gu = a.moe_slot(1, MoePart::GateUp);
    EXPECT_EQ(gu.r, 4);
    EXPECT_EQ(gu.experts, 4);
    EXPECT_EQ(gu.out, 96);
    EXPECT_FLOAT_EQ(gu.scale, rs ? 6.f / std::sqrt(4.f) : 1.5f);
    EXPECT_FLOAT_EQ(a.moe_slot(1, MoePart::Down).scale, rs ? 3.f / std::sqrt(2.f) : 1.5f);
    EXPECT_EQ(a.moe_slot(0, MoePart::Router).out, 4);
    for (int p = 0; p < kMoePartCount; ++p) {
      const MoeLoraSlot& s = a.moe_slot(0, MoePart(p));
      const float bound = 1.f / std::sqrt(float(s.in));
      float amax = 0, bmax = 0;
      for (int64_t i = 0; i < s.a_n(); ++i) amax = std::max(amax, std::fabs(s.A.as<float>()[i]));
      for (int64_t i = 0; i < s.b_n(); ++i) bmax = std::max(bmax, std::fabs(s.B.as<float>()[i]));
      EXPECT_LE(amax, bound) << p;
      EXPECT_GT(amax, 0.8f * bound) << p;
      EXPECT_EQ(bmax, 0.f) << p;
    }
  }
  auto refused = [&](const ModelShapes& m, LoraConfig cfg, int32_t status, const char* named) {
    try {
      LoraAdapter a(&tr, m, cfg);
      ADD_FAILURE() << named << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), status) << e.what();
      EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
    }
  };
  LoraConfig w1;
  w1.set_targets("q_proj,w1");
  refused(model->shapes, w1, QLFT_ERR_INVALID_ARGUMENT,
          "gate_proj (w1) without up_proj (w3) on mixtral's layer 0");
  LoraConfig drop;
  drop.set_targets("w2");
  drop.dropout = 0.1f;
  refused(model->shapes, drop, QLFT_ERR_UNSUPPORTED, "lora.dropout with LoRA on mixtral's experts");
  LoraConfig dora;
  dora.set_targets("q_proj,gate");
  dora.use_dora = true;
  refused(model->shapes, dora, QLFT_ERR_UNSUPPORTED, "lora.use_dora");
  auto dense = load_model(&tr, qlft_test::fixture_path("families/syn_qwen3"), keep());
  LoraConfig router;
  router.set_targets("q_proj,gate");
  refused(dense->shapes, router, QLFT_ERR_INVALID_ARGUMENT,
          "'gate' names a mixture-of-experts router");
}

// The fixture's batch and a Config of its LoRA (lora.target_modules targets) over its shape.
data::Batch fixture_batch(const Fixture& f) {
  data::Batch b;
  b.rows = b.micro_batch = 2;
  b.seq_len = 16;
  b.tokens = f.i32("tokens");
  b.targets = f.i32("targets");
  for (int32_t t : b.targets) b.trained_tokens += t != data::kIgnoreIndex;
  return b;
}
Config fixture_config(const Fixture& f, const std::string& targets) {
  Config c;
  c.set("lora.r", f.meta("r"));
  c.set("lora.alpha", f.meta("alpha"));
  c.set("lora.target_modules", targets);
  c.set("data.seq_len", "16");
  c.set("train.micro_batch", "2");
  return c;
}

// One Trainer step with the experts' and routers' LoRA (lora.target_modules with PEFT's names):
// its loss is PEFT's and the optimizer moved every expert / router factor.
TEST(MoeLora, TrainerStepUpdatesExpertFactors) {
  set_num_threads(1);
  const Fixture f = moe_lora_fixture();
  MemoryTracker tr;
  auto model = load_model(&tr, mixtral(), keep());
  const double loss = f.f32("loss")[0];
  Trainer t(*model, &tr, nullptr, parse_run_spec(fixture_config(f, f.meta("targets"))));
  load_moe_lora(f, t.lora());
  StepReport rep;
  t.step_on({fixture_batch(f)}, &rep);
  EXPECT_NEAR(rep.loss, loss, kTol * loss) << "PEFT's loss";
  for (const char* init : {"loftq", "pissa", "olora"}) {  // starts made for the projections only
    Config ci = fixture_config(f, f.meta("targets"));
    ci.set("lora.init", init);
    try {
      Trainer bad(*model, &tr, nullptr, parse_run_spec(ci));
      ADD_FAILURE() << init << " with expert LoRA was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), QLFT_ERR_UNSUPPORTED) << e.what();
      EXPECT_NE(std::string(e.what()).find("lora.init="), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("experts / router"), std::string::npos) << e.what();
    }
  }
  for (int l = 0; l < 2; ++l)
    for (int p = 0; p < kMoePartCount; ++p) {
      const std::vector<float> a = t.lora().get_moe_peft(l, MoePart(p), false),
                               a0 = f.f32(key(l, p, "A"));
      ASSERT_EQ(a.size(), a0.size());
      EXPECT_GT(max_rel_error(a.data(), a0.data(), a.size()), 1e-4) << key(l, p, "A");
    }
}

// The planner counts the experts' / routers' factors, their gradients and optimizer state
// exactly as the tracker measures a Trainer step, and the LoRA inputs moe_fwd keeps: the
// activations' growth over the attention-only adapter's, planned = measured. (The CPU plan of
// this MoE model's activations, weights and workspace themselves part from the tracker with or
// without expert LoRA: not this test's.)
TEST(MoeLora, PlannerMatchesTracker) {
  set_num_threads(1);
  const Fixture f = moe_lora_fixture();
  MemoryTracker tr;
  auto model = load_model(&tr, mixtral(), keep());
  const WeightFootprint w = weight_footprint(*model);
  int64_t base_planned = 0, base_measured = 0;
  for (const char* targets : {"q_proj,v_proj", "q_proj,v_proj,w1,w2,w3,gate", "w2,gate"}) {
    SCOPED_TRACE(targets);
    const Config c = fixture_config(f, targets);
    const MemoryPlan plan = plan_memory(model->cfg, w, PlanSettings::from_spec(parse_run_spec(c)));
    tr.reset_peaks();
    {
      Trainer t(*model, &tr, nullptr, parse_run_spec(c));
      StepReport rep;
      t.step_on({fixture_batch(f)}, &rep);
    }
    const MemorySnapshot m = tr.snapshot();
    for (int cat : {QLFT_MEM_ADAPTER, QLFT_MEM_GRADIENTS, QLFT_MEM_OPTIMIZER})
      EXPECT_EQ(plan.train[cat], m.peak[cat]) << mem_category_name(MemCategory(cat));
    const int64_t planned = int64_t(plan.train[QLFT_MEM_ACTIVATIONS]),
                  measured = int64_t(m.peak[QLFT_MEM_ACTIVATIONS]);
    if (!base_planned) base_planned = planned, base_measured = measured;
    EXPECT_EQ(planned - base_planned, measured - base_measured) << "activations' growth";
    std::printf("[moe_lora] %s: adapter %llu, activations planned %lld measured %lld\n", targets,
                (unsigned long long)plan.train[QLFT_MEM_ADAPTER], (long long)planned,
                (long long)measured);
  }
  EXPECT_GT(base_planned, 0);
}

// The PEFT adapter of the experts' / routers' LoRA: PEFT's own keys and adapter_config.json's
// target_parameters / rank_pattern / alpha_pattern (the fixture's save_pretrained), and the
// round trip through read_peft_config / load_peft_adapter gives back every factor.
TEST(MoeLora, PeftAdapterHasPeftsKeysAndRoundTrips) {
  for (const std::string family : {"mixtral", "qwen3_moe"}) {
    SCOPED_TRACE(family);
    FamilyAdapter fa(family);
    const std::string dir = qlft_test::temp_dir("moe_lora_peft") + "/adapter";
    save_peft_adapter(fa.lora, dir, "syn_mixtral");
    auto st = SafetensorsFile::open(dir + "/adapter_model.safetensors");
    std::vector<std::string> keys;
    for (const SafeTensorInfo& t : st->tensors()) keys.push_back(t.name);
    std::sort(keys.begin(), keys.end());
    std::string joined;
    for (const std::string& k : keys) joined += (joined.empty() ? "" : ",") + k;
    EXPECT_EQ(joined, fa.f.meta("peft_keys"));
    const nlohmann::json peft = nlohmann::json::parse(fa.f.meta("adapter_config"));
    const JsonFile j = JsonFile::load(dir + "/adapter_config.json");
    auto sorted = [](nlohmann::json v) {
      std::sort(v.begin(), v.end());
      return v;
    };
    EXPECT_EQ(sorted(j.root()["target_parameters"]), sorted(peft["target_parameters"]));
    EXPECT_EQ(sorted(j.root()["target_modules"]), sorted(peft["target_modules"]));
    EXPECT_EQ(j.root()["rank_pattern"], peft["rank_pattern"]);
    EXPECT_EQ(j.root()["alpha_pattern"], peft["alpha_pattern"]);

    LoraAdapter back(&fa.tr, fa.model->shapes, read_peft_config(dir));
    load_peft_adapter(back, dir);
    EXPECT_EQ(back.n_params(), fa.lora.n_params());
    for (int l = 0; l < back.n_layers(); ++l) {
      for (int p = 0; p < kMoePartCount; ++p)
        for (bool b : {false, true})
          if (fa.f.has(key(l, p, "A")))
            EXPECT_EQ(back.get_moe_peft(l, MoePart(p), b), fa.f.f32(key(l, p, b ? "B" : "A")))
                << key(l, p, b ? "B" : "A");
      for (Proj p : {Proj::Q, Proj::V})
        EXPECT_EQ(back.get_hf(l, p, LoraAdapter::Part::B),
                  fa.lora.get_hf(l, p, LoraAdapter::Part::B));
    }
  }
}

// The merged export folds scale B_e A_e into every expert (gate / up from the fused gate_up's
// rows) and the router: safetensors (f32) and GGUF (f16) reloaded give PEFT's merge_and_unload
// logits.
TEST(MoeLora, MergedExportMatchesPeftsMergeAndUnload) {
  set_num_threads(1);
  for (const std::string family : {"mixtral", "qwen3_moe"}) {
    SCOPED_TRACE(family);
    FamilyAdapter fa(family);
    const std::string dir = qlft_test::temp_dir("moe_lora_merged");
    std::vector<int32_t> tok = fa.f.i32("tokens");
    TokenBatch b;
    b.batch = 2;
    b.seq = 16;
    b.tokens = tok.data();
    const std::vector<float> ref = fa.f.f32("merged_logits");
    for (const auto& [path, format, tol] :
         {std::tuple<std::string, const char*, double>{dir + "/merged", "safetensors", 1e-4},
          {dir + "/merged.gguf", "gguf-f16", 4e-3}}) {
      SCOPED_TRACE(format);
      export_merged(*fa.model, &fa.lora, path, format);
      MemoryTracker t2;
      auto merged = load_model(&t2, path, keep());
      auto be = make_cpu_backend(&t2);
      LlamaRunner run(*merged, *be, nullptr);
      std::vector<float> logits(ref.size());
      run.logits(b, MatF(logits.data(), b.rows(), merged->cfg.vocab));
      const double e = max_rel_error(logits.data(), ref.data(), ref.size());
      std::printf("[moe_lora] merged %s %s vs merge_and_unload: %.2e\n", family.c_str(), format, e);
      EXPECT_LT(e, tol);
    }
  }
}
