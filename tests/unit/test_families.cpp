// The model families beyond llama / qwen2 (issue 48) against transformers + PEFT in fp32: for
// each family's tiny random model (tests/reference/gen_family_fixtures.py, made from the
// family's own config class), loaded from safetensors and from GGUF: logits, loss and every
// LoRA gradient, the base model's logits, greedy generation, the PEFT adapter's tensor names and
// the merged export's logits against merge_and_unload's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>

#include "arch/deltas.h"
#include "arch/families.h"
#include "backend/autocast_backend.h"
#include "core/threads.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "formats/safetensors.h"
#include "formats/safetensors_writer.h"
#include "gguf_compare.h"
#include "model/generate.h"
#include "support/settings.h"
#include "test_model_util.h"
#include "train/adapter_io.h"
#include "train/planner.h"
#include "train/merge_export.h"

using namespace qlft;
using namespace model_test;
using qlft_test::max_rel_error;

namespace {

constexpr double kTol = 1e-4;

std::string family_fixture(const std::string& rel) {
  return qlft_test::fixture_path("families/" + rel);
}

// A copy of the synthetic Qwen3 directory with its config.json edited.
std::string edited_qwen3(const std::function<void(nlohmann::json&)>& edit, const char* tag) {
  return edited_model_dir(family_fixture("syn_qwen3"), edit, tag);
}

TokenBatch batch_of(const Fixture& f, std::vector<int32_t>& tok, std::vector<int32_t>* tgt) {
  tok = f.i32("tokens");
  auto shp = f.shape("tokens");
  TokenBatch b;
  b.batch = static_cast<int>(shp[0]);
  b.seq = static_cast<int>(shp[1]);
  b.tokens = tok.data();
  if (tgt) {
    *tgt = f.i32("targets");
    b.targets = tgt->data();
  }
  return b;
}

std::vector<float> logits_of(const Model& m, Backend& be, LoraAdapter* lora, const TokenBatch& b) {
  LlamaRunner run(m, be, lora);
  std::vector<float> out(static_cast<size_t>(b.rows()) * m.cfg.vocab);
  run.logits(b, MatF(out.data(), b.rows(), m.cfg.vocab));
  return out;
}

// Logits, loss and every LoRA gradient of model_path against the family's fixture; returns
// the logits.
std::vector<float> check_parity(const std::string& model_path, const std::string& family) {
  SCOPED_TRACE(model_path);
  MemoryTracker tr;
  auto model = load_model(&tr, model_path, keep());
  // llama.cpp writes Mistral as "llama" (ArchFamily::gguf_arch).
  EXPECT_EQ(model->cfg.arch,
            model->source_format == "gguf" && family == "mistral" ? "llama"
            : family == "gemma3" || family == "gemma3_vlm"        ? "gemma3_text"  // model_type
                                                                  : family);
  Fixture f(family_fixture("syn_" + family + ".lora.safetensors"));
  auto be = make_cpu_backend(&tr);
  LoraAdapter lora(&tr, model->shapes, lora_config_of(f));
  load_lora(f, lora);
  LlamaRunner run(*model, *be, &lora);
  std::vector<int32_t> tok, tgt;
  TokenBatch b = batch_of(f, tok, &tgt);
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
  run.backward();
  double worst = 0;
  const int n = check_lora_grads(lora, f, "", kTol, &worst);
  int targets = 0;
  for (int p = 0; p < kProjCount; ++p) targets += lora.config().targets[p] ? 1 : 0;
  EXPECT_EQ(n, 2 * targets * model->cfg.n_layers);
  std::printf("[family] %s: %d LoRA gradients, worst normalized error %.2e\n", model_path.c_str(),
              n, worst);
  return logits;
}

// Everything a family's fixture checks, from its safetensors directory and (gguf) its GGUF.
void check_family(const std::string& family, bool gguf = true) {
  set_num_threads(1);  // tiny model: threads only add barrier waits
  const std::string name = "syn_" + family;
  auto a = check_parity(family_fixture(name), family);
  if (gguf) {
    auto b = check_parity(family_fixture(name + ".gguf"), family);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_LT(max_rel_error(b.data(), a.data(), a.size()), 1e-5) << "GGUF vs safetensors logits";
  }

  MemoryTracker tr;
  Fixture f(family_fixture(name + ".lora.safetensors"));
  auto be = make_cpu_backend(&tr);
  for (const char* file : {"", ".gguf"}) {
    if (*file && !gguf) continue;
    SCOPED_TRACE(name + file);
    auto model = load_model(&tr, family_fixture(name + file), keep());
    std::vector<int32_t> tok;
    TokenBatch bt = batch_of(f, tok, nullptr);
    // The base model alone.
    std::vector<float> base = logits_of(*model, *be, nullptr, bt), ref = f.f32("base_logits");
    EXPECT_LT(max_rel_error(base.data(), ref.data(), ref.size()), kTol) << "base logits";
    // Greedy generation with the KV cache: transformers' continuation of the prompt.
    std::vector<int32_t> prompt = f.i32("prompt"), want = f.i32("greedy");
    Generator gen(*model, *be, nullptr);
    GenerateOptions o;
    o.max_tokens = static_cast<int>(want.size());
    EXPECT_EQ(gen.generate(prompt, o), want) << "greedy continuation";
  }
}

// The PEFT adapter qlft writes for the family holds the tensor names PEFT's save_pretrained
// writes (recorded by the generator) with the fixture's values; the merged export (safetensors
// and GGUF F16), loaded back, gives merge_and_unload's logits.
void check_exports(const std::string& family, bool gguf = true) {
  set_num_threads(1);
  const std::string name = "syn_" + family;
  MemoryTracker tr;
  Fixture f(family_fixture(name + ".lora.safetensors"));
  auto model = load_model(&tr, family_fixture(name), keep());
  LoraAdapter lora(&tr, model->shapes, lora_config_of(f));
  load_lora(f, lora);
  const std::string dir = qlft_test::temp_dir("family_export_" + family);
  save_peft_adapter(lora, dir + "/peft", "base");
  auto st = SafetensorsFile::open(dir + "/peft/adapter_model.safetensors");
  std::set<std::string> ours, peft;
  for (const SafeTensorInfo& t : st->tensors()) ours.insert(t.name);
  std::stringstream keys(f.meta("peft_keys"));
  for (std::string k; std::getline(keys, k, ',');) peft.insert(k);
  EXPECT_EQ(ours, peft) << "adapter tensor names";
  LoraAdapter back(&tr, model->shapes, lora_config_of(f));
  load_peft_adapter(back, dir + "/peft");
  for (int l = 0; l < model->cfg.n_layers; ++l)
    for (int p = 0; p < kProjCount; ++p) {
      const std::string k =
          "l" + std::to_string(l) + "." + proj_peft_name(static_cast<Proj>(p)) + ".";
      if (!f.has(k + "A")) continue;
      std::vector<float> A = back.get_hf(l, static_cast<Proj>(p), LoraAdapter::Part::A);
      std::vector<float> ref = f.f32(k + "A");
      EXPECT_EQ(A, ref) << k << "A";
    }

  auto be = make_cpu_backend(&tr);
  std::vector<int32_t> tok;
  TokenBatch bt = batch_of(f, tok, nullptr);
  const std::vector<float> ref = f.f32("merged_logits");
  export_merged(*model, &lora, dir + "/merged", "safetensors");
  auto ms = load_model(&tr, dir + "/merged", keep());
  std::vector<float> a = logits_of(*ms, *be, nullptr, bt);
  EXPECT_LT(max_rel_error(a.data(), ref.data(), ref.size()), kTol) << "merged safetensors";
  if (!gguf) return;
  export_merged(*model, &lora, dir + "/merged.gguf", "gguf-f16");
  auto mg = load_model(&tr, dir + "/merged.gguf", keep());
  EXPECT_EQ(mg->cfg.arch, family == "mistral" ? "llama" : ms->cfg.arch);
  for (size_t l = 0; l < mg->shapes.layers.size(); ++l) {  // llama.cpp's arch and row order aside
    EXPECT_EQ(mg->shapes.layers[l].window, ms->shapes.layers[l].window) << "layer " << l;
    EXPECT_EQ(mg->shapes.layers[l].qk_norm, ms->shapes.layers[l].qk_norm) << "layer " << l;
  }
  std::vector<float> g = logits_of(*mg, *be, nullptr, bt);
  // F16 matrices: the merged weights rounded once.
  EXPECT_LT(max_rel_error(g.data(), ref.data(), ref.size()), 4e-3) << "merged GGUF F16";
}

// The merged GGUF of the base model against syn_<family>.gguf, written by gguf-py with
// llama.cpp's names and keys (gen_family_fixtures.py): the same tensors (name, shape, type),
// every metadata key of the fixture but general.name, and the fixture's logits (both F16 of the
// same fp16-exact weights).
void expect_gguf_like_fixture(const std::string& family) {
  set_num_threads(1);
  MemoryTracker tr;
  auto model = load_model(&tr, family_fixture("syn_" + family), keep());
  const std::string path = qlft_test::temp_dir("family_gguf_" + family) + "/base.gguf";
  export_merged(*model, nullptr, path, "gguf-f16");
  auto ours = GgufFile::open(path);
  auto ref = GgufFile::open(family_fixture("syn_" + family + ".gguf"));
  const std::set<std::string> extra = expect_tensors_like(*ours, *ref, false);
  EXPECT_TRUE(extra.empty()) << "tensors the fixture lacks: " << *extra.begin();
  for (const auto& kv : ref->metadata())
    if (kv.first != "general.name") EXPECT_TRUE(ours->find(kv.first)) << kv.first;
  auto be = make_cpu_backend(&tr);
  Fixture f(family_fixture("syn_" + family + ".lora.safetensors"));
  std::vector<int32_t> tok;
  TokenBatch bt = batch_of(f, tok, nullptr);
  auto mg = load_model(&tr, path, keep());
  auto mr = load_model(&tr, family_fixture("syn_" + family + ".gguf"), keep());
  const std::vector<float> a = logits_of(*mg, *be, nullptr, bt),
                           b = logits_of(*mr, *be, nullptr, bt);
  EXPECT_LT(max_rel_error(a.data(), b.data(), b.size()), 1e-6) << "exported vs gguf-py GGUF";
}

}  // namespace

// Qwen3: per-head RMSNorm on q and k before RoPE, head_dim 16 with hidden 32 / 4 heads.
TEST(Families, Qwen3MatchesTransformersAndPeft) {
  check_family("qwen3");
}

TEST(Families, Qwen3ExportsLoadInPeft) {
  check_exports("qwen3");
}

TEST(Families, Qwen3ShapesHaveQkNorms) {
  MemoryTracker tr;
  auto m = load_model(&tr, family_fixture("syn_qwen3"), keep());
  EXPECT_EQ(m->shapes.head_dim, 16);
  EXPECT_EQ(m->shapes.q_dim(), 64);
  ASSERT_TRUE(m->shapes.qk_norm());
  EXPECT_EQ(m->shapes.layers[0].qk_norm, 16);
  EXPECT_FALSE(m->shapes.layers[0].qkv_bias);
  EXPECT_EQ(m->layers[1].q_norm.size(), 16u * 4);
  EXPECT_EQ(m->layers[1].k_norm.size(), 16u * 4);
}

// Checkpointed layers recompute the q / k norms: the same gradients as stored ones; and a bf16
// step (16-bit activation storage, the q / k norms' inputs kept fp32) stays near the fp32 one.
TEST(Families, Qwen3CheckpointingAndBf16Storage) {
  set_num_threads(1);
  MemoryTracker tr;
  auto model = load_model(&tr, family_fixture("syn_qwen3"), keep());
  Fixture f(family_fixture("syn_qwen3.lora.safetensors"));
  auto be = make_cpu_backend(&tr);
  LoraAdapter lora(&tr, model->shapes, lora_config_of(f));
  load_lora(f, lora);
  LlamaRunner run(*model, *be, &lora);
  std::vector<int32_t> tok, tgt;
  TokenBatch b = batch_of(f, tok, &tgt);
  auto grads = [&] {
    lora.zero_grad();
    run.forward(b);
    run.backward();
    std::vector<float> g;
    for (auto& p : lora.params()) g.insert(g.end(), p.g, p.g + p.n);
    return g;
  };
  const std::vector<float> g0 = grads();
  run.set_checkpoint_all(true);
  EXPECT_EQ(grads(), g0) << "checkpointed";
  run.set_checkpoint_all(false);
  run.set_activation_dtype(DType::BF16);
  const std::vector<float> g16 = grads();
  const double e = max_rel_error(g16.data(), g0.data(), g0.size());
  std::printf("[family] qwen3 bf16 storage vs fp32 gradients: %.3g\n", e);
  EXPECT_LT(e, 3e-2);
  EXPECT_GT(e, 0.0);  // the 16-bit storage was in use
}

// Mistral's sliding window (5 keys over 16-token rows): every layer masks keys j <= i - 5, in
// training, inference and the KV-cache generation, from config.json and from the GGUF's
// llama.attention.sliding_window.
TEST(Families, MistralSlidingWindowMatchesTransformersAndPeft) {
  check_family("mistral");
}

TEST(Families, MistralExportsLoadInPeft) {
  check_exports("mistral");
}

// The window is what makes the match: without it the logits are transformers' no longer.
TEST(Families, MistralWindowIsVisible) {
  MemoryTracker tr;
  auto m = load_model(&tr, family_fixture("syn_mistral"), keep());
  ASSERT_EQ(m->cfg.sliding_window, 5);
  for (const LayerShapes& l : m->shapes.layers) EXPECT_EQ(l.window, 5);
  Fixture f(family_fixture("syn_mistral.lora.safetensors"));
  auto be = make_cpu_backend(&tr);
  std::vector<int32_t> tok;
  TokenBatch bt = batch_of(f, tok, nullptr);
  const std::vector<float> ref = f.f32("base_logits");
  EXPECT_LT(max_rel_error(logits_of(*m, *be, nullptr, bt).data(), ref.data(), ref.size()), kTol);
  for (LayerShapes& l : m->shapes.layers) l.window = 0;
  EXPECT_GT(max_rel_error(logits_of(*m, *be, nullptr, bt).data(), ref.data(), ref.size()), 1e-2);
}

// Qwen's configs carry a sliding_window that use_sliding_window switches off, or layer_types
// that say which layers slide; a layer type qlft does not train is refused naming it.
TEST(Families, SlidingWindowFromConfigKeys) {
  auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
    MemoryTracker tr;
    return load_model(&tr, edited_qwen3(edit, "qwen3_window"), keep())->shapes;
  };
  ModelShapes s = with([](nlohmann::json& j) {
    j["sliding_window"] = 4096;
    j["use_sliding_window"] = false;
    j.erase("layer_types");
  });
  for (const LayerShapes& l : s.layers) EXPECT_EQ(l.window, 0);
  s = with([](nlohmann::json& j) {
    j["sliding_window"] = 7;
    j["use_sliding_window"] = true;
    j["max_window_layers"] = 1;
    j.erase("layer_types");
  });
  EXPECT_EQ(s.layers[0].window, 0);
  EXPECT_EQ(s.layers[1].window, 7);
  s = with([](nlohmann::json& j) {
    j["sliding_window"] = 9;
    j["layer_types"] = {"sliding_attention", "full_attention"};
  });
  EXPECT_EQ(s.layers[0].window, 9);
  EXPECT_EQ(s.layers[1].window, 0);
  try {
    with([](nlohmann::json& j) {
      j["sliding_window"] = 9;
      j["layer_types"] = {"linear_attention", "full_attention"};
    });
    ADD_FAILURE() << "a linear_attention layer was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_FORMAT);
    EXPECT_NE(std::string(e.what()).find("layer_types[0] is 'linear_attention'"), std::string::npos)
        << e.what();
  }
}

// Gemma 2: (1 + w) norms, four per layer, GeGLU, embeddings times sqrt(32), scores scaled by
// 24^-0.5 (not head_dim 16's) and soft-capped at 4, final logits soft-capped at 8, a window of 5
// on layers 0 and 2, tied head: logits, loss and LoRA gradients vs transformers + PEFT.
// From config.json and from llama.cpp's "gemma2" GGUF (norms stored as 1 + w, its post-norm
// names and soft-cap keys); greedy generation through the KV cache as well.
TEST(Families, Gemma2MatchesTransformersAndPeft) {
  check_family("gemma2");
}

// Gemma 3 (text): gemma2's block without soft-caps, (1 + w) q / k norms per head, RoPE base
// 1e4 on the sliding layers and 1e6 with linear scaling (factor 2) on the full one, window 5 on
// layers 0 and 1 of 3. From safetensors and from llama.cpp's "gemma3" GGUF; the merged GGUF
// export writes the local base (rope.freq_base_swa) and the pattern (sliding_window_pattern).
TEST(Families, Gemma3MatchesTransformersAndPeft) {
  check_family("gemma3");
}
TEST(Families, Gemma3ExportsLoadInPeft) {
  check_exports("gemma3");
  expect_gguf_like_fixture("gemma3");
  MemoryTracker tr;
  auto m = load_model(&tr, family_fixture("syn_gemma3"), keep());
  EXPECT_EQ(m->cfg.rope_local_theta, 10000.f);
  EXPECT_EQ(m->cfg.rope_theta, 1000000.f);
  EXPECT_EQ(m->shapes.layers[2].window, 0);
}

// Gemma 3's image-text model (Gemma3ForConditionalGeneration from Gemma3Config: syn_gemma3's text
// model beside a tiny SigLIP vision tower and projector, saved as transformers 5 names them,
// model.language_model.* / model.vision_tower.* / model.multi_modal_projector.*, head tied)
// trains as its text model: text-only logits, LoRA gradients (PEFT's on the language model's
// projections) and greedy ids against transformers; the adapter's keys are PEFT's
// (base_model.model.model.language_model.layers.N...) and its target_modules a regex PEFT
// matches on the language model alone (the vision tower has q_proj / k_proj / v_proj too); the
// merged export is the text model (Gemma3ForCausalLM) with merge_and_unload's logits.
TEST(Families, Gemma3ImageTextMatchesTransformersAndPeft) {
  check_family("gemma3_vlm", false);
  MemoryTracker tr;
  auto m = load_model(&tr, family_fixture("syn_gemma3_vlm"), keep());
  EXPECT_TRUE(m->cfg.image_text);
  EXPECT_TRUE(m->cfg.tied_embeddings);
  EXPECT_EQ(m->cfg.rope_local_theta, 10000.f);
  EXPECT_EQ(m->cfg.rope.type, RopeType::Linear);
  EXPECT_EQ(m->shapes.layers[2].window, 0);
  EXPECT_EQ(m->shapes.layers[0].window, 5);
  EXPECT_NE(describe_deltas(m->cfg, m->shapes).find("vision tower and projector not loaded"),
            std::string::npos);
  // The names before transformers 5 (language_model.model.*, vision_tower.*,
  // multi_modal_projector.*): the same text model, transformers' base logits.
  const std::string dir = qlft_test::temp_dir("gemma3_vlm_v4");
  const std::vector<uint8_t> cfg =
      qlft_test::read_file(family_fixture("syn_gemma3_vlm/config.json"));
  qlft_test::write_file(dir + "/config.json", cfg.data(), cfg.size());
  auto st = SafetensorsFile::open(family_fixture("syn_gemma3_vlm/model.safetensors"));
  SafetensorsWriter w;
  for (const SafeTensorInfo& t : st->tensors()) {
    const std::string lm = "model.language_model.";
    const std::string name = t.name.rfind(lm, 0) == 0
                                 ? "language_model.model." + t.name.substr(lm.size())
                                 : t.name.substr(std::string("model.").size());
    w.add_tensor(name, t.dtype, t.shape, t.data, t.nbytes);
  }
  w.write(dir + "/model.safetensors");
  auto old = load_model(&tr, dir, keep());
  EXPECT_EQ(old->cfg.hf_prefix, "language_model.model.");
  Fixture f(family_fixture("syn_gemma3_vlm.lora.safetensors"));
  auto be = make_cpu_backend(&tr);
  std::vector<int32_t> tok;
  TokenBatch bt = batch_of(f, tok, nullptr);
  const std::vector<float> base = logits_of(*old, *be, nullptr, bt), ref = f.f32("base_logits");
  EXPECT_LT(max_rel_error(base.data(), ref.data(), ref.size()), kTol) << "older names";
}
TEST(Families, Gemma3ImageTextExportsLoadInPeft) {
  check_exports("gemma3_vlm", false);
  MemoryTracker tr;
  auto model = load_model(&tr, family_fixture("syn_gemma3_vlm"), keep());
  Fixture f(family_fixture("syn_gemma3_vlm.lora.safetensors"));
  LoraAdapter lora(&tr, model->shapes, lora_config_of(f));
  const std::string dir = qlft_test::temp_dir("gemma3_vlm_targets");
  save_peft_adapter(lora, dir, "base");
  const std::vector<uint8_t> text = qlft_test::read_file(dir + "/adapter_config.json");
  const nlohmann::json j = nlohmann::json::parse(text.begin(), text.end());
  // The regex the generator gave PEFT (recorded beside its keys).
  EXPECT_EQ(j["target_modules"], f.meta("peft_target_modules"));
  // The planner reads the language model's tensors by their names: syn_gemma3's footprint (the
  // same text model, stored alike), the vision tower not counted.
  LoadOptions o;  // NF4
  ModelConfig c;
  const WeightFootprint vlm = weight_footprint_of_file(family_fixture("syn_gemma3_vlm"), o, &c),
                        plain = weight_footprint_of_file(family_fixture("syn_gemma3"), o, &c);
  EXPECT_EQ(vlm.bytes, plain.bytes);
  EXPECT_EQ(vlm.groups, plain.groups);
}

// Each Gemma delta is what makes the match: with any one of them undone, the base logits are
// transformers' no longer (each moves them by more than 100x the parity tolerance).
TEST(Families, Gemma2EachDeltaIsVisible) {
  set_num_threads(1);
  MemoryTracker tr;
  auto m = load_model(&tr, family_fixture("syn_gemma2"), keep());
  Fixture f(family_fixture("syn_gemma2.lora.safetensors"));
  auto be = make_cpu_backend(&tr);
  std::vector<int32_t> tok;
  TokenBatch bt = batch_of(f, tok, nullptr);
  const std::vector<float> ref = f.f32("base_logits");
  auto err = [&] {
    return max_rel_error(logits_of(*m, *be, nullptr, bt).data(), ref.data(), ref.size());
  };
  ASSERT_LT(err(), kTol);
  const ModelConfig c0 = m->cfg;
  const ModelShapes s0 = m->shapes;
  const std::pair<const char*, std::function<void()>> undo[] = {
      {"attention soft-cap", [&] { m->cfg.attn_softcap = 0; }},
      {"final soft-cap", [&] { m->cfg.final_softcap = 0; }},
      {"query_pre_attn_scalar", [&] { m->cfg.attn_scalar = 0; }},
      {"sliding window",
       [&] {
         for (LayerShapes& l : m->shapes.layers) l.window = 0;
       }},
      {"GeGLU and the embedding scale", [&] { m->cfg.gemma = false; }},
  };
  for (const auto& [what, change] : undo) {
    change();
    const double e = err();
    std::printf("[family] gemma2 without its %s: logits off by %.3g\n", what, e);
    EXPECT_GT(e, 100 * kTol) << what;
    m->cfg = c0;
    m->shapes = s0;
  }
}

// A bf16 step: 16-bit activation storage (the post-block norms' inputs kept fp32) and the
// autocast bf16 backend (bf16 attention tiles with the soft-cap, the capped cross-entropy's bf16
// head) stay near the fp32 gradients; checkpointed layers recompute the same ones.
TEST(Families, Gemma2CheckpointingAndBf16) {
  set_num_threads(1);
  MemoryTracker tr;
  auto model = load_model(&tr, family_fixture("syn_gemma2"), keep());
  Fixture f(family_fixture("syn_gemma2.lora.safetensors"));
  std::vector<int32_t> tok, tgt;
  TokenBatch b = batch_of(f, tok, &tgt);
  auto grads = [&](Backend& be, bool ckpt, DType act) {
    LoraAdapter lora(&tr, model->shapes, lora_config_of(f));
    load_lora(f, lora);
    LlamaRunner run(*model, be, &lora);
    run.set_checkpoint_all(ckpt);
    run.set_activation_dtype(act);
    lora.zero_grad();
    const double loss = run.forward(b).mean();
    run.backward();
    std::vector<float> g;
    for (auto& p : lora.params()) g.insert(g.end(), p.g, p.g + p.n);
    return std::pair{loss, g};
  };
  auto cpu = make_cpu_backend(&tr);
  const auto [l0, g0] = grads(*cpu, false, DType::F32);
  EXPECT_NEAR(l0, f.f32("loss")[0], kTol * std::fabs(l0));
  EXPECT_EQ(grads(*cpu, true, DType::F32).second, g0) << "checkpointed";
  const auto [l16, g16] = grads(*cpu, false, DType::BF16);
  const double e16 = max_rel_error(g16.data(), g0.data(), g0.size());
  auto bf = make_autocast_backend(make_cpu_backend(&tr), DType::BF16, true);
  const auto [lb, gb] = grads(*bf, true, DType::BF16);
  const double eb = max_rel_error(gb.data(), g0.data(), g0.size());
  std::printf("[family] gemma2 bf16 storage %.3g, bf16 autocast %.3g (loss %.5f vs %.5f)\n", e16,
              eb, lb, l0);
  EXPECT_GT(e16, 0.0);  // the 16-bit storage was in use
  EXPECT_LT(e16, 3e-2);
  EXPECT_GT(eb, 0.0);
  EXPECT_LT(eb, 5e-2);
  EXPECT_NEAR(lb, l0, 1e-2 * l0);
}

// The merged export writes Gemma's norms back as w (safetensors; GGUF keeps 1 + w), its four
// norm names and its keys (caps, query_pre_attn_scalar, layer_types / llama.cpp's even-layer
// window): loaded back, merge_and_unload's logits.
TEST(Families, Gemma2ExportsLoadInPeft) {
  check_exports("gemma2");
}

// Done-when 5: an architecture qlft does not train is refused at load, naming it and what qlft
// lacks for it (a hybrid linear-attention model, a Mamba hybrid, an unknown one), from
// config.json and from a GGUF's general.architecture.
TEST(Families, UnsupportedArchitectureNamesWhatIsMissing) {
  auto refusal = [&](const char* cls, const char* type) {
    const std::string dir = edited_qwen3(
        [&](nlohmann::json& j) {
          j["architectures"] = {cls};
          j["model_type"] = type;
        },
        "unsupported_arch");
    MemoryTracker tr;
    try {
      load_model(&tr, dir, keep());
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), QLFT_ERR_UNSUPPORTED);
      return std::string(e.what());
    }
    ADD_FAILURE() << cls << " loaded";
    return std::string();
  };
  std::string m = refusal("Qwen3NextForCausalLM", "qwen3_next");
  EXPECT_NE(m.find("'Qwen3NextForCausalLM' (model_type 'qwen3_next')"), std::string::npos) << m;
  EXPECT_NE(m.find("hybrid linear-attention layers (Gated DeltaNet)"), std::string::npos) << m;
  EXPECT_NE(m.find("qlft trains llama, mistral, qwen2, qwen3"), std::string::npos) << m;
  m = refusal("JambaForCausalLM", "jamba");
  EXPECT_NE(m.find("Mamba state-space"), std::string::npos) << m;
  m = refusal("FooForCausalLM", "foo");
  EXPECT_NE(m.find("'FooForCausalLM' (model_type 'foo') is not one qlft trains"), std::string::npos)
      << m;
  EXPECT_NE(unsupported_architecture("", "mamba").find("state-space (Mamba) layers"),
            std::string::npos);
}

// The planner knows the q / k norms: the weight footprint of the file (GGUF and safetensors,
// with NF4 quantization) is what loading holds, group by group, and the runner's footprint is
// the activations a training forward holds (the norms' inputs and statistics per layer).
TEST(Families, Qwen3PlannerCountsQkNorms) {
  for (const char* file : {"syn_qwen3", "syn_qwen3.gguf"}) {
    SCOPED_TRACE(file);
    MemoryTracker tr;
    LoadOptions o;  // NF4, as training loads
    auto m = load_model(&tr, family_fixture(file), o);
    ModelConfig mc;
    const WeightFootprint f = weight_footprint_of_file(family_fixture(file), o, &mc);
    const WeightFootprint l = weight_footprint(*m);
    EXPECT_EQ(f.bytes, tr.snapshot().allocated[size_t(MemCategory::Weights)]);
    ASSERT_EQ(f.groups.size(), l.groups.size());
    for (size_t g = 0; g < f.groups.size(); ++g) {  // the same buffers (a quantized weight's
      std::vector<uint64_t> a = f.groups[g], b = l.groups[g];  // parts in another order)
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      EXPECT_EQ(a, b) << "group " << g;
    }
    EXPECT_TRUE(mc.qk_norm);
  }
  MemoryTracker tr;
  auto m = load_model(&tr, family_fixture("syn_qwen3"), keep());
  Fixture f(family_fixture("syn_qwen3.lora.safetensors"));
  auto be = make_cpu_backend(&tr);
  LoraAdapter lora(&tr, m->shapes, lora_config_of(f));
  std::vector<int32_t> tok, tgt;
  TokenBatch b = batch_of(f, tok, &tgt);
  const uint64_t before = tr.snapshot().allocated[size_t(MemCategory::Activations)];
  LlamaRunner run(*m, *be, &lora);
  run.forward(b);
  const uint64_t held = tr.snapshot().allocated[size_t(MemCategory::Activations)] - before;
  const RunnerFootprint fp = LlamaRunner::footprint(m->shapes, lora.config().r, kProjCount,
                                                    b.rows(), true, false, DType::F32);
  EXPECT_EQ(held, fp.activations(m->cfg.n_layers, 0));
  ModelShapes no_norms = m->shapes;
  for (LayerShapes& l : no_norms.layers) l.qk_norm = 0;
  EXPECT_LT(LlamaRunner::footprint(no_norms, lora.config().r, kProjCount, b.rows(), true, false,
                                   DType::F32)
                .activations(m->cfg.n_layers, 0),
            held)
      << "the q / k norms' activations are counted";
}

// Phi-3: q / k / v and gate / up are row blocks of qkv_proj / gate_up_proj (llama.cpp's attn_qkv
// / ffn_up), split on load; LoRA on o_proj and down_proj as PEFT names them; merged exports
// write the fused matrices back.
TEST(Families, Phi3FusedProjectionsMatchTransformersAndPeft) {
  check_family("phi3");
}

TEST(Families, Phi3ExportsLoadInPeft) {
  check_exports("phi3");
}

// LoRA on a fused projection is refused naming it and what to target instead; NF4 loads split
// the fused matrices before quantizing (the planner's footprint from the file agrees).
TEST(Families, Phi3FusedTargetsRefusedAndQuantizedLoad) {
  MemoryTracker tr;
  auto m = load_model(&tr, family_fixture("syn_phi3"), keep());
  LoraConfig c;
  c.r = 4;
  c.set_targets("q_proj,o_proj");
  try {
    LoraAdapter a(&tr, m->shapes, c);
    ADD_FAILURE() << "q_proj on phi3 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("one qkv_proj"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not q_proj"), std::string::npos) << e.what();
  }
  for (const char* file : {"syn_phi3", "syn_phi3.gguf"}) {
    SCOPED_TRACE(file);
    MemoryTracker t2;
    LoadOptions o;  // NF4
    auto q = load_model(&t2, family_fixture(file), o);
    ModelConfig mc;
    EXPECT_EQ(weight_footprint_of_file(family_fixture(file), o, &mc).bytes,
              t2.snapshot().allocated[size_t(MemCategory::Weights)]);
    // Each split projection is the NF4 quantization of its own rows of the fused matrix (as
    // the f32 model holds them): the same codes as quantizing those rows alone.
    for (int l = 0; l < m->cfg.n_layers; ++l)
      for (int p = 0; p < kProjCount; ++p) {
        const QWeight& k = m->layers[size_t(l)].proj[p];
        std::vector<float> rows(size_t(k.numel())), got(rows.size()), want(rows.size());
        k.dequantize_rows(0, k.rows, rows.data());
        QWeight ref = qweight_from_f32(&t2, rows.data(), k.rows, k.cols, QuantKind::NF4,
                                       o.blocksize, o.double_quant);
        ref.dequantize_rows(0, ref.rows, want.data());
        q->layers[size_t(l)].proj[p].dequantize_rows(0, k.rows, got.data());
        EXPECT_EQ(got, want) << "layer " << l << " " << proj_peft_name(static_cast<Proj>(p));
      }
  }
}

// Done-when 4 (the families qlft trains): the planner plans the real Qwen3-8B and Phi-4 from
// their config.json alone (as published: bf16, no weights here); Gemma-3-12B is refused naming
// what qlft lacks for it (Mixtral-8x7B: Families.MixtralPlansFromItsConfig).
TEST(Families, PlansRealConfigsFromConfigJsonAlone) {
  auto config_dir = [](const nlohmann::json& j, const char* tag) {
    const std::string dir = qlft_test::temp_dir(tag), text = j.dump();
    qlft_test::write_file(dir + "/config.json", text.data(), text.size());
    return dir;
  };
  const nlohmann::json qwen3_8b = {{"architectures", {"Qwen3ForCausalLM"}},
                                   {"model_type", "qwen3"},
                                   {"hidden_size", 4096},
                                   {"intermediate_size", 12288},
                                   {"num_hidden_layers", 36},
                                   {"num_attention_heads", 32},
                                   {"num_key_value_heads", 8},
                                   {"head_dim", 128},
                                   {"vocab_size", 151936},
                                   {"max_position_embeddings", 40960},
                                   {"rope_theta", 1000000},
                                   {"rms_norm_eps", 1e-6},
                                   {"tie_word_embeddings", false},
                                   {"sliding_window", nullptr},
                                   {"use_sliding_window", false},
                                   {"max_window_layers", 36},
                                   {"torch_dtype", "bfloat16"}};
  const nlohmann::json phi4 = {{"architectures", {"Phi3ForCausalLM"}},
                               {"model_type", "phi3"},
                               {"hidden_size", 5120},
                               {"intermediate_size", 17920},
                               {"num_hidden_layers", 40},
                               {"num_attention_heads", 40},
                               {"num_key_value_heads", 10},
                               {"vocab_size", 100352},
                               {"max_position_embeddings", 16384},
                               {"original_max_position_embeddings", 16384},
                               {"rope_theta", 250000},
                               {"rms_norm_eps", 1e-5},
                               {"tie_word_embeddings", false},
                               {"sliding_window", nullptr},
                               {"torch_dtype", "bfloat16"}};
  LoadOptions o;  // NF4
  ModelConfig c;
  WeightFootprint w = weight_footprint_of_file(config_dir(qwen3_8b, "qwen3_8b"), o, &c);
  EXPECT_EQ(c.arch, "qwen3");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.sliding_window, 0);
  ModelShapes s = model_shapes(c);
  EXPECT_EQ(s.q_dim(), 4096);
  EXPECT_EQ(s.layers[0].qk_norm, 128);
  // Each layer: 2 norms [4096], 7 NF4 projections (several buffers each), q / k norms [128].
  EXPECT_EQ(std::count(w.groups[1].begin(), w.groups[1].end(), uint64_t(128 * 4)), 2);
  // Independently of the planner: f32 embedding and head (8 V D bytes) and NF4 projections at
  // half a byte per weight plus bitsandbytes' 8-bit double-quant absmax per 64 (1/64 byte), to
  // within 1% (the nested fp32 scales, the norms).
  auto expect_nf4 = [](const WeightFootprint& f, const ModelShapes& m) {
    double lin = 0;
    for (int l = 0; l < m.n_layers; ++l)
      for (int p = 0; p < kProjCount; ++p)
        lin += double(m.proj(l, Proj(p)).out) * double(m.proj(l, Proj(p)).in);
    const double want = 8.0 * m.vocab * m.dim + lin * (0.5 + 1.0 / 64);
    std::printf("[family] %s NF4 weights %.3f GB (expected %.3f)\n", m.arch.c_str(),
                double(f.bytes) / 1e9, want / 1e9);
    EXPECT_NEAR(double(f.bytes), want, 0.01 * want);
  };
  expect_nf4(w, s);
  w = weight_footprint_of_file(config_dir(phi4, "phi4"), o, &c);
  EXPECT_EQ(c.arch, "phi3");
  s = model_shapes(c);
  EXPECT_EQ(s.proj(0, Proj::K).out, 1280);
  expect_nf4(w, s);
  // google/gemma-2-9b's config.json (its model card's; transformers 4.42: no layer_types, so
  // even layers slide; no tie_word_embeddings, so tied as Gemma2Config defaults).
  const nlohmann::json gemma2_9b = {{"architectures", {"Gemma2ForCausalLM"}},
                                    {"attention_bias", false},
                                    {"attn_logit_softcapping", 50.0},
                                    {"final_logit_softcapping", 30.0},
                                    {"head_dim", 256},
                                    {"hidden_act", "gelu_pytorch_tanh"},
                                    {"hidden_activation", "gelu_pytorch_tanh"},
                                    {"hidden_size", 3584},
                                    {"intermediate_size", 14336},
                                    {"max_position_embeddings", 8192},
                                    {"model_type", "gemma2"},
                                    {"num_attention_heads", 16},
                                    {"num_hidden_layers", 42},
                                    {"num_key_value_heads", 8},
                                    {"query_pre_attn_scalar", 256},
                                    {"rms_norm_eps", 1e-6},
                                    {"rope_theta", 10000.0},
                                    {"sliding_window", 4096},
                                    {"torch_dtype", "float32"},
                                    {"vocab_size", 256000}};
  w = weight_footprint_of_file(config_dir(gemma2_9b, "gemma2_9b"), o, &c);
  EXPECT_EQ(c.arch, "gemma2");
  EXPECT_TRUE(c.gemma);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.attn_softcap, 50.f);
  EXPECT_EQ(c.final_softcap, 30.f);
  s = model_shapes(c);
  EXPECT_EQ(s.q_dim(), 4096);  // head_dim 256, not 3584 / 16
  EXPECT_EQ(s.layers[0].window, 4096);
  EXPECT_EQ(s.layers[1].window, 0);
  EXPECT_EQ(s.layers[0].post_norm, 3584);
  // Four norms [3584] a layer.
  EXPECT_EQ(std::count(w.groups[1].begin(), w.groups[1].end(), uint64_t(3584 * 4)), 4);
  {  // tied: one f32 [V, D] table (4 V D bytes), NF4 projections as above
    double lin = 0;
    for (int l = 0; l < s.n_layers; ++l)
      for (int p = 0; p < kProjCount; ++p)
        lin += double(s.proj(l, Proj(p)).out) * double(s.proj(l, Proj(p)).in);
    const double want = 4.0 * s.vocab * s.dim + lin * (0.5 + 1.0 / 64);
    std::printf("[family] gemma2-9b NF4 weights %.3f GB (expected %.3f)\n", double(w.bytes) / 1e9,
                want / 1e9);
    EXPECT_NEAR(double(w.bytes), want, 0.01 * want);
  }
  // google/gemma-3-1b-it's config.json (Gemma3ForCausalLM; transformers 4.50 keys: no
  // layer_types, sliding_window_pattern 6, rope_local_base_freq, rope_scaling null).
  const nlohmann::json gemma3_1b = {{"architectures", {"Gemma3ForCausalLM"}},
                                    {"attention_bias", false},
                                    {"attn_logit_softcapping", nullptr},
                                    {"final_logit_softcapping", nullptr},
                                    {"head_dim", 256},
                                    {"hidden_activation", "gelu_pytorch_tanh"},
                                    {"hidden_size", 1152},
                                    {"intermediate_size", 6912},
                                    {"max_position_embeddings", 32768},
                                    {"model_type", "gemma3_text"},
                                    {"num_attention_heads", 4},
                                    {"num_hidden_layers", 26},
                                    {"num_key_value_heads", 1},
                                    {"query_pre_attn_scalar", 256},
                                    {"rms_norm_eps", 1e-6},
                                    {"rope_local_base_freq", 10000},
                                    {"rope_scaling", nullptr},
                                    {"rope_theta", 1000000},
                                    {"sliding_window", 512},
                                    {"sliding_window_pattern", 6},
                                    {"torch_dtype", "bfloat16"},
                                    {"vocab_size", 262144}};
  w = weight_footprint_of_file(config_dir(gemma3_1b, "gemma3_1b"), o, &c);
  EXPECT_EQ(c.arch, "gemma3_text");
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.attn_softcap, 0.f);
  EXPECT_EQ(c.rope_local_theta, 10000.f);
  EXPECT_EQ(c.rope_theta, 1000000.f);
  s = model_shapes(c);
  int sliding = 0;
  for (const LayerShapes& l : s.layers) sliding += l.window == 512;
  EXPECT_EQ(sliding, 22);  // layers 5, 11, 17, 23 are global
  EXPECT_EQ(s.layers[5].window, 0);
  EXPECT_EQ(s.layers[0].qk_norm, 256);
  EXPECT_EQ(s.layers[0].post_norm, 1152);
  {  // tied: one f32 [V, D] table, NF4 projections (the norms within the 1%)
    double lin = 0;
    for (int l = 0; l < s.n_layers; ++l)
      for (int p = 0; p < kProjCount; ++p)
        lin += double(s.proj(l, Proj(p)).out) * double(s.proj(l, Proj(p)).in);
    const double want = 4.0 * s.vocab * s.dim + lin * (0.5 + 1.0 / 64);
    std::printf("[family] gemma3-1b NF4 weights %.3f GB (expected %.3f)\n", double(w.bytes) / 1e9,
                want / 1e9);
    EXPECT_NEAR(double(w.bytes), want, 0.01 * want);
  }
  // google/gemma-3-12b-it's config.json (Gemma3ForConditionalGeneration, model_type gemma3; as
  // mirrored with its weights quantized at
  // https://huggingface.co/mlx-community/gemma-3-12b-pt-4bit/blob/refs%2Fpr%2F1/config.json, the
  // quantization block left out): text_config names eight keys, the rest are Gemma3TextConfig's
  // defaults. It plans as its text model; the vision tower is not counted.
  const nlohmann::json gemma3_12b = {{"architectures", {"Gemma3ForConditionalGeneration"}},
                                     {"boi_token_index", 255999},
                                     {"eoi_token_index", 256000},
                                     {"eos_token_id", {1, 106}},
                                     {"image_token_index", 262144},
                                     {"initializer_range", 0.02},
                                     {"mm_tokens_per_image", 256},
                                     {"model_type", "gemma3"},
                                     {"text_config",
                                      {{"hidden_size", 3840},
                                       {"intermediate_size", 15360},
                                       {"model_type", "gemma3_text"},
                                       {"num_attention_heads", 16},
                                       {"num_hidden_layers", 48},
                                       {"num_key_value_heads", 8},
                                       {"rope_scaling", {{"factor", 8.0}, {"rope_type", "linear"}}},
                                       {"sliding_window", 1024}}},
                                     {"torch_dtype", "bfloat16"},
                                     {"transformers_version", "4.50.0.dev0"},
                                     {"vision_config",
                                      {{"hidden_size", 1152},
                                       {"image_size", 896},
                                       {"intermediate_size", 4304},
                                       {"model_type", "siglip_vision_model"},
                                       {"num_attention_heads", 16},
                                       {"num_hidden_layers", 27},
                                       {"patch_size", 14},
                                       {"vision_use_head", false}}}};
  w = weight_footprint_of_file(config_dir(gemma3_12b, "gemma3_12b"), o, &c);
  EXPECT_EQ(c.arch, "gemma3_text");
  EXPECT_TRUE(c.image_text);
  EXPECT_EQ(c.hf_prefix, "model.language_model.");
  EXPECT_TRUE(c.tied_embeddings);  // Gemma3Config's default
  EXPECT_EQ(c.vocab, 262208);      // Gemma3TextConfig's defaults from here
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.context_length, 131072);
  EXPECT_EQ(c.attn_scalar, 256.f);
  EXPECT_EQ(c.rope_theta, 1000000.f);
  EXPECT_EQ(c.rope_local_theta, 10000.f);    // the sliding layers' plain base
  EXPECT_EQ(c.rope.type, RopeType::Linear);  // the full layers' (rope_of)
  EXPECT_EQ(c.rope.factor, 8.0);
  s = model_shapes(c);
  EXPECT_EQ(s.n_layers, 48);
  EXPECT_EQ(s.proj(0, Proj::Q).out, 16 * 256);
  EXPECT_EQ(s.proj(0, Proj::Q).in, 3840);
  EXPECT_EQ(s.proj(0, Proj::K).out, 8 * 256);
  EXPECT_EQ(s.proj(0, Proj::Down).in, 15360);
  sliding = 0;
  for (const LayerShapes& l : s.layers) sliding += l.window == 1024;
  EXPECT_EQ(sliding, 40);  // every sixth layer (5, 11, ..., 47) is global
  EXPECT_EQ(s.layers[47].window, 0);
  EXPECT_NE(describe_deltas(c, s).find("vision tower and projector not loaded"), std::string::npos);
  {  // tied: one f32 [V, D] table, NF4 projections: 48 x (3840 x (4096 + 2 x 2048) + 4096 x
     // 3840 + 3 x 3840 x 15360) = 11.04e9 parameters (the norms within the 1%)
    const double lin = 48.0 * (3840.0 * (4096 + 2 * 2048) + 4096.0 * 3840 + 3.0 * 3840 * 15360);
    const double want = 4.0 * 262208 * 3840 + lin * (0.5 + 1.0 / 64);
    std::printf("[family] gemma-3-12b-it NF4 weights %.3f GB (expected %.3f)\n",
                double(w.bytes) / 1e9, want / 1e9);
    EXPECT_NEAR(double(w.bytes), want, 0.01 * want);
  }
  // A text_config of another model type is refused naming it; Qwen2-MoE names its experts.
  {
    nlohmann::json j = gemma3_12b;
    j["text_config"]["model_type"] = "gemma2";
    try {
      weight_footprint_of_file(config_dir(j, "gemma3_bad_text"), o, &c);
      ADD_FAILURE() << "a gemma2 text_config was planned";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("text_config.model_type is 'gemma2'"), std::string::npos)
          << e.what();
    }
  }
  for (const auto& [cls, type, says] :
       {std::tuple{"Qwen2MoeForCausalLM", "qwen2_moe", "mixture-of-experts layers"}}) {
    nlohmann::json j = qwen3_8b;
    j["architectures"] = {cls};
    j["model_type"] = type;
    try {
      weight_footprint_of_file(config_dir(j, "refused"), o, &c);
      ADD_FAILURE() << cls << " was planned";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), QLFT_ERR_UNSUPPORTED);
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  }
}

// Mixtral (MixtralForCausalLM: 2 layers, 4 experts, top-2; its files as transformers 5 saves
// them, block_sparse_moe.experts.{e}.w1 / w2 / w3): logits, loss and the attention projections'
// LoRA gradients against PEFT (through the experts and the routing weights to the hidden
// states), the base model's logits and greedy generation against transformers.
TEST(Families, MixtralMatchesTransformersAndPeft) {
  Fixture f(family_fixture("syn_mixtral.lora.safetensors"));
  // Routing decisions further apart than fp32 rounding, so parity means the same experts.
  EXPECT_GT(std::stod(f.meta("routing_min_margin")), 1e-5);
  check_family("mixtral");  // and llama.cpp's GGUF ("llama" with stacked experts)
}

// The PEFT adapter's names and the merged safetensors export (experts and router written as
// Mixtral's files name them) against merge_and_unload; the merged GGUF ("llama" with stacked
// ffn_*_exps and ffn_gate_inp) loads back with those logits and is laid out as gguf-py's.
TEST(Families, MixtralExportsLoadInPeft) {
  check_exports("mixtral");
  expect_gguf_like_fixture("mixtral");
}

// The shape table's expert rows, checkpointing (the recomputed layer routes again) and 16-bit
// storage, and what is refused: LoRA on the absent dense MLP, the aux loss, router jitter.
TEST(Families, MixtralShapesCheckpointingAndRefusals) {
  set_num_threads(1);
  MemoryTracker tr;
  auto model = load_model(&tr, family_fixture("syn_mixtral"), keep());
  const LayerShapes& ls = model->shapes.layers[1];
  EXPECT_EQ(ls.n_experts, 4);
  EXPECT_EQ(ls.top_k, 2);
  EXPECT_EQ(ls.expert_ffn, 48);
  EXPECT_EQ(ls.proj[int(Proj::Gate)].out, 0);  // no dense MLP
  EXPECT_EQ(model->layers[1].moe.w2.size(), 4u);
  EXPECT_EQ(model->layers[1].moe.w2[3].rows, 32);
  EXPECT_EQ(model->layers[1].moe.router.rows, 4);
  // 2 layers x (4 attention projections + router + 4 experts x 3) + norms, embedding, head.
  const uint64_t lin = 2 * (32 * 32 * 2 + 16 * 32 * 2 + 4 * 32 + 4 * 3 * 48 * 32);
  EXPECT_EQ(model->n_params(), lin + 2 * 160 * 32 + 5 * 32);
  Fixture f(family_fixture("syn_mixtral.lora.safetensors"));
  auto be = make_cpu_backend(&tr);
  LoraAdapter lora(&tr, model->shapes, lora_config_of(f));
  load_lora(f, lora);
  LlamaRunner run(*model, *be, &lora);
  std::vector<int32_t> tok, tgt;
  TokenBatch b = batch_of(f, tok, &tgt);
  auto grads = [&] {
    lora.zero_grad();
    run.forward(b);
    run.backward();
    std::vector<float> g;
    for (auto& p : lora.params()) g.insert(g.end(), p.g, p.g + p.n);
    return g;
  };
  const std::vector<float> g0 = grads();
  run.set_checkpoint_all(true);
  EXPECT_EQ(grads(), g0) << "checkpointed";
  run.set_checkpoint_all(false);
  run.set_activation_dtype(DType::BF16);
  const std::vector<float> g16 = grads();
  const double e = max_rel_error(g16.data(), g0.data(), g0.size());
  std::printf("[family] mixtral bf16 storage vs fp32 gradients: %.3g\n", e);
  EXPECT_LT(e, 3e-2);
  EXPECT_GT(e, 0.0);

  LoraConfig mlp = lora_config_of(f);
  mlp.set_targets("q_proj,gate_proj");
  try {
    LoraAdapter bad(&tr, model->shapes, mlp);
    ADD_FAILURE() << "LoRA on mixtral's gate_proj was made";
  } catch (const Error& err) {
    EXPECT_NE(
        std::string(err.what()).find("gate_proj (w1) without up_proj (w3) on mixtral's layer 0"),
        std::string::npos)
        << err.what();
  }
  // A copy of syn_mixtral with config.json edited: each refused naming the key.
  auto edited = [](const char* key, const nlohmann::json& v) {
    return edited_model_dir(
        family_fixture("syn_mixtral"), [&](nlohmann::json& j) { j[key] = v; }, "mixtral");
  };
  // (output_router_logits true loads: the load-balancing loss, test_moe_aux.)
  for (const auto& [key, v] : {std::pair<const char*, nlohmann::json>{"router_jitter_noise", 0.01},
                               {"num_experts_per_tok", 5}}) {
    try {
      load_model(&tr, edited(key, v), keep());
      ADD_FAILURE() << key << " " << v.dump() << " loaded";
    } catch (const Error& err) {
      EXPECT_EQ(err.status(), QLFT_ERR_FORMAT);
      EXPECT_NE(std::string(err.what()).find(key), std::string::npos) << err.what();
    }
  }
}

// Done-when 4 for Mixtral-8x7B (mistralai/Mixtral-8x7B-v0.1's config.json, bf16, no weights):
// the planner counts all eight experts resident (NF4), and inspect's deltas name them.
TEST(Families, MixtralPlansFromItsConfig) {
  const nlohmann::json mixtral = {{"architectures", {"MixtralForCausalLM"}},
                                  {"attention_dropout", 0.0},
                                  {"bos_token_id", 1},
                                  {"eos_token_id", 2},
                                  {"hidden_act", "silu"},
                                  {"hidden_size", 4096},
                                  {"initializer_range", 0.02},
                                  {"intermediate_size", 14336},
                                  {"max_position_embeddings", 32768},
                                  {"model_type", "mixtral"},
                                  {"num_attention_heads", 32},
                                  {"num_experts_per_tok", 2},
                                  {"num_hidden_layers", 32},
                                  {"num_key_value_heads", 8},
                                  {"num_local_experts", 8},
                                  {"output_router_logits", false},
                                  {"rms_norm_eps", 1e-5},
                                  {"rope_theta", 1e6},
                                  {"router_aux_loss_coef", 0.02},
                                  {"sliding_window", nullptr},
                                  {"tie_word_embeddings", false},
                                  {"torch_dtype", "bfloat16"},
                                  {"use_cache", true},
                                  {"vocab_size", 32000}};
  const std::string dir = qlft_test::temp_dir("mixtral_8x7b"), text = mixtral.dump();
  qlft_test::write_file(dir + "/config.json", text.data(), text.size());
  LoadOptions o;  // NF4
  ModelConfig c;
  WeightFootprint w = weight_footprint_of_file(dir, o, &c);
  EXPECT_EQ(c.arch, "mixtral");
  EXPECT_EQ(c.moe.n_experts, 8);
  const ModelShapes s = model_shapes(c);
  // Independently of the planner: f32 embedding and head, NF4 attention and experts at half a
  // byte per weight plus the 8-bit absmax per 64, the f32 routers; to within 1%.
  const double attn = 2.0 * 4096 * 4096 + 2.0 * 1024 * 4096, experts = 8 * 3.0 * 14336 * 4096;
  const double want =
      8.0 * 32000 * 4096 + 32 * ((attn + experts) * (0.5 + 1.0 / 64) + 8 * 4096 * 4);
  std::printf("[family] mixtral-8x7b NF4 weights %.3f GB (expected %.3f)\n", double(w.bytes) / 1e9,
              want / 1e9);
  EXPECT_NEAR(double(w.bytes), want, 0.01 * want);
  const std::string d = describe_deltas(c, s);
  EXPECT_NE(d.find("mixture of experts: 8 experts of width 14336, top 2 renormalised on 32 of 32 "
                   "layers"),
            std::string::npos)
      << d;
}

// Qwen3-MoE (Qwen3MoeForCausalLM: qwen3's q / k norms; experts on layers 0 and 2, layer 1 dense
// by mlp_only_layers; 4 experts of moe_intermediate_size 24, top-2 NOT renormalised as
// norm_topk_prob false says): logits, loss, LoRA gradients, base logits and greedy generation
// against transformers + PEFT, and the merged export against merge_and_unload.
TEST(Families, Qwen3MoeMatchesTransformersAndPeft) {
  Fixture f(family_fixture("syn_qwen3_moe.lora.safetensors"));
  EXPECT_GT(std::stod(f.meta("routing_min_margin")), 1e-5);
  check_family("qwen3_moe");  // and llama.cpp's "qwen3moe" GGUF
  for (const char* file : {"syn_qwen3_moe", "syn_qwen3_moe.gguf"}) {
    SCOPED_TRACE(file);
    MemoryTracker tr;
    auto m = load_model(&tr, family_fixture(file), keep());
    EXPECT_TRUE(m->shapes.qk_norm());
    EXPECT_TRUE(m->shapes.layers[0].moe());
    EXPECT_FALSE(m->shapes.layers[1].moe());  // mlp_only_layers
    EXPECT_EQ(m->shapes.proj(1, Proj::Gate).out, 64);
    EXPECT_EQ(m->shapes.layers[2].expert_ffn, 24);
    EXPECT_FALSE(m->shapes.layers[2].norm_topk);
    EXPECT_EQ(m->layers[2].moe.w3[1].rows, 24);
  }
}

namespace {
// A copy of a family GGUF fixture without the metadata keys in drop, with edit's keys added.
std::string edited_gguf(const std::string& file, const std::set<std::string>& drop,
                        const std::function<void(GgufWriter&)>& edit, const char* tag) {
  auto g = GgufFile::open(family_fixture(file));
  GgufWriter w;
  for (const auto& [k, v] : g->metadata())
    if (!drop.count(k) && k != "general.alignment") w.add_value(k, v);
  if (edit) edit(w);
  for (const GgufTensorInfo& t : g->tensors())
    w.add_tensor(t.name, static_cast<GgmlType>(t.type),
                 std::vector<int64_t>(t.ne, t.ne + std::max<uint32_t>(t.n_dims, 1)), t.data,
                 t.nbytes);
  const std::string out = qlft_test::temp_dir(tag) + "/" + file;
  w.write(out);
  return out;
}
}  // namespace

// llama.cpp's rules where its GGUF keys are silent, each against the rule as llama.cpp states
// it (the fixtures above carry the keys that make them transformers' models): gemma3 slides
// layer i unless (i + 1) % 6 == 0 and scales scores by head_dim^-0.5; qwen3moe and mixtral
// renormalise the top-k weights; routing other than softmax and shared experts are refused by
// key; expert tensors on a family without experts are refused. The planner's GGUF footprint of
// each MoE file equals what the load holds and, buffer by buffer, the safetensors footprint.
TEST(Families, MoeAndGemma3GgufFollowLlamaCppsDefaults) {
  MemoryTracker tr;
  auto gm = load_model(&tr, family_fixture("syn_gemma3.gguf"), keep());
  EXPECT_EQ(gm->cfg.arch, "gemma3_text");
  EXPECT_EQ(gm->cfg.sliding_layers, (std::vector<bool>{true, true, false}));
  EXPECT_EQ(gm->cfg.rope_local_theta, 10000.f);
  EXPECT_EQ(gm->cfg.rope.type, RopeType::Linear);
  EXPECT_NEAR(gm->cfg.attn_scalar, 24.f, 1e-4);
  auto g6 =
      load_model(&tr,
                 edited_gguf("syn_gemma3.gguf",
                             {"gemma3.attention.sliding_window_pattern", "gemma3.attention.scale"},
                             nullptr, "gemma3_default"),
                 keep());
  EXPECT_EQ(g6->cfg.sliding_layers, (std::vector<bool>{true, true, true}));
  EXPECT_EQ(g6->cfg.attn_scalar, 16.f);  // head_dim

  auto qm = load_model(
      &tr,
      edited_gguf("syn_qwen3_moe.gguf", {"qwen3moe.expert_weights_norm"}, nullptr, "qwen3moe_norm"),
      keep());
  EXPECT_TRUE(qm->shapes.layers[0].norm_topk);
  EXPECT_EQ(qm->cfg.moe.layers, (std::vector<bool>{true, false, true}));
  auto mx = load_model(&tr, family_fixture("syn_mixtral.gguf"), keep());
  EXPECT_EQ(mx->cfg.arch, "mixtral");
  EXPECT_TRUE(mx->cfg.rope_adjacent);
  EXPECT_TRUE(mx->cfg.moe.layers.empty());  // every layer
  EXPECT_EQ(mx->cfg.moe.expert_ffn, 48);
  EXPECT_TRUE(mx->shapes.layers[1].norm_topk);

  const std::pair<const char*, std::function<void(GgufWriter&)>> bad[] = {
      {"qwen3moe.expert_gating_func",
       [](GgufWriter& w) { w.add_u32("qwen3moe.expert_gating_func", 2); }},
      {"qwen3moe.expert_shared_count",
       [](GgufWriter& w) { w.add_u32("qwen3moe.expert_shared_count", 1); }},
  };
  for (const auto& [key, edit] : bad) {
    try {
      load_model(&tr, edited_gguf("syn_qwen3_moe.gguf", {}, edit, "qwen3moe_bad"), keep());
      ADD_FAILURE() << key << " loaded";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), QLFT_ERR_UNSUPPORTED);
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
  try {  // qwen3's architecture with experts
    load_model(
        &tr,
        edited_gguf(
            "syn_qwen3_moe.gguf", {"general.architecture"},
            [](GgufWriter& w) { w.add_string("general.architecture", "qwen3"); }, "qwen3_experts"),
        keep());
    ADD_FAILURE() << "qwen3 with experts loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(e.what()).find("ffn_gate_exps"), std::string::npos) << e.what();
  }

  for (const char* file : {"syn_mixtral.gguf", "syn_qwen3_moe.gguf"})
    for (bool nf4 : {false, true}) {
      SCOPED_TRACE(std::string(file) + (nf4 ? " nf4" : " keep"));
      MemoryTracker t2;
      const LoadOptions o = nf4 ? LoadOptions{} : keep();
      auto m = load_model(&t2, family_fixture(file), o);
      ModelConfig mc;
      const WeightFootprint f = weight_footprint_of_file(family_fixture(file), o, &mc);
      EXPECT_EQ(f.bytes, t2.snapshot().allocated[size_t(MemCategory::Weights)]);
      std::string dir = family_fixture(file);  // the same model's safetensors
      dir.resize(dir.size() - 5);
      ModelConfig hc;
      const WeightFootprint l = weight_footprint_of_file(dir, o, &hc);
      EXPECT_EQ(f.bytes, l.bytes);
      ASSERT_EQ(f.groups.size(), l.groups.size());
      for (size_t g = 0; g < f.groups.size(); ++g) {
        std::vector<uint64_t> a = f.groups[g], b = l.groups[g];
        std::sort(a.begin(), a.end());
        std::sort(b.begin(), b.end());
        EXPECT_EQ(a, b) << "group " << g;
      }
    }
}

// llama.cpp's Phi-3 LongRoPE GGUF needs both factor tensors and the original context length
// (RopeScaling.LongRopePhi3GgufMatchesTransformers loads the whole one): one tensor alone is a
// format error naming the missing one, and the pair without
// phi3.rope.scaling.original_context_length names that key; the file without them loads.
TEST(Families, Phi3LongRopeGgufIncompleteRefusedByName) {
  MemoryTracker tr;
  EXPECT_NO_THROW(load_model(&tr, edited_gguf("syn_phi3.gguf", {}, nullptr, "phi3_plain"), keep()));
  const std::vector<float> f(4, 1.5f);  // head_dim 8: one divisor per pair
  const char* names[] = {"rope_factors_long.weight", "rope_factors_short.weight"};
  for (int i = 0; i < 3; ++i) {
    const std::string want = i < 2 ? names[1 - i] : "phi3.rope.scaling.original_context_length";
    try {
      load_model(&tr,
                 edited_gguf(
                     "syn_phi3.gguf", {},
                     [&](GgufWriter& w) {
                       for (int k = 0; k < 2; ++k)
                         if (i == 2 || k == i) w.add_tensor_f32(names[k], {4}, f.data());
                     },
                     "phi3_longrope"),
                 keep());
      ADD_FAILURE() << want << " not asked for";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), QLFT_ERR_FORMAT);
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

// The MoE GGUFs through the deferred load (ZeRO-3 / streaming): each weight group loaded again
// equals the full load's bytes (keep and NF4), and with quant.type=keep every group is read by
// byte range from the file, each expert a span inside its stacked tensor, equal to the full
// load's Buffer.
TEST(Families, MoeGgufGroupsReloadAndReadByRange) {
  for (const char* file : {"syn_mixtral.gguf", "syn_qwen3_moe.gguf"})
    for (const char* quant : {"keep", "nf4"}) {
      SCOPED_TRACE(std::string(file) + " " + quant);
      MemoryTracker tr;
      LoadOptions lo;
      lo.quant_type = qlft_test::quant_type(quant);
      auto full = load_model(&tr, family_fixture(file), lo);
      lo.deferred = true;
      auto lazy = load_model(&tr, family_fixture(file), lo);
      ASSERT_TRUE(lazy->stream);
      EXPECT_EQ(lazy->weight_bytes(), full->weight_bytes());
      auto bytes = [](Model& m, int g) {
        std::vector<std::vector<uint8_t>> out;
        for_each_weight_buffer(m, [&](int bg, Buffer& b) {
          if (bg != g) return;
          const auto* p = b.empty() ? nullptr : b.as<const uint8_t>();
          out.emplace_back(p, p ? p + b.size() : p);
        });
        return out;
      };
      auto src = WeightGroupSource::open(&tr, *lazy);
      const int G = full->cfg.n_layers + 2;
      if (std::string(quant) == "keep")
        for (int g = 1; g < G - 1; ++g) {  // the layers: every Buffer a span of the file
          const auto want = bytes(*full, g);
          const std::vector<size_t> sizes = src->stored_group(g, true);
          ASSERT_EQ(sizes.size(), want.size()) << "group " << g;
          for (size_t i = 0; i < sizes.size(); ++i) {
            ASSERT_EQ(sizes[i], want[i].size()) << "group " << g << " Buffer " << i;
            std::vector<uint8_t> got(sizes[i]);
            if (sizes[i]) src->read_stored(i, 0, sizes[i], got.data());
            EXPECT_EQ(got, want[i]) << "group " << g << " Buffer " << i;
          }
        }
      for (int g = 0; g < G; ++g) {
        src->load(*lazy, g, /*with_head=*/true);
        EXPECT_EQ(bytes(*lazy, g), bytes(*full, g)) << "group " << g;
      }
    }
}

TEST(Families, Qwen3MoeExportsLoadInPeft) {
  check_exports("qwen3_moe");
  expect_gguf_like_fixture("qwen3_moe");
}

// Done-when 4 for Qwen3-30B-A3B (Qwen/Qwen3-30B-A3B's config.json, bf16, no weights): 128
// experts of 768, top 8 renormalised, every layer; NF4 footprint against an independent count.
TEST(Families, Qwen3MoePlansFromItsConfig) {
  const nlohmann::json q = {{"architectures", {"Qwen3MoeForCausalLM"}},
                            {"attention_bias", false},
                            {"attention_dropout", 0.0},
                            {"bos_token_id", 151643},
                            {"decoder_sparse_step", 1},
                            {"eos_token_id", 151645},
                            {"head_dim", 128},
                            {"hidden_act", "silu"},
                            {"hidden_size", 2048},
                            {"initializer_range", 0.02},
                            {"intermediate_size", 6144},
                            {"max_position_embeddings", 40960},
                            {"max_window_layers", 48},
                            {"mlp_only_layers", nlohmann::json::array()},
                            {"model_type", "qwen3_moe"},
                            {"moe_intermediate_size", 768},
                            {"norm_topk_prob", true},
                            {"num_attention_heads", 32},
                            {"num_experts", 128},
                            {"num_experts_per_tok", 8},
                            {"num_hidden_layers", 48},
                            {"num_key_value_heads", 4},
                            {"output_router_logits", false},
                            {"rms_norm_eps", 1e-6},
                            {"rope_scaling", nullptr},
                            {"rope_theta", 1000000.0},
                            {"router_aux_loss_coef", 0.001},
                            {"sliding_window", nullptr},
                            {"tie_word_embeddings", false},
                            {"torch_dtype", "bfloat16"},
                            {"use_cache", true},
                            {"use_sliding_window", false},
                            {"vocab_size", 151936}};
  const std::string dir = qlft_test::temp_dir("qwen3_30b_a3b"), text = q.dump();
  qlft_test::write_file(dir + "/config.json", text.data(), text.size());
  LoadOptions o;  // NF4
  ModelConfig c;
  WeightFootprint w = weight_footprint_of_file(dir, o, &c);
  EXPECT_EQ(c.arch, "qwen3_moe");
  const ModelShapes s = model_shapes(c);
  EXPECT_TRUE(s.layers[47].moe());
  EXPECT_TRUE(s.layers[0].norm_topk);
  EXPECT_EQ(s.layers[0].n_experts, 128);
  const double attn = 2.0 * 4096 * 2048 + 2.0 * 512 * 2048, experts = 128 * 3.0 * 768 * 2048;
  const double want =
      8.0 * 151936 * 2048 + 48 * ((attn + experts) * (0.5 + 1.0 / 64) + 128 * 2048 * 4);
  std::printf("[family] qwen3-30b-a3b NF4 weights %.3f GB (expected %.3f)\n", double(w.bytes) / 1e9,
              want / 1e9);
  EXPECT_NEAR(double(w.bytes), want, 0.01 * want);
  const std::string d = describe_deltas(c, s);
  EXPECT_NE(d.find("q/k RMSNorm per head"), std::string::npos) << d;
  EXPECT_NE(d.find("mixture of experts: 128 experts of width 768, top 8 renormalised on 48 of 48"),
            std::string::npos)
      << d;
}
