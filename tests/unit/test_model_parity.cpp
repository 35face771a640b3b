// Forward/backward parity with transformers + PEFT (fp32): logits, loss and every LoRA gradient
// of stories260K (GGUF, adjacent-pair RoPE rows) and of two synthetic models (qwen2 with biases,
// tied embeddings and rsLoRA on a subset of targets; llama with an untied head), each loaded
// from safetensors and from GGUF. References: tests/reference/gen_model_fixtures.py.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>

#include "test_model_util.h"

using namespace qlft;
using namespace model_test;
using qlft_test::max_rel_error;

namespace {

constexpr double kTol = 1e-4;

// Checks logits, loss and all LoRA gradients of model_path against the fixture; returns the
// logits so callers can compare two loads of one model.
std::vector<float> check_parity(const std::string& model_path, const std::string& fixture_name) {
  SCOPED_TRACE(model_path);
  MemoryTracker tr;
  auto model = load_model(&tr, model_path, keep());
  Fixture f(model_fixture(fixture_name));
  auto be = make_cpu_backend(&tr);
  LoraAdapter lora(&tr, model->shapes, lora_config_of(f));
  load_lora(f, lora);
  LlamaRunner run(*model, *be, &lora);

  std::vector<int32_t> tok = f.i32("tokens"), tgt = f.i32("targets");
  auto shp = f.shape("tokens");
  TokenBatch b;
  b.batch = static_cast<int>(shp[0]);
  b.seq = static_cast<int>(shp[1]);
  b.tokens = tok.data();
  b.targets = tgt.data();
  const int V = model->cfg.vocab;
  std::vector<float> logits(b.rows() * V);
  LossResult lr = run.logits(b, MatF(logits.data(), b.rows(), V));
  std::vector<float> ref = f.f32("logits");
  EXPECT_EQ(ref.size(), logits.size());
  EXPECT_LT(max_rel_error(logits.data(), ref.data(), ref.size()), kTol) << "logits";

  const double loss_ref = f.f32("loss")[0];
  EXPECT_NEAR(lr.mean(), loss_ref, kTol * std::fabs(loss_ref)) << "eval loss";
  LossResult r = run.forward(b);
  EXPECT_NEAR(r.mean(), loss_ref, kTol * std::fabs(loss_ref)) << "training loss";
  int64_t expect_count = 0;
  for (int32_t t : tgt) expect_count += t != kIgnoreIndex;
  EXPECT_EQ(r.count, expect_count);
  run.backward();

  int n = 0;
  double worst = 0;
  for (int l = 0; l < model->cfg.n_layers; ++l)
    for (int p = 0; p < kProjCount; ++p) {
      std::string k = "l" + std::to_string(l) + "." + proj_peft_name(static_cast<Proj>(p)) + ".";
      if (!f.has(k + "gA")) {
        EXPECT_FALSE(lora.slot(l, static_cast<Proj>(p)).active()) << k;
        continue;
      }
      for (auto [part, name] :
           {std::pair{LoraAdapter::Part::dA, "gA"}, std::pair{LoraAdapter::Part::dB, "gB"}}) {
        std::vector<float> g = lora.get_hf(l, static_cast<Proj>(p), part), gr = f.f32(k + name);
        EXPECT_EQ(g.size(), gr.size()) << k << name;
        if (g.size() != gr.size()) continue;
        double e = max_rel_error(g.data(), gr.data(), g.size());
        EXPECT_LT(e, kTol) << k << name;
        worst = std::max(worst, e);
        ++n;
      }
    }
  EXPECT_GT(n, 0);
  std::printf("[parity] %s: %d LoRA gradients, worst normalized error %.2e\n", fixture_name.c_str(),
              n, worst);
  return logits;
}

}  // namespace

TEST(ModelParity, Stories260kGguf) {
  QLFT_NEED_SHARED(path, "models/stories260K.gguf");
  check_parity(path, "stories260k.safetensors");
}

TEST(ModelParity, SynQwen2SafetensorsAndGguf) {
  auto a = check_parity(model_fixture("syn_qwen2"), "syn_qwen2.lora.safetensors");
  auto b = check_parity(model_fixture("syn_qwen2.gguf"), "syn_qwen2.lora.safetensors");
  ASSERT_EQ(a.size(), b.size());
  EXPECT_LT(max_rel_error(b.data(), a.data(), a.size()), 1e-5) << "GGUF vs safetensors logits";
}

TEST(ModelParity, SynLlamaSafetensorsAndPermutedGguf) {
  auto a = check_parity(model_fixture("syn_llama"), "syn_llama.lora.safetensors");
  auto b = check_parity(model_fixture("syn_llama.gguf"), "syn_llama.lora.safetensors");
  ASSERT_EQ(a.size(), b.size());
  EXPECT_LT(max_rel_error(b.data(), a.data(), a.size()), 1e-5) << "GGUF vs safetensors logits";
}

// The base model alone (no adapter) against the reference's base logits.
TEST(ModelParity, BaseLogitsWithoutAdapter) {
  for (const char* name : {"syn_qwen2", "syn_llama"}) {
    SCOPED_TRACE(name);
    MemoryTracker tr;
    auto model = load_model(&tr, model_fixture(name), keep());
    Fixture f(model_fixture(std::string(name) + ".lora.safetensors"));
    auto be = make_cpu_backend(&tr);
    LlamaRunner run(*model, *be, nullptr);
    std::vector<int32_t> tok = f.i32("tokens");
    TokenBatch b;
    b.batch = 2;
    b.seq = static_cast<int>(tok.size() / 2);
    b.tokens = tok.data();
    std::vector<float> logits(b.rows() * model->cfg.vocab);
    run.logits(b, MatF(logits.data(), b.rows(), model->cfg.vocab));
    std::vector<float> ref = f.f32("base_logits");
    EXPECT_LT(max_rel_error(logits.data(), ref.data(), ref.size()), kTol);
  }
}

// transformers >= 5 writes rope_parameters.rope_theta instead of rope_theta: same model.
TEST(ModelParity, RopeThetaFromRopeParameters) {
  std::string dir = qlft_test::temp_dir("rope_parameters");
  auto cfg = nlohmann::json::parse([] {
    auto b = qlft_test::read_file(model_fixture("syn_qwen2/config.json"));
    return std::string(b.begin(), b.end());
  }());
  ASSERT_TRUE(cfg.contains("rope_parameters"));
  cfg.erase("rope_theta");
  std::string text = cfg.dump();
  qlft_test::write_file(dir + "/config.json", text.data(), text.size());
  auto st = qlft_test::read_file(model_fixture("syn_qwen2/model.safetensors"));
  qlft_test::write_file(dir + "/model.safetensors", st.data(), st.size());
  MemoryTracker tr;
  auto model = load_model(&tr, dir, keep());
  EXPECT_EQ(model->cfg.rope_theta, 1000000.f);
}

// RoPE scaling a model asks for is read (model/rope_scaling.h; its arithmetic is checked against
// transformers in test_rope_scaling); what qlft cannot honour is refused naming the file and key,
// never trained with other frequencies than the model's.
TEST(ModelParity, RopeScalingIsReadOrRefused) {
  auto base = nlohmann::json::parse([] {
    auto b = qlft_test::read_file(model_fixture("syn_llama/config.json"));
    return std::string(b.begin(), b.end());
  }());
  auto st = qlft_test::read_file(model_fixture("syn_llama/model.safetensors"));
  struct Case {
    const char* name;
    std::function<void(nlohmann::json&)> edit;
    const char* key;  // expected in the message; nullptr: loads fine
    int32_t status = QLFT_ERR_UNSUPPORTED;
  };
  const Case cases[] = {
      // LongRoPE loads with its factor lists (RopeScaling.LongRope*); without them it is refused
      // naming the list, under either spelling of the scaling block.
      {"longrope",
       [](nlohmann::json& c) {
         c["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 8.0}};
       },
       "rope_scaling.short_factor", QLFT_ERR_FORMAT},
      {"su_v5", [](nlohmann::json& c) { c["rope_parameters"]["rope_type"] = "su"; },
       "rope_parameters.short_factor", QLFT_ERR_FORMAT},
      // A scaling qlft does not implement (Qwen2-VL's multimodal RoPE) is refused by its type.
      {"mrope",
       [](nlohmann::json& c) {
         c["rope_scaling"] = {{"type", "mrope"}, {"mrope_section", {16, 24, 24}}};
       },
       "rope_scaling.rope_type"},
      {"llama3_without_low_freq_factor",
       [](nlohmann::json& c) {
         c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"high_freq_factor", 4.0}};
       },
       "rope_scaling.low_freq_factor", QLFT_ERR_FORMAT},
      {"linear_negative_factor",
       [](nlohmann::json& c) {
         c["rope_scaling"] = {{"type", "linear"}, {"factor", -2.0}};
       },
       "rope_scaling.factor", QLFT_ERR_FORMAT},
      {"partial_rotary", [](nlohmann::json& c) { c["partial_rotary_factor"] = 0.5; },
       "partial_rotary_factor"},
      {"linear_v4",
       [](nlohmann::json& c) {
         c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
       },
       nullptr},
      {"null_scaling", [](nlohmann::json& c) { c["rope_scaling"] = nullptr; }, nullptr},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    std::string dir = qlft_test::temp_dir(std::string("rope_scaling_") + k.name);
    nlohmann::json cfg = base;
    k.edit(cfg);
    std::string text = cfg.dump();
    qlft_test::write_file(dir + "/config.json", text.data(), text.size());
    qlft_test::write_file(dir + "/model.safetensors", st.data(), st.size());
    MemoryTracker tr;
    if (!k.key) {
      EXPECT_NO_THROW(load_model(&tr, dir, keep()));
      continue;
    }
    try {
      load_model(&tr, dir, keep());
      ADD_FAILURE() << "loaded a model with RoPE scaling it cannot honour";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), k.status);
      EXPECT_NE(std::string(e.what()).find(k.key), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos) << e.what();
    }
    EXPECT_EQ(tr.total_reserved(), 0u);
  }
}
