// RoPE scaling (llama3, linear, dynamic NTK, yarn) against transformers
// (tests/reference/gen_rope_scaling_fixtures.py; regenerate with
// /opt/qlft-ref/bin/python tests/reference/gen_rope_scaling_fixtures.py):
//  - rope_freqs' table (inverse frequencies, cos / sin scale) equals the rotary module's;
//  - a tiny Llama of each variant gives transformers' logits over 72 tokens (the scaling
//    changes them by ~100%: the generator checks) and its greedy tokens on the CPU backend;
//  - the llama3 GGUF as llama.cpp's converter writes it (rope_freqs.weight) gives the same;
//  - merged exports keep the scaling: reloaded, they give transformers' logits again;
//  - the backend's rotation with a scaled table against a double oracle (forward, inverse);
//  - a LoRA adapter qlft trained on the llama3 model (peft_adapter/, written by WriteFixtures
//    below with QLFT_WRITE_ROPE_FIXTURES=1, then read by the generator's --peft stage with
//    PeftModel.from_pretrained) gives PEFT's logits when qlft loads it.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/error.h"
#include "formats/gguf.h"
#include "formats/json_file.h"
#include "model/rope_scaling.h"
#include "rope_scaling_util.h"
#include "config/config.h"
#include "data/batches.h"
#include "train/adapter_io.h"
#include "train/merge_export.h"
#include "train/trainer.h"

using namespace qlft;
using namespace rope_test;

namespace {

std::unique_ptr<Model> load(MemoryTracker* tr, const std::string& path) {
  return load_model(tr, path, model_test::keep());
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::fabs(double(a[i]) - double(b[i])) / std::fabs(double(b[i])));
  return m;
}

void expect_logits_and_greedy(const Model& m, const std::string& v, double tol = 1e-4) {
  MemoryTracker tr;
  auto be = make_cpu_backend(&tr);
  const std::vector<float> ours = logits_at_positions(m, *be);
  const std::vector<float> want = reference().f32(v + ".logits");
  ASSERT_EQ(ours.size(), want.size());
  const double err = qlft_test::max_rel_error(ours.data(), want.data(), want.size());
  std::printf("%s: logits vs transformers max rel error %.3g\n", v.c_str(), err);
  EXPECT_LT(err, tol);
  EXPECT_EQ(greedy(m, *be), reference().i32(v + ".greedy"));
}

Config peft_config() {
  Config c;
  c.set("lora.r", "4");
  c.set("lora.alpha", "8");
  c.set("lora.dropout", "0");
  c.set("lora.target_modules", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
  c.set("optim.name", "adamw");
  c.set("optim.lr", "1e-2");
  c.set("train.max_steps", "6");
  c.set("train.micro_batch", "1");
  c.set("train.precision", "fp32");
  c.set("seed", "43");
  return c;
}

}  // namespace

TEST(RopeScaling, TablesMatchTransformers) {
  const int64_t seq = int64_t(reference().i32("tokens").size());
  for (const char* v : kVariants) {
    SCOPED_TRACE(v);
    MemoryTracker tr;
    auto m = load(&tr, variant_dir(v));
    EXPECT_STREQ(rope_type_name(m->cfg.rope.type), v);
    const RopeFreqs f = rope_freqs(m->cfg, seq);
    const std::vector<float> want = reference().f32(std::string(v) + ".inv_freq");
    ASSERT_EQ(f.inv_freq.size(), want.size());
    // torch's vectorized pow may differ from libm's by an ulp or two.
    EXPECT_LT(max_rel_diff(f.inv_freq, want), 1e-6);
    EXPECT_NEAR(f.scale, reference().f32(std::string(v) + ".attention_scaling")[0], 1e-6);
    // Control: the table is not the unscaled one.
    EXPECT_GT(max_rel_diff(f.inv_freq, RopeFreqs::plain(m->cfg.rope_theta, 16).inv_freq), 0.1);
  }
  // Dynamic NTK keeps the plain table up to max_position_embeddings (32 here).
  MemoryTracker tr;
  auto d = load(&tr, variant_dir("dynamic"));
  EXPECT_TRUE(rope_freqs(d->cfg, 32) == RopeFreqs::plain(d->cfg.rope_theta, 16));
  EXPECT_FALSE(rope_freqs(d->cfg, 33) == RopeFreqs::plain(d->cfg.rope_theta, 16));
  // Its positions are meant to reach factor x max_position_embeddings (generation's default cap).
  EXPECT_EQ(rope_context_length(d->cfg), 64);
  EXPECT_EQ(rope_context_length(load(&tr, variant_dir("llama3"))->cfg), 128);
}

TEST(RopeScaling, LogitsAndGreedyMatchTransformers) {
  for (const char* v : kVariants) {
    SCOPED_TRACE(v);
    MemoryTracker tr;
    auto m = load(&tr, variant_dir(v));
    expect_logits_and_greedy(*m, v);
  }
}

// llama.cpp's form of llama3 scaling: per-frequency divisors in rope_freqs.weight (computed by
// the converter in float64 from the same parameters, so the table agrees to rounding).
TEST(RopeScaling, Llama3GgufWithRopeFreqsMatchesTransformers) {
  MemoryTracker tr;
  auto m = load(&tr, fixture("llama3.gguf"));
  ASSERT_EQ(m->cfg.rope.freq_divisors.size(), 8u);
  EXPECT_TRUE(m->cfg.rope_adjacent);
  const RopeFreqs f = rope_freqs(m->cfg, 72);
  EXPECT_LT(max_rel_diff(f.inv_freq, reference().f32("llama3.inv_freq")), 1e-5);
  expect_logits_and_greedy(*m, "llama3");
}

// Merged exports write the scaling (config.json rope_parameters and the legacy rope_scaling; GGUF
// rope.scaling.* keys, rope_freqs.weight where the source had it) and load back to the same model.
TEST(RopeScaling, MergedExportsKeepTheScaling) {
  for (const char* v : kVariants) {
    SCOPED_TRACE(v);
    MemoryTracker tr;
    auto m = load(&tr, variant_dir(v));
    const std::string hf = qlft_test::temp_dir(std::string("rope_merged_hf_") + v);
    export_merged(*m, nullptr, hf, "safetensors");
    JsonFile cj = JsonFile::load(hf + "/config.json");
    EXPECT_EQ(cj.root()["rope_parameters"]["rope_type"], v) << cj.root().dump();
    EXPECT_EQ(cj.root()["rope_scaling"]["rope_type"], v);
    auto back = load(&tr, hf);
    EXPECT_TRUE(rope_freqs(back->cfg, 72) == rope_freqs(m->cfg, 72));
    expect_logits_and_greedy(*back, v);

    const std::string gg = qlft_test::temp_dir(std::string("rope_merged_gguf_") + v) + "/m.gguf";
    if (std::string(v) == "dynamic") {  // llama.cpp has no dynamic NTK: refused, not dropped
      try {
        export_merged(*m, nullptr, gg, "gguf-f16");
        ADD_FAILURE() << "a dynamic-NTK model exported to GGUF";
      } catch (const Error& e) {
        EXPECT_EQ(e.status(), QLFT_ERR_UNSUPPORTED);
        EXPECT_NE(std::string(e.what()).find("dynamic"), std::string::npos) << e.what();
      }
      continue;
    }
    export_merged(*m, nullptr, gg, "gguf-f16");
    auto g = load(&tr, gg);
    EXPECT_LT(max_rel_diff(rope_freqs(g->cfg, 72).inv_freq, rope_freqs(m->cfg, 72).inv_freq), 1e-6);
    EXPECT_NEAR(rope_freqs(g->cfg, 72).scale, rope_freqs(m->cfg, 72).scale, 1e-6);
    expect_logits_and_greedy(*g, v);
  }
  // The llama3 GGUF's rope_freqs.weight is written again by its GGUF export.
  MemoryTracker tr;
  auto m = load(&tr, fixture("llama3.gguf"));
  const std::string gg = qlft_test::temp_dir("rope_merged_gguf_freqs") + "/m.gguf";
  export_merged(*m, nullptr, gg, "gguf-f16");
  auto g = load(&tr, gg);
  EXPECT_EQ(g->cfg.rope.freq_divisors, m->cfg.rope.freq_divisors);
  // ... and has no transformers config: the safetensors export refuses it, writing nothing.
  const std::string hf = qlft_test::temp_dir("rope_merged_hf_freqs") + "/out";
  EXPECT_THROW(export_merged(*m, nullptr, hf, "safetensors"), Error);
  struct stat st;
  EXPECT_NE(stat(hf.c_str(), &st), 0) << hf << " was created";
}

// The backend's rotation with a scaled table (other frequencies, a cos / sin factor) against a
// double oracle, and its inverse as the transpose (the backward of a scaled rotation).
TEST(RopeScaling, BackendRotatesWithTheTableAndScale) {
  MemoryTracker tr;
  auto be = make_cpu_backend(&tr);
  const int M = 9, heads = 2, hd = 8, cols = heads * hd;
  RopeFreqs f = RopeFreqs::plain(10000.f, hd);
  for (size_t i = 0; i < f.inv_freq.size(); ++i) f.inv_freq[i] *= 0.3f + 0.2f * float(i);
  f.scale = 1.3f;
  std::vector<int32_t> pos(M);
  for (int i = 0; i < M; ++i) pos[size_t(i)] = 7 * i;
  for (bool adjacent : {false, true}) {
    std::vector<float> x(size_t(M) * cols);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * float(i)) + 0.1f;
    std::vector<float> y = x;
    be->rope(MatF(y.data(), M, cols), pos.data(), heads, hd, f, adjacent, false);
    double err = 0;
    for (int r = 0; r < M; ++r)
      for (int h = 0; h < heads; ++h)
        for (int i = 0; i < hd / 2; ++i) {
          const int a = adjacent ? 2 * i : i, b = adjacent ? 2 * i + 1 : i + hd / 2;
          const double ang = double(pos[size_t(r)]) * double(f.inv_freq[size_t(i)]);
          const double xa = x[size_t(r * cols + h * hd + a)], xb = x[size_t(r * cols + h * hd + b)];
          const double ya = f.scale * (xa * std::cos(ang) - xb * std::sin(ang));
          const double yb = f.scale * (xb * std::cos(ang) + xa * std::sin(ang));
          err = std::max({err, std::fabs(ya - y[size_t(r * cols + h * hd + a)]),
                          std::fabs(yb - y[size_t(r * cols + h * hd + b)])});
        }
    EXPECT_LT(err, 1e-5) << adjacent;
    // inverse(forward(x)) = scale^2 x: the transpose of s R is s R^T.
    be->rope(MatF(y.data(), M, cols), pos.data(), heads, hd, f, adjacent, true);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], 1.69f * x[i], 1e-5) << i;
  }
  // A table of another head size is refused.
  std::vector<float> y(size_t(M) * cols);
  EXPECT_THROW(be->rope(MatF(y.data(), M, cols), pos.data(), heads, hd, RopeFreqs::plain(1e4f, 4),
                        false, false),
               Error);
}

// config.json scaling that is malformed is refused naming the file and key.
TEST(RopeScaling, ConfigErrorsNameTheKey) {
  nlohmann::json cfg = {
      {"max_position_embeddings", 32},
      {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}, {"truncate", 1}}}};
  try {
    rope_scaling_from_hf(cfg, "x/config.json", 32);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rope_scaling.truncate"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("x/config.json"), std::string::npos) << e.what();
  }
  cfg["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 4.0},
                         {"high_freq_factor", 1.0}};
  EXPECT_THROW(rope_scaling_from_hf(cfg, "x/config.json", 32), Error);
  // transformers takes rope_scaling over rope_parameters when both are present.
  cfg["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  cfg["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_EQ(rope_scaling_from_hf(cfg, "x/config.json", 32).type, RopeType::Linear);
  // yarn's attention factor from mscale / mscale_all_dim (transformers' get_mscale ratio); a 0
  // is "absent" there, leaving 0.1 ln(factor) + 1.
  nlohmann::json y = {
      {"rope_scaling",
       {{"rope_type", "yarn"}, {"factor", 4.0}, {"mscale", 1.0}, {"mscale_all_dim", 0.5}}}};
  const double l4 = std::log(4.0);
  EXPECT_NEAR(rope_attention_factor(rope_scaling_from_hf(y, "x", 32)),
              (0.1 * l4 + 1) / (0.05 * l4 + 1), 1e-6);
  y["rope_scaling"]["mscale_all_dim"] = 0;
  EXPECT_NEAR(rope_attention_factor(rope_scaling_from_hf(y, "x", 32)), 0.1 * l4 + 1, 1e-6);
}

// Trains the adapter the PEFT comparison uses: 6 AdamW steps on the fixture's 72 tokens (next-token
// targets) of the llama3 model, whose scaled RoPE forward and backward the steps run through.
TEST(RopeScaling, WriteFixtures) {
  if (!std::getenv("QLFT_WRITE_ROPE_FIXTURES"))
    QLFT_SKIP("fixture-writer") << "QLFT_WRITE_ROPE_FIXTURES unset";
  MemoryTracker tr;
  auto m = load(&tr, variant_dir("llama3"));
  Trainer t(*m, &tr, nullptr, qlft::parse_run_spec(peft_config()));
  const std::vector<int32_t> tok = reference().i32("tokens");
  const int seq = static_cast<int>(tok.size()) - 1;
  for (int s = 0; s < 6; ++s) {
    std::vector<data::Batch> b(1);
    b[0].micro_batch = b[0].rows = 1;
    b[0].seq_len = seq;
    b[0].tokens.assign(tok.begin(), tok.end() - 1);
    b[0].targets.assign(tok.begin() + 1, tok.end());
    b[0].trained_tokens = seq;
    StepReport r;
    t.step_on(b, &r);
    ASSERT_FALSE(r.skipped);
    std::printf("step %d loss %.5f\n", s + 1, r.loss);
  }
  save_peft_adapter(t.lora(), fixture("peft_adapter"), "qlft-rope-scaling-llama3");
}

TEST(RopeScaling, AdapterTrainedByQlftGivesPeftLogits) {
  MemoryTracker tr;
  auto m = load(&tr, variant_dir("llama3"));
  const std::string dir = fixture("peft_adapter");
  LoraAdapter lora(&tr, m->shapes, read_peft_config(dir));
  load_peft_adapter(lora, dir);
  const model_test::Fixture peft(fixture("peft.safetensors"));
  auto be = make_cpu_backend(&tr);
  const std::vector<float> ours = logits_at_positions(*m, *be, &lora);
  const std::vector<float> want = peft.f32("peft_logits");
  ASSERT_EQ(ours.size(), want.size());
  const double err = qlft_test::max_rel_error(ours.data(), want.data(), want.size());
  std::printf("logits with the adapter vs PeftModel.from_pretrained: max rel error %.3g\n", err);
  EXPECT_LT(err, 1e-4);
  // Control: the adapter changes the model (so this is no base-model comparison).
  const std::vector<float> base = peft.f32("base_logits");
  EXPECT_GT(qlft_test::max_rel_error(base.data(), want.data(), want.size()), 1e-2);
}

// Phi-3's LongRoPE (config_longrope.json: original 32, max_position_embeddings 128, head_dim 16;
// gen_rope_scaling_fixtures.py --longrope): the table of a 32-token call (short_factor) and of a
// 72-token call (long_factor), the cos / sin factor sqrt(1 + ln 4 / ln 32) and the last
// position's cos against transformers' Phi3RotaryEmbedding; bad lists refused naming the key;
// the merged export's rope_scaling read back gives the same tables.
TEST(RopeScaling, LongRopeMatchesTransformersPhi3) {
  JsonFile cj = JsonFile::load(fixture("config_longrope.json"));
  const ModelConfig c = read_hf_config(cj, "", nullptr);
  EXPECT_EQ(c.arch, "phi3");
  EXPECT_STREQ(rope_type_name(c.rope.type), "longrope");
  EXPECT_TRUE(rope_varies(c.rope));
  const model_test::Fixture ref(fixture("longrope.safetensors"));
  for (auto [name, seq] : {std::pair{"short", 32}, std::pair{"long", 72}}) {
    SCOPED_TRACE(name);
    const RopeFreqs f = rope_freqs(c, seq);
    const std::vector<float> want = ref.f32(std::string(name) + ".inv_freq");
    ASSERT_EQ(f.inv_freq.size(), want.size());
    EXPECT_LT(max_rel_diff(f.inv_freq, want), 1e-6);
    EXPECT_NEAR(f.scale, ref.f32(std::string(name) + ".attention_scaling")[0], 1e-6);
    const std::vector<float> cos_last = ref.f32(std::string(name) + ".cos_last");  // [16]
    for (size_t i = 0; i < f.inv_freq.size(); ++i) {
      const float ang = float(seq - 1) * f.inv_freq[i];
      EXPECT_NEAR(std::cos(ang) * f.scale, cos_last[i], 2e-5) << i;
      EXPECT_NEAR(std::cos(ang) * f.scale, cos_last[i + 8], 2e-5) << i;
    }
  }
  EXPECT_NEAR(rope_attention_factor(c.rope), std::sqrt(1 + std::log(4.0) / std::log(32.0)), 1e-12);
  EXPECT_FALSE(rope_freqs(c, 32) == rope_freqs(c, 33));  // the long factors past 32

  nlohmann::json j = cj.root();
  j["rope_parameters"]["long_factor"] = {1.0, 2.0};
  try {
    read_hf_config(JsonFile::parse(j.dump(), "x/config.json"), "", nullptr);
    ADD_FAILURE() << "2 long factors accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("short_factor has 8 values, long_factor 2"),
              std::string::npos)
        << e.what();
  }
  j["rope_parameters"].erase("long_factor");
  try {
    rope_scaling_from_hf(j, "x/config.json", 128);
    ADD_FAILURE() << "no long_factor accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("long_factor"), std::string::npos) << e.what();
  }
  // What the merged export writes (rope_scaling + the root's original length) reads back the same.
  nlohmann::json back = {{"rope_scaling", rope_scaling_json(c)},
                         {"original_max_position_embeddings", c.rope.original_context}};
  ModelConfig c2 = c;
  c2.rope = rope_scaling_from_hf(back, "export", c.context_length);
  for (int seq : {32, 72}) EXPECT_TRUE(rope_freqs(c2, seq) == rope_freqs(c, seq)) << seq;
}

// A whole Phi-3 with LongRoPE (the synthetic syn_phi3's weights, config_longrope_phi3.json:
// original 32, max 128): qlft's logits of a 72-token call (long factors) and of its first 24
// tokens (short factors) against transformers' (gen_rope_scaling_fixtures.py --longrope).
// The 72-token call (long factors) and its first 24 tokens (short factors) against transformers;
// the control: the 72-token call rotated with the short factors is not transformers' call.
static void expect_longrope_phi3_logits(Model& m) {
  ASSERT_EQ(m.cfg.rope.type, RopeType::LongRope);
  MemoryTracker tr;
  auto be = make_cpu_backend(&tr);
  const model_test::Fixture ref(fixture("longrope_phi3.safetensors"));
  std::vector<int32_t> tok = ref.i32("tokens");
  auto logits = [&](int n) {
    TokenBatch b;
    b.batch = 1;
    b.seq = n;
    b.tokens = tok.data();
    LlamaRunner run(m, *be, nullptr);
    std::vector<float> out(size_t(n) * 160);
    run.logits(b, MatF(out.data(), n, 160));
    return out;
  };
  for (auto [name, n] : {std::pair{"long_logits", 72}, std::pair{"short_logits", 24}}) {
    SCOPED_TRACE(name);
    const std::vector<float> out = logits(n), want = ref.f32(name);
    ASSERT_EQ(out.size(), want.size());
    const double err = qlft_test::max_rel_error(out.data(), want.data(), want.size());
    std::printf("longrope phi3 %s: max rel error %.3g\n", name, err);
    EXPECT_LT(err, 1e-4);
  }
  const std::vector<float> kept = m.cfg.rope.long_factor;
  m.cfg.rope.long_factor = m.cfg.rope.short_factor;
  const std::vector<float> out = logits(72), want = ref.f32("long_logits");
  m.cfg.rope.long_factor = kept;
  EXPECT_GT(qlft_test::max_rel_error(out.data(), want.data(), want.size()), 1e-2);
}

TEST(RopeScaling, LongRopePhi3LogitsMatchTransformers) {
  const std::string dir = qlft_test::temp_dir("longrope_phi3");
  const std::vector<uint8_t> cfg = qlft_test::read_file(fixture("config_longrope_phi3.json"));
  qlft_test::write_file(dir + "/config.json", cfg.data(), cfg.size());
  const std::vector<uint8_t> st =
      qlft_test::read_file(qlft_test::fixture_path("families/syn_phi3/model.safetensors"));
  qlft_test::write_file(dir + "/model.safetensors", st.data(), st.size());
  MemoryTracker tr;
  auto m = load(&tr, dir);
  expect_longrope_phi3_logits(*m);
  // The merged GGUF in llama.cpp's form: the factors as the gguf-py fixture's tensors, the
  // original length and attention factor as its keys; reloaded, transformers' logits again.
  export_merged(*m, nullptr, dir + "/m.gguf", "gguf-f16");
  auto ours = GgufFile::open(dir + "/m.gguf");
  auto ref = GgufFile::open(fixture("longrope_phi3.gguf"));
  for (const char* n : {"rope_factors_long.weight", "rope_factors_short.weight"}) {
    ASSERT_TRUE(ours->find_tensor(n)) << n;
    EXPECT_EQ(ours->find_tensor(n)->type, ref->find_tensor(n)->type) << n;
    EXPECT_EQ(ours->find_tensor(n)->ne[0], ref->find_tensor(n)->ne[0]) << n;
  }
  for (const char* k : {"phi3.rope.scaling.original_context_length", "phi3.context_length"})
    EXPECT_EQ(ours->get_int(k, -1), ref->get_int(k, -2)) << k;
  const char* attn = "phi3.rope.scaling.attn_factor";
  EXPECT_NEAR(ours->get_float(attn, -1), ref->get_float(attn, -2), 1e-6);
  EXPECT_FALSE(ours->find("phi3.rope.scaling.type"));
  auto back = load(&tr, dir + "/m.gguf");
  expect_longrope_phi3_logits(*back);
}

// llama.cpp's form of the same model (gguf-py, Phi3MiniModel's names): rope_factors_long /
// rope_factors_short.weight, phi3.rope.scaling.original_context_length and attn_factor.
TEST(RopeScaling, LongRopePhi3GgufMatchesTransformers) {
  MemoryTracker tr;
  auto m = load(&tr, fixture("longrope_phi3.gguf"));
  EXPECT_EQ(m->cfg.rope.original_context, 32);
  EXPECT_NEAR(m->cfg.rope.factor, 4.0, 1e-12);
  EXPECT_EQ(m->cfg.rope.long_factor, (std::vector<float>{1.0f, 2.5f, 6.0f, 12.0f}));
  expect_longrope_phi3_logits(*m);
}
