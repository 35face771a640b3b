// LoRA on Phi-3's fused projections as PEFT does it (issue 48): target_modules qkv_proj, o_proj,
// gate_up_proj, down_proj, each fused module with ONE A [r, in] and one B over its parts' rows
// (q, k, v / gate, up). qlft splits the fused matrices on load; its adapter keeps one A per
// module, shared by the parts, and B split into the parts' row blocks (model/lora.h).
// Against tests/reference/gen_family_fixtures.py's syn_phi3.fused_lora.safetensors (PEFT 0.21.2
// on transformers' Phi3ForCausalLM, fp32): logits, loss and every module's gA / gB, from the
// safetensors model and the GGUF one; PEFT export with PEFT's tensor names, loaded back; PEFT's
// logits of qlft's committed export (the generator's second pass); merged export against
// merge_and_unload; llama.cpp's LoRA GGUF on attn_qkv / ffn_up.
//
// Regenerating the export fixtures: QLFT_WRITE_FAMILY_FIXTURES=1 ./test_phi3_lora
// --gtest_filter='*PeftLoadsOur*' writes fixtures/families/qlft_phi3_{fused,trained}/, then
// /opt/qlft-ref/bin/python tests/reference/gen_family_fixtures.py --phi3-exports.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "config/config_file.h"
#include "config/run_spec.h"
#include "core/threads.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "test_model_util.h"
#include "train/adapter_io.h"
#include "train/merge_export.h"
#include "train/trainer.h"

using namespace qlft;
using namespace model_test;
using qlft_test::max_rel_error;

namespace {

constexpr double kTol = 1e-4;
constexpr Proj kModules[] = {Proj::Q, Proj::O, Proj::Gate, Proj::Down};  // each module's first

std::string fam(const std::string& rel) {
  return qlft_test::fixture_path("families/" + rel);
}

std::string key_of(const LoraAdapter& a, int l, Proj first) {
  return "l" + std::to_string(l) + "." + a.module(first).peft + ".";
}

// The fixture's A / B of every module (PEFT's fused shapes) into the adapter.
void load_modules(const Fixture& f, LoraAdapter& a) {
  for (int l = 0; l < a.n_layers(); ++l)
    for (Proj p : kModules) {
      const std::string k = key_of(a, l, p);
      std::vector<float> A = f.f32(k + "A"), B = f.f32(k + "B");
      a.set_module_hf(l, p, A.data(), static_cast<int64_t>(A.size()), B.data(),
                      static_cast<int64_t>(B.size()));
    }
}

TokenBatch batch_of(const Fixture& f, std::vector<int32_t>& tok, std::vector<int32_t>& tgt) {
  tok = f.i32("tokens");
  tgt = f.i32("targets");
  auto shp = f.shape("tokens");
  TokenBatch b;
  b.batch = static_cast<int>(shp[0]);
  b.seq = static_cast<int>(shp[1]);
  b.tokens = tok.data();
  b.targets = tgt.data();
  return b;
}

std::vector<float> logits_of(const Model& m, LoraAdapter* lora, const TokenBatch& b) {
  MemoryTracker tr;
  auto be = make_cpu_backend(&tr);
  LlamaRunner run(m, *be, lora);
  std::vector<float> out(static_cast<size_t>(b.rows()) * m.cfg.vocab);
  run.logits(b, MatF(out.data(), b.rows(), m.cfg.vocab));
  return out;
}

struct Phi3Lora : ::testing::Test {
  void SetUp() override { set_num_threads(1); }  // tiny model: threads only add barrier waits
  Fixture f{fam("syn_phi3.fused_lora.safetensors")};
};

}  // namespace

// Logits, loss and every module's gradient equal PEFT's: the shared A's gradient is the sum of
// the three (two) parts' contributions, B's the parts' row blocks stacked.
TEST_F(Phi3Lora, FusedModulesMatchPeft) {
  for (const char* file : {"syn_phi3", "syn_phi3.gguf"}) {
    SCOPED_TRACE(file);
    MemoryTracker tr;
    auto model = load_model(&tr, fam(file), keep());
    ASSERT_EQ(model->cfg.arch, "phi3");
    LoraConfig c = lora_config_of(f);
    ASSERT_EQ(c.targets_string(), "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
    LoraAdapter lora(&tr, model->shapes, c);
    ASSERT_TRUE(lora.fused());
    load_modules(f, lora);
    auto be = make_cpu_backend(&tr);
    LlamaRunner run(*model, *be, &lora);
    std::vector<int32_t> tok, tgt;
    TokenBatch b = batch_of(f, tok, tgt);
    const int V = model->cfg.vocab;
    std::vector<float> logits(static_cast<size_t>(b.rows()) * V), ref = f.f32("logits");
    LossResult lr = run.logits(b, MatF(logits.data(), b.rows(), V));
    ASSERT_EQ(logits.size(), ref.size());
    EXPECT_LT(max_rel_error(logits.data(), ref.data(), ref.size()), kTol) << "logits";
    const double loss_ref = f.f32("loss")[0];
    EXPECT_NEAR(lr.mean(), loss_ref, kTol * std::fabs(loss_ref)) << "eval loss";
    EXPECT_NEAR(run.forward(b).mean(), loss_ref, kTol * std::fabs(loss_ref)) << "training loss";
    run.backward();
    int n = 0;
    double worst = 0;
    for (int l = 0; l < model->cfg.n_layers; ++l)
      for (Proj p : kModules)
        for (auto [part, name] :
             {std::pair{LoraAdapter::Part::dA, "gA"}, std::pair{LoraAdapter::Part::dB, "gB"}}) {
          const std::string k = key_of(lora, l, p) + name;
          std::vector<float> g = lora.get_module_hf(l, p, part), gr = f.f32(k);
          ASSERT_EQ(g.size(), gr.size()) << k;
          const double e = max_rel_error(g.data(), gr.data(), g.size());
          EXPECT_LT(e, kTol) << k;
          worst = std::max(worst, e);
          ++n;
        }
    EXPECT_EQ(n, 2 * 4 * model->cfg.n_layers);
    std::printf("[phi3 lora] %s: %d module gradients, worst normalized error %.2e\n", file, n,
                worst);
    // The optimizer sees one A per module: per layer 4 A (qkv, o, gate_up, down) and 7 B.
    EXPECT_EQ(lora.params().size(), static_cast<size_t>(11 * model->cfg.n_layers));
    uint64_t want = 0;
    for (int l = 0; l < model->cfg.n_layers; ++l)
      for (Proj p : kModules)
        want += lora.get_module_hf(l, p, LoraAdapter::Part::A).size() +
                lora.get_module_hf(l, p, LoraAdapter::Part::B).size();
    EXPECT_EQ(lora.n_params(), want);
  }
}

// qlft's PEFT export holds exactly PEFT's tensor names (recorded by the generator) and loads
// back; the merged export (safetensors, GGUF F16) gives merge_and_unload's logits; the llama.cpp
// LoRA GGUF names attn_qkv / ffn_up with the fused shapes.
TEST_F(Phi3Lora, ExportsAsPeftAndMergesAsPeft) {
  MemoryTracker tr;
  auto model = load_model(&tr, fam("syn_phi3"), keep());
  LoraAdapter lora(&tr, model->shapes, lora_config_of(f));
  load_modules(f, lora);
  const std::string dir = qlft_test::temp_dir("phi3_fused_export");
  save_peft_adapter(lora, dir + "/peft", "base");
  auto st = SafetensorsFile::open(dir + "/peft/adapter_model.safetensors");
  std::set<std::string> ours, peft;
  for (const SafeTensorInfo& t : st->tensors()) ours.insert(t.name);
  std::stringstream keys(f.meta("peft_keys"));
  for (std::string k; std::getline(keys, k, ',');) peft.insert(k);
  EXPECT_EQ(ours, peft) << "adapter tensor names";
  const SafeTensorInfo* qkv_b = nullptr;
  for (const SafeTensorInfo& t : st->tensors())
    if (t.name == "base_model.model.model.layers.1.self_attn.qkv_proj.lora_B.weight") qkv_b = &t;
  ASSERT_TRUE(qkv_b);
  EXPECT_EQ(qkv_b->shape, (std::vector<int64_t>{64, 4}));  // q 32 + k 16 + v 16 rows
  const std::vector<uint8_t> cfg = qlft_test::read_file(dir + "/peft/adapter_config.json");
  const std::string cfg_text(cfg.begin(), cfg.end());
  EXPECT_NE(cfg_text.find("\"qkv_proj\""), std::string::npos) << cfg_text;
  EXPECT_NE(cfg_text.find("\"gate_up_proj\""), std::string::npos) << cfg_text;
  EXPECT_EQ(cfg_text.find("\"q_proj\""), std::string::npos) << cfg_text;

  LoraAdapter back(&tr, model->shapes, read_peft_config(dir + "/peft"));
  load_peft_adapter(back, dir + "/peft");
  for (int l = 0; l < model->cfg.n_layers; ++l)
    for (Proj p : kModules)
      for (auto [part, name] :
           {std::pair{LoraAdapter::Part::A, "A"}, std::pair{LoraAdapter::Part::B, "B"}})
        EXPECT_EQ(back.get_module_hf(l, p, part), f.f32(key_of(back, l, p) + name))
            << key_of(back, l, p) << name;

  std::vector<int32_t> tok, tgt;
  TokenBatch bt = batch_of(f, tok, tgt);
  const std::vector<float> ref = f.f32("merged_logits");
  export_merged(*model, &lora, dir + "/merged", "safetensors");
  export_merged(*model, &lora, dir + "/merged.gguf", "gguf-f16");
  auto ms = load_model(&tr, dir + "/merged", keep());
  std::vector<float> a = logits_of(*ms, nullptr, bt);
  EXPECT_LT(max_rel_error(a.data(), ref.data(), ref.size()), kTol) << "merged safetensors";
  auto mg = load_model(&tr, dir + "/merged.gguf", keep());
  std::vector<float> g = logits_of(*mg, nullptr, bt);
  EXPECT_LT(max_rel_error(g.data(), ref.data(), ref.size()), 4e-3) << "merged GGUF F16";

  // llama.cpp's phi3 adapts its fused attn_qkv and ffn_up: a: {in, r}, b: {r, rows} (ggml order).
  save_gguf_lora_adapter(lora, dir + "/adapter.gguf");
  auto gg = GgufFile::open(dir + "/adapter.gguf");
  std::map<std::string, std::vector<int64_t>> dims;
  for (const GgufTensorInfo& t : gg->tensors())
    dims[t.name] = std::vector<int64_t>(t.ne, t.ne + t.n_dims);
  EXPECT_EQ(dims.size(), 16u);
  EXPECT_EQ(dims["blk.0.attn_qkv.weight.lora_a"], (std::vector<int64_t>{32, 4}));
  EXPECT_EQ(dims["blk.0.attn_qkv.weight.lora_b"], (std::vector<int64_t>{4, 64}));
  EXPECT_EQ(dims["blk.1.ffn_up.weight.lora_b"], (std::vector<int64_t>{4, 128}));
  EXPECT_EQ(dims["blk.1.ffn_down.weight.lora_a"], (std::vector<int64_t>{64, 4}));
  std::filesystem::remove_all(dir);
}

// PEFT loads qlft's committed export (fixtures/families/qlft_phi3_fused, the generator's second
// pass) and gives qlft's logits; today's export equals the committed one.
TEST_F(Phi3Lora, PeftLoadsOurExport) {
  MemoryTracker tr;
  auto model = load_model(&tr, fam("syn_phi3"), keep());
  LoraAdapter lora(&tr, model->shapes, lora_config_of(f));
  load_modules(f, lora);
  const std::string committed = fam("qlft_phi3_fused");
  if (const char* w = std::getenv("QLFT_WRITE_FAMILY_FIXTURES"); w && *w == '1') {
    save_peft_adapter(lora, committed, "tests/reference/fixtures/families/syn_phi3");
    return;  // (the generator's second pass loads it)
  }
  const std::string dir = qlft_test::temp_dir("phi3_fused_peft");
  save_peft_adapter(lora, dir, "tests/reference/fixtures/families/syn_phi3");
  for (const char* file : {"adapter_model.safetensors", "adapter_config.json"})
    EXPECT_EQ(qlft_test::read_file(dir + "/" + file), qlft_test::read_file(committed + "/" + file))
        << file << " differs from the export PEFT loaded";
  std::filesystem::remove_all(dir);
  std::vector<int32_t> tok, tgt;
  TokenBatch bt = batch_of(f, tok, tgt);
  const std::vector<float> ours = logits_of(*model, &lora, bt);
  Fixture peft(fam("syn_phi3.qlft_export_logits.safetensors"));
  const std::vector<float> want = peft.f32("logits");
  ASSERT_EQ(want.size(), ours.size());
  EXPECT_LT(max_rel_error(ours.data(), want.data(), want.size()), kTol);
}

// A part of a fused module alone is refused naming the module; so are DoRA and a PiSSA / OLoRA
// start on one. The fused module names mean the same as their parts, and the parts share A.
TEST_F(Phi3Lora, TargetsByModuleAndSharedA) {
  MemoryTracker tr;
  auto model = load_model(&tr, fam("syn_phi3"), keep());
  auto refused = [&](const char* targets, bool dora, const char* want) {
    SCOPED_TRACE(targets);
    LoraConfig c;
    c.r = 4;
    c.use_dora = dora;
    c.set_targets(targets);
    try {
      LoraAdapter a(&tr, model->shapes, c);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), QLFT_ERR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  refused("q_proj,v_proj", false, "target qkv_proj (not q_proj)");
  refused("up_proj", false, "target gate_up_proj (not up_proj)");
  refused("qkv_proj", true, "use_dora on phi3's fused qkv_proj");
  LoraConfig c;
  c.r = 4;
  c.set_targets("qkv_proj, gate_up_proj");
  LoraConfig d;
  d.set_targets("q_proj,k_proj,v_proj,gate_proj,up_proj");
  EXPECT_EQ(c.targets_string(), d.targets_string());
  LoraAdapter a(&tr, model->shapes, c);
  EXPECT_EQ(a.slot(1, Proj::K).A.data(), a.slot(1, Proj::Q).A.data());
  EXPECT_EQ(a.slot(1, Proj::V).dA.data(), a.slot(1, Proj::Q).dA.data());
  EXPECT_EQ(a.slot(0, Proj::Up).A.data(), a.slot(0, Proj::Gate).A.data());
  EXPECT_NE(a.slot(0, Proj::Up).B.data(), a.slot(0, Proj::Gate).B.data());
  {  // gradients made later (as the trainer does): whole, the parts' dA one; sharded, refused
    LoraAdapter later(&tr, model->shapes, c, /*gradients=*/false);
    try {
      later.allocate_gradients([](int, Proj, bool b) { return b; });
      ADD_FAILURE() << "sharded gradients on a fused adapter were accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("fused qkv_proj"), std::string::npos) << e.what();
    }
    later.allocate_gradients([](int, Proj, bool) { return true; });
    EXPECT_EQ(later.slot(0, Proj::V).dA.data(), later.slot(0, Proj::Q).dA.data());
    EXPECT_NE(later.slot(0, Proj::Q).dA.data(), nullptr);
  }
  std::vector<float> A(4 * 32, 0.5f), B(16 * 4, 1.f);
  try {
    a.set_start_hf(0, Proj::K, A.data(), 4 * 32, B.data(), 16 * 4);
    ADD_FAILURE() << "a start on a fused part was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fused qkv_proj"), std::string::npos) << e.what();
  }
}

// The trainer on phi3 with PEFT's fused targets: its parameter list holds one A per fused
// module (the parts' A stay one tensor through the optimizer), the loss falls, and PEFT loads
// the trained adapter (committed as qlft_phi3_trained, the generator's second pass) with qlft's
// logits; today's training reproduces the committed adapter.
TEST_F(Phi3Lora, PeftLoadsOurTrainedAdapter) {
  MemoryTracker tr;
  auto model = load_model(&tr, fam("syn_phi3"), keep());
  Config c;
  c.set("lora.r", "4");
  c.set("lora.alpha", "8");
  c.set("lora.target_modules", "qkv_proj,o_proj,gate_up_proj,down_proj");
  c.set("optim.lr", "2e-2");
  c.set("seed", "7");
  c.set("sched.name", "constant");
  c.set("data.seq_len", "16");
  c.set("train.micro_batch", "2");
  std::vector<int32_t> tok, tgt;
  TokenBatch tb = batch_of(f, tok, tgt);
  data::Batch b;
  b.micro_batch = tb.batch;
  b.seq_len = tb.seq;
  b.rows = tb.batch;
  b.tokens = tok;
  b.targets = tgt;
  for (int32_t t : tgt) b.trained_tokens += t != -100;
  Trainer t(*model, &tr, nullptr, parse_run_spec(c));
  LoraAdapter& lora = t.lora();
  ASSERT_TRUE(lora.fused());
  EXPECT_EQ(lora.params().size(), static_cast<size_t>(11 * model->cfg.n_layers));
  const std::vector<float> a0 = lora.get_hf(1, Proj::Q, LoraAdapter::Part::A);
  const std::vector<float> o0 = lora.get_hf(1, Proj::O, LoraAdapter::Part::A);
  StepReport r, first;
  for (int i = 0; i < 4; ++i) t.step_on({b}, i == 0 ? &first : &r);
  std::printf("[phi3 lora] 4 steps: loss %.4f -> %.4f\n", first.loss, r.loss);
  EXPECT_LT(r.loss, first.loss);
  const std::vector<float> a1 = lora.get_hf(1, Proj::Q, LoraAdapter::Part::A);
  EXPECT_NE(a1, a0) << "the shared A did not train";
  EXPECT_NE(lora.get_hf(1, Proj::O, LoraAdapter::Part::A), o0) << "o_proj's A did not train";
  EXPECT_EQ(lora.get_hf(1, Proj::V, LoraAdapter::Part::A), a1);
  EXPECT_EQ(lora.get_hf(1, Proj::Up, LoraAdapter::Part::A),
            lora.get_hf(1, Proj::Gate, LoraAdapter::Part::A));

  const std::string committed = fam("qlft_phi3_trained");
  if (const char* w = std::getenv("QLFT_WRITE_FAMILY_FIXTURES"); w && *w == '1') {
    save_peft_adapter(lora, committed, "tests/reference/fixtures/families/syn_phi3");
    return;
  }
  LoraAdapter back(&tr, model->shapes, read_peft_config(committed));
  load_peft_adapter(back, committed);
  std::vector<float> today, then;
  for (auto& p : lora.params()) today.insert(today.end(), p.w, p.w + p.n);
  for (auto& p : back.params()) then.insert(then.end(), p.w, p.w + p.n);
  ASSERT_EQ(today.size(), then.size());
  // (another CPU's kernels may round the few steps differently in the last bits)
  EXPECT_LT(max_rel_error(today.data(), then.data(), then.size()), 1e-4)
      << "today's training differs from the committed adapter";
  const std::vector<float> ours = logits_of(*model, &back, tb);
  Fixture peft(fam("syn_phi3.qlft_export_logits.safetensors"));
  const std::vector<float> want = peft.f32("trained_logits");
  ASSERT_EQ(want.size(), ours.size());
  EXPECT_LT(max_rel_error(ours.data(), want.data(), want.size()), kTol);
}
