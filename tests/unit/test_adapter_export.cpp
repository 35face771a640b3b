// Adapter and merged-model exports against the ecosystem (fixtures of
// tests/reference/gen_train_fixtures.py):
//  - the committed peft_adapter/, adapter.gguf, adapter_rslora.gguf and merged/ are what our code
//    writes today (re-export is byte-identical), and the script loaded exactly those files with
//    PeftModel.from_pretrained, the gguf package (llama.cpp loader rules) and transformers;
//  - our logits with the adapter equal PEFT's; PEFT import round-trips and rejects bad dirs;
//  - merged models (safetensors, GGUF F16/BF16) load back with the logits of base + adapter.
//
// Regenerate the committed files (then rerun the script): QLFT_WRITE_TRAIN_FIXTURES=1
// test_adapter_export --gtest_filter=*WriteFixtures*
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "core/threads.h"
#include "formats/gguf.h"
#include "formats/safetensors_writer.h"
#include "qlft.h"
#include "support/test_support.h"
#include "test_model_util.h"
#include "train/adapter_io.h"
#include "train/merge_export.h"

using namespace qlft;
using model_test::Fixture;

namespace {

std::string train_fixture(const std::string& rel) {
  return qlft_test::fixture_path("train/" + rel);
}

// A portable deterministic stream (std:: distributions differ between standard libraries).
struct SplitMix {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>(next() >> 40) / 16777216.0f * 2.f - 1.f; }
};

LoraConfig export_config(bool rslora) {
  LoraConfig c;
  c.r = 4;
  c.alpha = 8;
  c.use_rslora = rslora;
  c.set_targets("q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
  return c;
}

// The committed adapter: PEFT init of A from seed 11, B nonzero from a fixed stream (HF order).
void fill_adapter(LoraAdapter& a) {
  a.init(11);
  SplitMix rng{12345};
  for (int l = 0; l < a.n_layers(); ++l)
    for (int p = 0; p < kProjCount; ++p) {
      Proj pr = static_cast<Proj>(p);
      std::vector<float> A = a.get_hf(l, pr, LoraAdapter::Part::A);
      std::vector<float> B(static_cast<size_t>(a.slot(l, pr).out) * a.config().r);
      for (float& x : B) x = 0.05f * rng.uniform();
      a.set_hf(l, pr, A.data(), A.size(), B.data(), B.size());
    }
}

std::vector<float> all_weights(LoraAdapter& a) {
  std::vector<float> w;
  for (const LoraAdapter::Param& p : a.params()) w.insert(w.end(), p.w, p.w + p.n);
  return w;
}

std::vector<float> logits_of(const Model& m, LoraAdapter* lora, const std::vector<int32_t>& tok,
                             int batch, MemoryTracker* tracker) {
  auto be = make_cpu_backend(tracker);
  LlamaRunner run(m, *be, lora);
  TokenBatch b;
  b.batch = batch;
  b.seq = static_cast<int>(tok.size()) / batch;
  b.tokens = tok.data();
  std::vector<float> out(static_cast<size_t>(b.rows()) * m.cfg.vocab);
  run.logits(b, MatF(out.data(), b.rows(), m.cfg.vocab));
  return out;
}

void expect_same_file(const std::string& ours, const std::string& committed) {
  std::vector<uint8_t> a = qlft_test::read_file(ours), b = qlft_test::read_file(committed);
  EXPECT_GT(b.size(), 0u) << committed;
  EXPECT_TRUE(a == b) << ours << " differs from the committed " << committed << " (" << a.size()
                      << " vs " << b.size() << " bytes)";
}

nlohmann::json checks() {
  std::ifstream f(train_fixture("export_checks.json"));
  nlohmann::json j;
  f >> j;
  return j;
}

class AdapterExport : public ::testing::Test {
 protected:
  void SetUp() override {
    set_num_threads(1);  // tiny model: threads only add barrier waits
    QLFT_NEED_SHARED(path, "models/stories260K.gguf");
    model = load_model(&tracker, path, model_test::keep());
    lora = std::make_unique<LoraAdapter>(&tracker, model->shapes, export_config(false));
    fill_adapter(*lora);
  }
  MemoryTracker tracker;
  std::unique_ptr<Model> model;
  std::unique_ptr<LoraAdapter> lora;
};

}  // namespace

TEST_F(AdapterExport, WriteFixtures) {
  if (!std::getenv("QLFT_WRITE_TRAIN_FIXTURES"))
    QLFT_SKIP("fixture-writer") << "QLFT_WRITE_TRAIN_FIXTURES unset";
  save_peft_adapter(*lora, train_fixture("peft_adapter"), "stories260K");
  save_gguf_lora_adapter(*lora, train_fixture("adapter.gguf"));
  LoraAdapter rs(&tracker, model->shapes, export_config(true));
  fill_adapter(rs);
  save_gguf_lora_adapter(rs, train_fixture("adapter_rslora.gguf"));
  export_merged(*model, lora.get(), train_fixture("merged"), "safetensors");
}

TEST_F(AdapterExport, PeftExportIsTheCommittedOne) {
  std::string dir = qlft_test::temp_dir("peft_export");
  save_peft_adapter(*lora, dir, "stories260K");
  expect_same_file(dir + "/adapter_model.safetensors",
                   train_fixture("peft_adapter/adapter_model.safetensors"));
  expect_same_file(dir + "/adapter_config.json", train_fixture("peft_adapter/adapter_config.json"));
  // The script loaded exactly these files with PeftModel.from_pretrained and the adapter changed
  // the logits (so the logits comparison below is not a base-model comparison).
  EXPECT_TRUE(checks()["peft_load"]["ok"].get<bool>());
}

TEST_F(AdapterExport, LogitsMatchPeftFromPretrained) {
  Fixture fx(train_fixture("export.safetensors"));
  std::vector<int32_t> tok = fx.i32("tokens");
  std::vector<float> ours = logits_of(*model, lora.get(), tok, 2, &tracker);
  std::vector<float> peft = fx.f32("peft_logits");
  ASSERT_EQ(ours.size(), peft.size());
  double err = qlft_test::max_rel_error(ours.data(), peft.data(), ours.size());
  std::printf("logits vs PeftModel.from_pretrained: max rel error %.3g\n", err);
  EXPECT_LT(err, 1e-4);
  // Control: without the adapter we match the base logits, and they are far from PEFT's.
  std::vector<float> base = logits_of(*model, nullptr, tok, 2, &tracker);
  std::vector<float> base_ref = fx.f32("base_logits");
  EXPECT_LT(qlft_test::max_rel_error(base.data(), base_ref.data(), base.size()), 1e-4);
  EXPECT_GT(qlft_test::max_rel_error(base.data(), peft.data(), base.size()), 1e-3);
}

TEST_F(AdapterExport, PeftImportRoundTripsExactly) {
  LoraAdapter b(&tracker, model->shapes, export_config(false));
  b.init(99);
  load_peft_adapter(b, train_fixture("peft_adapter"));
  EXPECT_TRUE(all_weights(b) == all_weights(*lora));
  LoraConfig rc = read_peft_config(train_fixture("peft_adapter"));
  EXPECT_EQ(rc.r, 4);
  EXPECT_EQ(rc.alpha, 8.f);
  EXPECT_EQ(rc.targets_string(), export_config(false).targets_string());
}

TEST_F(AdapterExport, PeftImportRejectsBadDirectories) {
  auto src = SafetensorsFile::open(train_fixture("peft_adapter/adapter_model.safetensors"));
  const std::string cfg_text = [] {
    std::vector<uint8_t> v =
        qlft_test::read_file(train_fixture("peft_adapter/adapter_config.json"));
    return std::string(v.begin(), v.end());
  }();
  const std::string victim = "base_model.model.model.layers.3.mlp.up_proj.lora_B.weight";
  // Writes a copy of the committed dir with tensor `drop` left out (or given the wrong shape).
  auto make = [&](const std::string& tag, bool drop, const std::string& cfg) {
    std::string dir = qlft_test::temp_dir(tag);
    SafetensorsWriter w;
    for (const SafeTensorInfo& t : src->tensors()) {
      if (t.name == victim && drop) continue;
      std::vector<int64_t> shape = t.shape;
      if (t.name == victim) shape = {shape[1], shape[0]};  // transposed: wrong shape
      w.add_tensor(t.name, t.dtype, shape, t.data, t.nbytes);
    }
    w.write(dir + "/adapter_model.safetensors");
    qlft_test::write_file(dir + "/adapter_config.json", cfg.data(), cfg.size());
    return dir;
  };
  auto expect_error = [&](const std::string& dir, int32_t code, const std::string& needle) {
    LoraAdapter b(&tracker, model->shapes, export_config(false));
    b.init(99);
    std::vector<float> before = all_weights(b);
    try {
      load_peft_adapter(b, dir);
      ADD_FAILURE() << dir << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_TRUE(all_weights(b) == before) << dir << ": adapter changed by a failed load";
  };
  expect_error(make("peft_missing", true, cfg_text), QLFT_ERR_FORMAT, victim + "' is missing");
  expect_error(make("peft_shape", false, cfg_text), QLFT_ERR_FORMAT,
               victim + "' should have shape");
  std::string r8 = cfg_text;
  size_t at = r8.find("\"r\": 4");
  ASSERT_NE(at, std::string::npos);
  r8.replace(at, 6, "\"r\": 8");
  // Tensors fine, but the config's r differs from the adapter's: an argument error naming r.
  std::string dir = qlft_test::temp_dir("peft_r");
  std::vector<uint8_t> st =
      qlft_test::read_file(train_fixture("peft_adapter/adapter_model.safetensors"));
  qlft_test::write_file(dir + "/adapter_model.safetensors", st.data(), st.size());
  qlft_test::write_file(dir + "/adapter_config.json", r8.data(), r8.size());
  expect_error(dir, QLFT_ERR_INVALID_ARGUMENT, "r is 8 but the trainer's lora.r is 4");
}

TEST_F(AdapterExport, GgufAdapterIsTheCheckedOne) {
  std::string dir = qlft_test::temp_dir("gguf_export");
  save_gguf_lora_adapter(*lora, dir + "/a.gguf");
  expect_same_file(dir + "/a.gguf", train_fixture("adapter.gguf"));
  LoraAdapter rs(&tracker, model->shapes, export_config(true));
  fill_adapter(rs);
  save_gguf_lora_adapter(rs, dir + "/rs.gguf");
  expect_same_file(dir + "/rs.gguf", train_fixture("adapter_rslora.gguf"));
  nlohmann::json j = checks();
  for (const char* f : {"adapter.gguf", "adapter_rslora.gguf"}) {
    ASSERT_TRUE(j.contains(f)) << f;
    EXPECT_TRUE(j[f]["ok"].get<bool>()) << f << ": " << j[f]["errors"].dump();
    EXPECT_EQ(j[f]["pairs"].get<int>(), 35) << f;
  }
  EXPECT_FLOAT_EQ(j["adapter.gguf"]["alpha"].get<float>(), 8.f);
  EXPECT_FLOAT_EQ(j["adapter_rslora.gguf"]["alpha"].get<float>(), 16.f);  // 8 * sqrt(4)
  // Our own reader sees the same keys.
  auto g = GgufFile::open(dir + "/rs.gguf");
  EXPECT_EQ(g->get_string("general.type"), "adapter");
  EXPECT_EQ(g->get_string("adapter.type"), "lora");
  EXPECT_FLOAT_EQ(static_cast<float>(g->get_float("adapter.lora.alpha", 0)), 16.f);
}

TEST_F(AdapterExport, MergedSafetensorsMatchesBasePlusAdapter) {
  Fixture fx(train_fixture("export.safetensors"));
  std::vector<int32_t> tok = fx.i32("tokens");
  std::string dir = qlft_test::temp_dir("merged_st");
  export_merged(*model, lora.get(), dir, "safetensors");
  expect_same_file(dir + "/model.safetensors", train_fixture("merged/model.safetensors"));
  expect_same_file(dir + "/config.json", train_fixture("merged/config.json"));
  nlohmann::json j = checks();
  EXPECT_TRUE(j["merged_safetensors"]["ok"].get<bool>()) << j["merged_safetensors"].dump();

  auto merged = load_model(&tracker, dir, model_test::keep());
  EXPECT_FALSE(merged->cfg.rope_adjacent);  // HF order on disk
  std::vector<float> ours = logits_of(*model, lora.get(), tok, 2, &tracker);
  std::vector<float> m = logits_of(*merged, nullptr, tok, 2, &tracker);
  double err = qlft_test::max_rel_error(m.data(), ours.data(), m.size());
  std::printf("merged f32 safetensors vs base + adapter: %.3g\n", err);
  EXPECT_LT(err, 1e-5);
  // transformers' logits of the same merged files (fixture) equal PEFT's.
  std::vector<float> tf = fx.f32("merged_logits"), peft = fx.f32("peft_logits");
  EXPECT_LT(qlft_test::max_rel_error(m.data(), tf.data(), m.size()), 1e-4);
}

TEST_F(AdapterExport, MergedGgufF16AndBf16) {
  Fixture fx(train_fixture("export.safetensors"));
  std::vector<int32_t> tok = fx.i32("tokens");
  std::vector<float> ours = logits_of(*model, lora.get(), tok, 2, &tracker);
  std::string dir = qlft_test::temp_dir("merged_gguf");
  for (const char* fmt : {"gguf-f16", "gguf-bf16"}) {
    const bool bf16 = std::string(fmt) == "gguf-bf16";
    std::string path = dir + "/" + fmt + ".gguf";
    export_merged(*model, lora.get(), path, fmt);
    auto g = GgufFile::open(path);
    // Tokenizer metadata travels: the merged file has the source's vocabulary.
    const GgufValue* src = model->gguf->find("tokenizer.ggml.tokens");
    const GgufValue* dst = g->find("tokenizer.ggml.tokens");
    ASSERT_TRUE(src && dst);
    EXPECT_EQ(dst->count, src->count);
    EXPECT_EQ(g->get_string("tokenizer.ggml.model"),
              model->gguf->get_string("tokenizer.ggml.model"));
    // Every merged projection is the rounded fp32 merge (stories260K's GGUF order is the
    // model's order, so no permutation is involved here; the safetensors test covers HF order).
    for (int l = 0; l < model->cfg.n_layers; ++l)
      for (int p = 0; p < kProjCount; ++p) {
        Proj pr = static_cast<Proj>(p);
        std::vector<float> w = merged_weight(*model, lora.get(), l, pr);
        const GgufTensorInfo* t =
            g->find_tensor("blk." + std::to_string(l) + "." + proj_gguf_name(pr) + ".weight");
        ASSERT_TRUE(t);
        ASSERT_EQ(t->numel(), static_cast<int64_t>(w.size()));
        const uint16_t* h = reinterpret_cast<const uint16_t*>(t->data);
        for (size_t i = 0; i < w.size(); ++i) {
          uint16_t want = bf16 ? f32_to_bf16(w[i]) : f32_to_f16(w[i]);
          if (h[i] != want) {
            ADD_FAILURE() << fmt << " layer " << l << " " << proj_peft_name(pr) << " element " << i;
            break;
          }
        }
      }
    auto merged = load_model(&tracker, path, model_test::keep());
    std::vector<float> m = logits_of(*merged, nullptr, tok, 2, &tracker);
    double err = qlft_test::max_rel_error(m.data(), ours.data(), m.size());
    std::printf("merged %s vs base + adapter: %.3g\n", fmt, err);
    // Rounding every weight to 11 (f16) or 8 (bf16) significant bits moves logits by a few
    // units of that precision.
    EXPECT_LT(err, bf16 ? 3e-2 : 4e-3) << fmt;
  }
}

// The HF-order paths: a synthetic llama loaded from an HF directory (rotate-half q/k rows) with
// its PEFT fixture adapter; the merged GGUF must hold adjacent-pair rows (llama.cpp's order)
// and give PEFT's logits when our loader reads it back, and qwen2 (rotate-half kept in GGUF).
TEST(MergedExport, SyntheticLlamaAndQwen2AgainstPeftLogits) {
  set_num_threads(1);  // tiny model: threads only add barrier waits
  for (const char* name : {"syn_llama", "syn_qwen2"}) {
    MemoryTracker tracker;
    Fixture fx(model_test::model_fixture(std::string(name) + ".lora.safetensors"));
    auto model = load_model(&tracker, model_test::model_fixture(name), model_test::keep());
    LoraAdapter lora(&tracker, model->shapes, model_test::lora_config_of(fx));
    model_test::load_lora(fx, lora);
    std::vector<int32_t> tok = fx.i32("tokens");
    std::vector<float> ref = fx.f32("logits");
    std::string dir = qlft_test::temp_dir(std::string("merged_") + name);
    export_merged(*model, &lora, dir + "/st", "safetensors");
    export_merged(*model, &lora, dir + "/m.gguf", "gguf-f16");
    auto st = load_model(&tracker, dir + "/st", model_test::keep());
    std::vector<float> a = logits_of(*st, nullptr, tok, 2, &tracker);
    EXPECT_LT(qlft_test::max_rel_error(a.data(), ref.data(), a.size()), 1e-4) << name;
    auto gg = load_model(&tracker, dir + "/m.gguf", model_test::keep());
    EXPECT_EQ(gg->cfg.rope_adjacent, std::string(name) == "syn_llama") << name;
    std::vector<float> b = logits_of(*gg, nullptr, tok, 2, &tracker);
    EXPECT_LT(qlft_test::max_rel_error(b.data(), ref.data(), b.size()), 4e-3) << name;
  }
}

TEST(MergedExport, RejectsUnknownFormat) {
  MemoryTracker tracker;
  auto model = load_model(&tracker, model_test::model_fixture("syn_qwen2"), model_test::keep());
  try {
    export_merged(*model, nullptr, qlft_test::temp_dir("bad_fmt") + "/x", "gguf-q4");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("gguf-q4"), std::string::npos);
  }
}

// The C API: a trainer built from the committed PEFT directory exports the committed merged
// model byte for byte; a bad format is an argument error that names it.
TEST(MergedExport, CApiExportsTheCommittedMergedModel) {
  QLFT_NEED_SHARED(path, "models/stories260K.gguf");
  qlft_config* cfg = nullptr;
  ASSERT_EQ(qlft_config_create(&cfg), QLFT_OK);
  ASSERT_EQ(qlft_config_set(cfg, "quant.type", "keep"), QLFT_OK);
  ASSERT_EQ(qlft_config_set(cfg, "lora.init_from", train_fixture("peft_adapter").c_str()), QLFT_OK);
  qlft_runtime* rt = nullptr;
  ASSERT_EQ(qlft_runtime_create(cfg, &rt), QLFT_OK);
  qlft_model* m = nullptr;
  ASSERT_EQ(qlft_model_load(rt, path.c_str(), cfg, &m), QLFT_OK) << qlft_last_error();
  qlft_trainer* t = nullptr;
  ASSERT_EQ(qlft_trainer_create(m, nullptr, cfg, &t), QLFT_OK) << qlft_last_error();
  std::string dir = qlft_test::temp_dir("capi_merged");
  EXPECT_EQ(qlft_trainer_export_merged(t, dir.c_str(), "safetensors"), QLFT_OK)
      << qlft_last_error();
  expect_same_file(dir + "/model.safetensors", train_fixture("merged/model.safetensors"));
  EXPECT_EQ(qlft_trainer_export_merged(t, (dir + "/x").c_str(), "onnx"), QLFT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qlft_last_error()).find("onnx"), std::string::npos) << qlft_last_error();
  EXPECT_EQ(qlft_trainer_export_merged(nullptr, dir.c_str(), "safetensors"),
            QLFT_ERR_INVALID_ARGUMENT);
  qlft_trainer_free(t);
  qlft_model_free(m);
  qlft_runtime_free(rt);
  qlft_config_free(cfg);
}

// llama.cpp has no "mistral" architecture (its converter writes Mistral as "llama") and refuses an
// adapter whose architecture differs from the base model's: both GGUF exports of a Mistral model
// say "llama".
TEST(MergedExport, MistralIsLlamaInGguf) {
  set_num_threads(1);
  const std::string src = model_test::model_fixture("syn_llama");
  const std::string dir = qlft_test::temp_dir("mistral_src");
  std::vector<uint8_t> st = qlft_test::read_file(src + "/model.safetensors");
  qlft_test::write_file(dir + "/model.safetensors", st.data(), st.size());
  std::ifstream f(src + "/config.json");
  nlohmann::json cfg;
  f >> cfg;
  cfg["architectures"] = {"MistralForCausalLM"};
  cfg["model_type"] = "mistral";
  std::string text = cfg.dump(2);
  qlft_test::write_file(dir + "/config.json", text.data(), text.size());
  MemoryTracker tracker;
  auto model = load_model(&tracker, dir, model_test::keep());
  ASSERT_EQ(model->cfg.arch, "mistral");
  LoraAdapter lora(&tracker, model->shapes, LoraConfig{});
  save_gguf_lora_adapter(lora, dir + "/a.gguf");
  export_merged(*model, &lora, dir + "/m.gguf", "gguf-f16");
  EXPECT_EQ(GgufFile::open(dir + "/a.gguf")->get_string("general.architecture"), "llama");
  auto g = GgufFile::open(dir + "/m.gguf");
  EXPECT_EQ(g->get_string("general.architecture"), "llama");
  EXPECT_GT(g->get_int("llama.block_count", 0), 0);
}
