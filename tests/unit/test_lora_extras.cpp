// DoRA and the PiSSA / OLoRA starts at run time (model/lora_extras.h) against PEFT on the
// synthetic llama (fixtures of tests/reference/gen_lora_variants_fixtures.py: r 4, alpha 8, all
// seven projections, one batch of two rows of 16 tokens):
//  - DoRA (fp32 and NF4 bases): logits, loss and the gradients of A, B and the magnitude; the
//    starting magnitude; the merged model's logits against PEFT's merge_and_unload; the PEFT
//    export against PEFT's own file, and PEFT's logits of our export;
//  - PiSSA / OLoRA: the start (A, B) against PEFT's init (PiSSA up to a sign per component), the
//    logits at the start (the base model's) and the gradients there, the logits and gradients of
//    trained values, and the export: PEFT's converted rank-2r adapter, and PEFT's logits of ours.
// Each is run on the safetensors model and on its GGUF (q/k rows in adjacent-pair order).
// Through the trainer on stories260K: each variant lowers the loss, and a run resumed from a
// checkpoint (the magnitude saved, the start made again) ends bit-equal to an uninterrupted one.
//
// Regenerate the exports PEFT loads: QLFT_WRITE_LORA_VARIANT_FIXTURES=1 test_lora_extras, then
// /opt/qlft-ref/bin/python tests/reference/gen_lora_variants_fixtures.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "config/config.h"
#include "core/threads.h"
#include "data/dataset.h"
#include "data/tokenizer_encoder.h"
#include "model/generate.h"
#include "model/lora_extras.h"
#include "test_model_util.h"
#include "tokenizer/tokenizer.h"
#include "train/trainer.h"
#include "test_trainer_util.h"
#include "train/adapter_io.h"
#include "train/merge_export.h"

using namespace qlft;
using trainer_test::weights_of;
using namespace model_test;
using qlft_test::max_rel_error;

namespace {

constexpr double kTol = 1e-4;

std::string variant_fixture(const std::string& rel) {
  return qlft_test::fixture_path("lora_variants/" + rel);
}

LoraConfig variant_config(bool dora) {
  LoraConfig c;
  c.r = 4;
  c.alpha = 8;
  c.use_dora = dora;
  return c;
}

std::string key(int l, Proj p, const char* part) {
  return "l" + std::to_string(l) + "." + proj_peft_name(p) + "." + part;
}

// One forward (logits, loss) and backward of the fixture's batch.
struct Pass {
  std::vector<float> logits;
  double loss = 0;
};

Pass run_pass(const Model& m, Backend& be, LoraAdapter* lora, const Fixture& f, bool backward) {
  LlamaRunner run(m, be, lora);
  std::vector<int32_t> tok = f.i32("tokens"), tgt = f.i32("targets");
  TokenBatch b;
  b.batch = static_cast<int>(f.shape("tokens")[0]);
  b.seq = static_cast<int>(f.shape("tokens")[1]);
  b.tokens = tok.data();
  b.targets = tgt.data();
  Pass p;
  p.logits.resize(static_cast<size_t>(b.rows()) * m.cfg.vocab);
  p.loss = run.logits(b, MatF(p.logits.data(), b.rows(), m.cfg.vocab)).mean();
  if (backward) {
    if (lora) lora->zero_grad();
    run.forward(b);
    run.backward();
  }
  return p;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                  const std::string& what, double tol = kTol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_LT(max_rel_error(got.data(), want.data(), want.size()), tol) << what;
}

// Every slot's gradients (parts named in the fixture as prefix + gA / gB / gm) against it.
void expect_grads(const LoraAdapter& a, const Fixture& f, const std::string& prefix, bool dora) {
  for (int l = 0; l < a.n_layers(); ++l)
    for (int p = 0; p < kProjCount; ++p) {
      const Proj pr = static_cast<Proj>(p);
      expect_close(a.get_hf(l, pr, LoraAdapter::Part::dA), f.f32(prefix + key(l, pr, "gA")),
                   key(l, pr, "gA"));
      expect_close(a.get_hf(l, pr, LoraAdapter::Part::dB), f.f32(prefix + key(l, pr, "gB")),
                   key(l, pr, "gB"));
      if (dora)
        expect_close(a.get_hf(l, pr, LoraAdapter::Part::dM), f.f32(prefix + key(l, pr, "gm")),
                     key(l, pr, "gm"));
    }
}

// The fixture's A, B (and magnitude) of the state named by prefix.
void set_values(LoraAdapter& a, const Fixture& f, const std::string& prefix) {
  for (int l = 0; l < a.n_layers(); ++l)
    for (int p = 0; p < kProjCount; ++p) {
      const Proj pr = static_cast<Proj>(p);
      std::vector<float> A = f.f32(prefix + key(l, pr, "A")), B = f.f32(prefix + key(l, pr, "B"));
      a.set_hf(l, pr, A.data(), A.size(), B.data(), B.size());
      if (a.config().use_dora) {
        std::vector<float> m = f.f32(prefix + key(l, pr, "m"));
        a.set_magnitude_hf(l, pr, m.data(), m.size());
      }
    }
}

std::string temp_dir(const char* name) {
  return (std::filesystem::temp_directory_path() /
          (std::string("qlft_lora_extras_") + name + "_" + std::to_string(::getpid())))
      .string();
}

// Our export of `a` as a PEFT directory (in a temporary directory).
std::string export_peft(const LoraAdapter& a, const std::string& name) {
  const std::string dir = temp_dir(name.c_str());
  save_peft_adapter(a, dir, "tests/reference/fixtures/model/syn_llama");
  return dir;
}

// The tensors of a safetensors file by name, as fp32.
std::map<std::string, std::vector<float>> tensors_of(const std::string& path) {
  auto f = SafetensorsFile::open(path);
  std::map<std::string, std::vector<float>> out;
  for (const SafeTensorInfo& t : f->tensors()) {
    std::vector<float> v(t.numel());
    to_f32_n(t.dtype, t.data, v.data(), v.size());
    out[t.name] = std::move(v);
  }
  return out;
}

// PEFT's logits of our committed export (the generator's second pass), when it has run.
void expect_peft_logits_of_export(const LoraAdapter& a, const char* name,
                                  const std::vector<float>& want) {
  const std::string committed = variant_fixture(std::string("qlft_") + name);
  const std::string logits = variant_fixture("qlft_exports.safetensors");
  if (const char* w = std::getenv("QLFT_WRITE_LORA_VARIANT_FIXTURES"); w && *w == '1') {
    save_peft_adapter(a, committed, "tests/reference/fixtures/model/syn_llama");
    return;  // (the generator's second pass loads it)
  }
  ASSERT_TRUE(std::filesystem::exists(committed + "/adapter_model.safetensors") &&
              std::filesystem::exists(logits))
      << "run the regeneration steps in this file's header";
  // Today's export is the committed one (the file PEFT loaded) ...
  const std::string dir = export_peft(a, name);
  auto ours = tensors_of(dir + "/adapter_model.safetensors");
  auto committed_t = tensors_of(committed + "/adapter_model.safetensors");
  ASSERT_EQ(ours.size(), committed_t.size());
  for (auto& [k, v] : committed_t) {
    ASSERT_TRUE(ours.count(k)) << k;
    expect_close(ours[k], v, "export " + k, 1e-6);
  }
  std::filesystem::remove_all(dir);
  // ... and PEFT's logits with it are ours.
  Fixture f(logits);
  expect_close(f.f32(std::string(name) + "_qlft_export_logits"), want, "PEFT logits of the export");
}

// Every projection's starting magnitude (dora_init_magnitude) against PEFT's dora_init.
void expect_initial_magnitude(const Model& m, const Fixture& f, double tol) {
  MemoryTracker tr;
  LoraAdapter a(&tr, m.shapes, variant_config(true));  // B = 0: the base rows' norms
  dora_init_magnitude(a, m);
  for (int p = 0; p < kProjCount; ++p)
    expect_close(a.get_hf(0, static_cast<Proj>(p), LoraAdapter::Part::M),
                 f.f32("init." + key(0, static_cast<Proj>(p), "m")), "initial magnitude", tol);
}

const char* const kModels[] = {"syn_llama", "syn_llama.gguf"};

}  // namespace

TEST(Dora, ForwardAndGradientsEqualPeft) {
  Fixture f(variant_fixture("dora.safetensors"));
  for (const char* name : kModels) {
    SCOPED_TRACE(name);
    MemoryTracker tr;
    auto model = load_model(&tr, model_fixture(name), keep());
    auto be = make_cpu_backend(&tr);
    LoraAdapter a(&tr, model->shapes, variant_config(true));
    set_values(a, f, "");
    Pass p = run_pass(*model, *be, &a, f, true);
    expect_close(p.logits, f.f32("logits"), "logits");
    EXPECT_NEAR(p.loss, f.f32("loss")[0], kTol * f.f32("loss")[0]);
    expect_grads(a, f, "", true);
  }
}

// PEFT's dora_init on a 4-bit base: the magnitude of the dequantized NF4 rows, and the same
// forward and gradients (qlft's NF4 is bitsandbytes', double quantization included).
TEST(Dora, Nf4BaseEqualsPeft) {
  Fixture f(variant_fixture("dora_nf4.safetensors"));
  MemoryTracker tr;
  auto model = load_model(&tr, model_fixture("syn_llama"), LoadOptions{});
  auto be = make_cpu_backend(&tr);
  LoraAdapter a(&tr, model->shapes, variant_config(true));
  set_values(a, f, "");
  Pass p = run_pass(*model, *be, &a, f, true);
  expect_close(p.logits, f.f32("logits"), "logits");
  expect_grads(a, f, "", true);
  expect_initial_magnitude(*model, f, kTol);
}

TEST(Dora, MagnitudeStartsAtTheBaseRowNorms) {
  Fixture f(variant_fixture("dora.safetensors"));
  for (const char* name : kModels) {
    SCOPED_TRACE(name);
    MemoryTracker tr;
    auto model = load_model(&tr, model_fixture(name), keep());
    expect_initial_magnitude(*model, f, 1e-6);
  }
}

TEST(Dora, MergedModelEqualsPeftMergeAndUnload) {
  Fixture f(variant_fixture("dora.safetensors"));
  MemoryTracker tr;
  auto model = load_model(&tr, model_fixture("syn_llama"), keep());
  LoraAdapter a(&tr, model->shapes, variant_config(true));
  set_values(a, f, "");
  const std::string dir = temp_dir("dora_merged");
  export_merged(*model, &a, dir, "safetensors");
  auto merged = load_model(&tr, dir, keep());
  auto be = make_cpu_backend(&tr);
  Pass p = run_pass(*merged, *be, nullptr, f, false);
  expect_close(p.logits, f.f32("merged_logits"), "merged logits");
  std::filesystem::remove_all(dir);
}

TEST(Dora, PeftExportEqualsPeftsFileAndLoadsInPeft) {
  Fixture f(variant_fixture("dora.safetensors"));
  MemoryTracker tr;
  auto model = load_model(&tr, model_fixture("syn_llama"), keep());
  LoraAdapter a(&tr, model->shapes, variant_config(true));
  set_values(a, f, "");
  // Our file has PEFT's tensor names, shapes and values.
  const std::string dir = export_peft(a, "dora_check");
  auto ours = tensors_of(dir + "/adapter_model.safetensors");
  auto peft = tensors_of(variant_fixture("dora_peft/adapter_model.safetensors"));
  ASSERT_EQ(ours.size(), peft.size());
  for (auto& [k, v] : peft) {
    ASSERT_TRUE(ours.count(k)) << "PEFT's " << k << " is not in our export";
    expect_close(ours[k], v, k, 1e-6);
  }
  // PEFT's file loads back into a DoRA adapter (the config's use_dora read) with its logits.
  LoraConfig c = read_peft_config(variant_fixture("dora_peft"));
  EXPECT_TRUE(c.use_dora);
  LoraAdapter back(&tr, model->shapes, c);
  load_peft_adapter(back, variant_fixture("dora_peft"));
  auto be = make_cpu_backend(&tr);
  expect_close(run_pass(*model, *be, &back, f, false).logits, f.f32("logits"),
               "PEFT file's logits");
  std::filesystem::remove_all(dir);
  expect_peft_logits_of_export(a, "dora", f.f32("logits"));
}

namespace {

// PiSSA / OLoRA on one model: the start, its logits and gradients, then trained values.
void check_start(const char* variant, LoraInit init, const char* model_name) {
  SCOPED_TRACE(std::string(variant) + " on " + model_name);
  Fixture f(variant_fixture(std::string(variant) + ".safetensors"));
  MemoryTracker tr;
  auto model = load_model(&tr, model_fixture(model_name), keep());
  auto be = make_cpu_backend(&tr);
  LoraAdapter a(&tr, model->shapes, variant_config(false));
  start_from_base(a, *model, init);
  // PiSSA's singular vectors may come with the other sign per component (both A's row and B's
  // column): align ours to PEFT's, and the gradients with them.
  std::vector<std::vector<float>> sign(kProjCount);
  for (int p = 0; p < kProjCount; ++p) {
    const Proj pr = static_cast<Proj>(p);
    std::vector<float> A = a.get_hf(0, pr, LoraAdapter::Part::A);
    std::vector<float> B = a.get_hf(0, pr, LoraAdapter::Part::B);
    const std::vector<float> pa = f.f32("init." + key(0, pr, "A"));
    const std::vector<float> pb = f.f32("init." + key(0, pr, "B"));
    const int r = 4;
    const size_t in = A.size() / r, out = B.size() / r;
    sign[p].assign(r, 1.f);
    for (int k = 0; k < r; ++k) {
      double dot = 0;
      for (size_t i = 0; i < in; ++i) dot += double(A[k * in + i]) * pa[k * in + i];
      if (init == LoraInit::Pissa && dot < 0) sign[p][k] = -1.f;
      for (size_t i = 0; i < in; ++i) A[k * in + i] *= sign[p][k];
      for (size_t o = 0; o < out; ++o) B[o * r + k] *= sign[p][k];
    }
    expect_close(A, pa, key(0, pr, "A (start)"));
    expect_close(B, pb, key(0, pr, "B (start)"));
  }
  // At the start the model is the base model: PEFT's logits there, and its gradients.
  Pass p = run_pass(*model, *be, &a, f, true);
  expect_close(p.logits, f.f32("init_logits"), "logits at the start");
  EXPECT_NEAR(p.loss, f.f32("init_loss")[0], kTol * f.f32("init_loss")[0]);
  for (int q = 0; q < kProjCount; ++q) {
    const Proj pr = static_cast<Proj>(q);
    std::vector<float> gA = a.get_hf(0, pr, LoraAdapter::Part::dA);
    std::vector<float> gB = a.get_hf(0, pr, LoraAdapter::Part::dB);
    const int r = 4;
    const size_t in = gA.size() / r, out = gB.size() / r;
    for (int k = 0; k < r; ++k) {
      for (size_t i = 0; i < in; ++i) gA[k * in + i] *= sign[q][k];
      for (size_t o = 0; o < out; ++o) gB[o * r + k] *= sign[q][k];
    }
    expect_close(gA, f.f32("init." + key(0, pr, "gA")), key(0, pr, "gA at the start"));
    expect_close(gB, f.f32("init." + key(0, pr, "gB")), key(0, pr, "gB at the start"));
  }
  // Trained values (PEFT's start plus noise; the frozen start enters only as B0 A0, which has
  // no sign freedom): the forward and gradients of W_res + s B A.
  set_values(a, f, "");
  p = run_pass(*model, *be, &a, f, true);
  expect_close(p.logits, f.f32("logits"), "logits");
  EXPECT_NEAR(p.loss, f.f32("loss")[0], kTol * f.f32("loss")[0]);
  expect_grads(a, f, "", false);

  // The export is PEFT's converted rank-2r adapter on the original base: its products B'A' per
  // projection (the factors themselves differ by PiSSA's signs) and its config.
  const std::string dir = export_peft(a, std::string(variant) + "_check");
  LoraConfig c = read_peft_config(dir),
             pc = read_peft_config(variant_fixture(std::string(variant) + "_converted"));
  EXPECT_EQ(c.r, pc.r);
  EXPECT_FLOAT_EQ(c.alpha, pc.alpha);
  LoraAdapter ours(&tr, model->shapes, c), theirs(&tr, model->shapes, pc);
  load_peft_adapter(ours, dir);
  load_peft_adapter(theirs, variant_fixture(std::string(variant) + "_converted"));
  expect_close(run_pass(*model, *be, &ours, f, false).logits, f.f32("converted_logits"),
               "logits of our export as a plain adapter");
  expect_close(run_pass(*model, *be, &theirs, f, false).logits, f.f32("converted_logits"),
               "logits of PEFT's converted adapter");
  std::filesystem::remove_all(dir);
  // The merged model (W + s (B A - B0 A0)) is PEFT's merge_and_unload (W_res + s B A): the
  // trained logits.
  if (std::string(model_name) == "syn_llama") {
    const std::string merged = temp_dir((std::string(variant) + "_merged").c_str());
    export_merged(*model, &a, merged, "safetensors");
    auto mm = load_model(&tr, merged, keep());
    expect_close(run_pass(*mm, *be, nullptr, f, false).logits, f.f32("logits"), "merged logits");
    std::filesystem::remove_all(merged);
    expect_peft_logits_of_export(a, variant, f.f32("logits"));
  }
}

}  // namespace

TEST(Pissa, StartForwardGradientsAndExportEqualPeft) {
  for (const char* m : kModels) check_start("pissa", LoraInit::Pissa, m);
}

TEST(Olora, StartForwardGradientsAndExportEqualPeft) {
  for (const char* m : kModels) check_start("olora", LoraInit::Olora, m);
}

namespace {

struct Stories {
  MemoryTracker tracker;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<data::TokenizerEncoder> enc;
  std::unique_ptr<data::Dataset> data;
};

Stories* stories() {
  static Stories* s = []() -> Stories* {
    const std::string m = qlft_test::shared_file("models/stories260K.gguf");
    const std::string text = qlft_test::shared_file("data/tinyshakespeare.txt");
    if (m.empty() || text.empty()) return nullptr;
    set_num_threads(1);
    auto* x = new Stories();
    x->model = load_model(&x->tracker, m, LoadOptions{});  // NF4, as QLoRA trains
    x->tok = Tokenizer::from_gguf(*x->model->gguf);
    x->enc = std::make_unique<data::TokenizerEncoder>(*x->tok);
    Config c;
    c.set("data.path", text);
    c.set("data.seq_len", "64");
    c.set("data.eval_fraction", "0.02");
    x->data =
        std::make_unique<data::Dataset>(data::Dataset::build(parse_run_spec(c).data, *x->enc));
    return x;
  }();
  return s;
}

Config variant_run(const char* key, const char* value) {
  Config c;
  c.set("lora.r", "4");
  c.set("lora.alpha", "8");
  c.set("optim.lr", "5e-3");
  c.set("train.max_steps", "6");
  c.set("seed", "11");
  c.set(key, value);
  return c;
}

}  // namespace

TEST(LoraVariantsTrain, LowerTheLossAndResumeBitExactly) {
  Stories* s = stories();
  if (!s) QLFT_SKIP("shared-missing") << "stories260K.gguf or tinyshakespeare.txt not found";
  const std::string dir = temp_dir("resume");
  std::filesystem::create_directories(dir);
  for (auto [k, v] : {std::pair{"lora.use_dora", "true"}, std::pair{"lora.init", "pissa"},
                      std::pair{"lora.init", "olora"}}) {
    SCOPED_TRACE(std::string(k) + "=" + v);
    const RunSpec spec = parse_run_spec(variant_run(k, v));
    Trainer straight(*s->model, &s->tracker, s->data.get(), spec);
    const double before = straight.evaluate(*s->data).loss;
    StepReport r;
    while (straight.step(&r)) {
    }
    const double after = straight.evaluate(*s->data).loss;
    std::printf("%s=%s: eval loss %.4f -> %.4f after 6 steps\n", k, v, before, after);
    EXPECT_LT(after, before);
    const std::string ckpt = dir + "/" + v + ".safetensors";
    {
      Trainer first(*s->model, &s->tracker, s->data.get(), spec);
      for (int i = 0; i < 3; ++i) ASSERT_TRUE(first.step(&r));
      first.save_checkpoint(ckpt);
    }
    Trainer second(*s->model, &s->tracker, s->data.get(), spec);
    second.resume(ckpt);
    while (second.step(&r)) {
    }
    std::vector<float> a = weights_of(straight), b = weights_of(second);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "resumed run diverged";
  }
  std::filesystem::remove_all(dir);
}

TEST(LoraVariantsTrain, RefusesDoraWithAStartNamingBoth) {
  Stories* s = stories();
  if (!s) QLFT_SKIP("shared-missing") << "stories260K.gguf or tinyshakespeare.txt not found";
  Config c = variant_run("lora.use_dora", "true");
  c.set("lora.init", "pissa");
  try {
    Trainer t(*s->model, &s->tracker, s->data.get(), parse_run_spec(c));
    FAIL() << "DoRA with a PiSSA start was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lora.init=pissa"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("lora.use_dora"), std::string::npos) << e.what();
  }
}

namespace {

// Cached decoding with the adapter (model/generate.h): the first row's 16 tokens fed as a prompt
// of 6 and then one at a time give the same logits as PEFT's forward of the row.
void expect_generation_follows(const Model& m, const LoraAdapter& a, const Fixture& f) {
  MemoryTracker tr;
  auto be = make_cpu_backend(&tr);
  Generator g(m, *be, &a, 64);
  const std::vector<int32_t> tok = f.i32("tokens");
  const int T = static_cast<int>(f.shape("tokens")[1]), V = m.cfg.vocab;
  std::vector<float> got(static_cast<size_t>(T) * V);
  g.feed(tok.data(), 6, got.data(), /*last_only=*/false);
  for (int t = 6; t < T; ++t) g.feed(tok.data() + t, 1, got.data() + size_t(t) * V, true);
  const std::vector<float> all = f.f32("logits");
  expect_close(got, std::vector<float>(all.begin(), all.begin() + size_t(T) * V),
               "cached decoding's logits");
}

}  // namespace

TEST(LoraVariantsGenerate, DecodingWithDoraAndAStartEqualsPeft) {
  for (const char* variant : {"dora", "pissa", "olora"}) {
    SCOPED_TRACE(variant);
    Fixture f(variant_fixture(std::string(variant) + ".safetensors"));
    MemoryTracker tr;
    auto model = load_model(&tr, model_fixture("syn_llama.gguf"), keep());
    const bool dora = std::string(variant) == "dora";
    LoraAdapter a(&tr, model->shapes, variant_config(dora));
    if (!dora) start_from_base(a, *model, variant[0] == 'p' ? LoraInit::Pissa : LoraInit::Olora);
    set_values(a, f, "");
    expect_generation_follows(*model, a, f);
  }
}
