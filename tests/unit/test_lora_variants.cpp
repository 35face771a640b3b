// LoRA variants: LoftQ's init against PEFT's decomposition of bitsandbytes' NF4 error (fixtures
// of tests/reference/gen_lora_variants_fixtures.py), LoftQ lowering the initial loss of an NF4
// stories260K, LoRA+ (B at optim.loraplus_lr_ratio x lr) against a host AdamW oracle with
// two learning rates and through the trainer, and PiSSA's / OLoRA's initial factors against
// PEFT's pissa_init / olora_init.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "config/config.h"
#include "core/error.h"
#include "core/threads.h"
#include "data/dataset.h"
#include "data/tokenizer_encoder.h"
#include "model/lora_init_factors.h"
#include "model/lora_loftq.h"
#include "optim/optimizer.h"
#include "quant/nf4.h"
#include "test_model_util.h"
#include "tokenizer/tokenizer.h"
#include "train/trainer.h"

using namespace qlft;

namespace {

// max |a - b| / max |b|.
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0, m = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    e = std::max(e, std::fabs(static_cast<double>(a[i]) - b[i]));
    m = std::max(m, std::fabs(static_cast<double>(b[i])));
  }
  return e / m;
}

// [out, r] x [r, in].
std::vector<float> product(const std::vector<float>& B, const std::vector<float>& A, int64_t out,
                           int64_t in, int64_t r) {
  std::vector<float> p(static_cast<size_t>(out * in));
  for (int64_t i = 0; i < out; ++i)
    for (int64_t c = 0; c < in; ++c) {
      double d = 0;
      for (int64_t j = 0; j < r; ++j) d += static_cast<double>(B[i * r + j]) * A[j * in + c];
      p[i * in + c] = static_cast<float>(d);
    }
  return p;
}

}  // namespace

// qlft's NF4 of each fixture matrix equals bitsandbytes' (blocksize 64, no double quantization),
// and loftq_factors' s B A equals PEFT's lora_B lora_A (the rank-r SVD of the error), at s = 1
// and s = 2; truncated_svd's singular values equal torch.linalg.svd's. "big" (min side 260)
// takes the subspace-iteration path, the others the exact one.
TEST(LoftQ, FactorsEqualPeftOnTheNf4Error) {
  model_test::Fixture f(qlft_test::fixture_path("lora_variants/loftq.safetensors"));
  for (const char* name : {"wide", "tall", "big"}) {
    SCOPED_TRACE(name);
    const std::string k = name;
    const std::vector<float> w = f.f32(k + ".w");
    const int64_t out = f.shape(k + ".w")[0], in = f.shape(k + ".w")[1];
    const int r = f.i32(k + ".rank")[0];
    std::vector<uint8_t> packed(static_cast<size_t>(nf4_packed_bytes(out * in)));
    std::vector<float> absmax(static_cast<size_t>(nf4_num_blocks(out * in, 64)));
    nf4_quantize(w.data(), out * in, 64, packed.data(), absmax.data());
    std::vector<float> deq(w.size());
    nf4_dequantize(packed.data(), absmax.data(), 64, 0, out * in, deq.data());
    if (f.has(k + ".deq")) EXPECT_EQ(deq, f.f32(k + ".deq")) << "NF4 differs from bitsandbytes'";

    const std::vector<float> peft = product(f.f32(k + ".lora_B"), f.f32(k + ".lora_A"), out, in, r);
    for (float scale : {1.f, 2.f}) {
      std::vector<float> A(static_cast<size_t>(r * in)), B(static_cast<size_t>(out * r));
      loftq_factors(w.data(), deq.data(), out, in, r, scale, A.data(), B.data());
      std::vector<float> sba = product(B, A, out, in, r);
      for (float& v : sba) v *= scale;
      const double e = rel_err(sba, peft);
      std::printf("%s scale %g: s B A vs PEFT's lora_B lora_A, max error / max %.3g\n", name,
                  static_cast<double>(scale), e);
      EXPECT_LT(e, 1e-4) << "scale " << scale;
    }
    std::vector<float> res(w.size());
    for (size_t i = 0; i < w.size(); ++i) res[i] = w[i] - deq[i];
    std::vector<double> u, s, vt;
    truncated_svd(res.data(), out, in, r, &u, &s, &vt);
    const std::vector<float> S = f.f32(k + ".S");
    for (int j = 0; j < r; ++j) EXPECT_NEAR(s[j], S[j], 1e-5 * S[0]) << "singular value " << j;
  }
}

namespace {

struct Stories {
  MemoryTracker tracker;
  std::unique_ptr<Model> fp, nf4;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<data::TokenizerEncoder> enc;
  std::unique_ptr<data::Dataset> data;

  bool open() {
    const std::string m = qlft_test::shared_file("models/stories260K.gguf");
    const std::string text = qlft_test::shared_file("data/tinyshakespeare.txt");
    if (m.empty() || text.empty()) return false;
    fp = load_model(&tracker, m, model_test::keep());
    nf4 = load_model(&tracker, m, LoadOptions{});  // quant.type's default: NF4, double quant
    tok = Tokenizer::from_gguf(*fp->gguf);
    enc = std::make_unique<data::TokenizerEncoder>(*tok);
    Config c;
    c.set("data.path", text);
    c.set("data.seq_len", "64");
    c.set("data.eval_fraction", "0.02");
    data = std::make_unique<data::Dataset>(data::Dataset::build(parse_run_spec(c).data, *enc));
    return true;
  }
};

Stories* stories() {
  static Stories* s = [] {
    set_num_threads(1);
    auto* x = new Stories();
    if (!x->open()) {
      delete x;
      return static_cast<Stories*>(nullptr);
    }
    return x;
  }();
  return s;
}

Config lora_config(const char* init) {
  Config c;
  c.set("lora.r", "16");
  c.set("lora.alpha", "32");  // s = 2: the scale is in the factors
  c.set("lora.init", init);
  c.set("seed", "7");
  return c;
}

}  // namespace

// The criterion's statement: on the same NF4 base and held-out batches, LoftQ's start has a lower
// loss than PEFT's default start (B = 0, so that one is the NF4 model's loss), and it moves the
// loss toward the unquantized model's.
TEST(LoftQ, LowersTheInitialLossOfAnNf4Base) {
  Stories* s = stories();
  if (!s) QLFT_SKIP("shared-missing") << "stories260K.gguf or tinyshakespeare.txt not found";
  auto loss = [&](const Model& m, const char* init) {
    Trainer t(m, &s->tracker, nullptr, parse_run_spec(lora_config(init)));
    return t.evaluate(*s->data).loss;
  };
  const double fp = loss(*s->fp, "default"), q = loss(*s->nf4, "default"),
               l = loss(*s->nf4, "loftq");
  std::printf("eval loss: fp32 %.6f  nf4 %.6f  nf4+loftq %.6f\n", fp, q, l);
  EXPECT_LT(l, q);
  EXPECT_LT(std::fabs(l - fp), std::fabs(q - fp));
}

TEST(LoftQ, RefusesAnUnquantizedBaseNamingTheSetting) {
  Stories* s = stories();
  if (!s) QLFT_SKIP("shared-missing") << "stories260K.gguf or tinyshakespeare.txt not found";
  try {
    Trainer t(*s->fp, &s->tracker, nullptr, parse_run_spec(lora_config("loftq")));
    FAIL() << "a quant.type=keep base was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lora.init=loftq"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("quant.type=keep"), std::string::npos) << e.what();
  }
}

namespace {

// torch.optim.AdamW's update in double for one tensor at learning rate lr (its param group's).
void adamw_oracle(std::vector<double>& w, std::vector<double>& m, std::vector<double>& v,
                  const std::vector<float>& g, double lr, double wd, int t) {
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  for (size_t i = 0; i < w.size(); ++i) {
    w[i] *= 1 - lr * wd;
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
    w[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps);
  }
}

}  // namespace

// Two parameter groups as PEFT's create_loraplus_optimizer makes them (A at lr, B at ratio x lr,
// weight decay with each group's lr): three AdamW steps equal the double oracle.
TEST(LoraPlus, AdamWStepsBothGroupsAtTheirLearningRates) {
  const double lr = 1e-3, ratio = 16, wd = 0.05;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> a(37), b(29), ga(37), gb(29);
  for (float& x : a) x = 0.5f * nd(rng);
  for (float& x : b) x = 0.5f * nd(rng);
  std::vector<double> oa(a.begin(), a.end()), ob(b.begin(), b.end()), ma(37), va(37), mb(29),
      vb(29);
  OptimSettings s;
  s.weight_decay = wd;
  MemoryTracker tr;
  auto opt = make_optimizer(
      s, {{"A", a.data(), ga.data(), a.size()}, {"B", b.data(), gb.data(), b.size(), ratio}}, &tr);
  for (int t = 1; t <= 3; ++t) {
    for (float& x : ga) x = 0.01f * nd(rng);
    for (float& x : gb) x = 0.01f * nd(rng);
    opt->step(lr);
    adamw_oracle(oa, ma, va, ga, lr, wd, t);
    adamw_oracle(ob, mb, vb, gb, lr * ratio, wd, t);
  }
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], oa[i], 1e-6) << "A " << i;
  for (size_t i = 0; i < b.size(); ++i) EXPECT_NEAR(b[i], ob[i], 1e-6) << "B " << i;
}

// 8-bit AdamW (fp32 and blockwise 8-bit state): a tensor at lr_scale k steps exactly as the same
// optimizer at lr x k does.
TEST(LoraPlus, AdamW8bitScaleEqualsTheScaledLearningRate) {
  for (size_t n : {size_t(100), size_t(5000)}) {
    std::mt19937 rng(9);
    std::normal_distribution<float> nd;
    std::vector<float> p(n), g(n);
    for (float& x : p) x = nd(rng);
    std::vector<float> q = p;
    OptimSettings s;
    s.kind = OptimizerKind::AdamW8bit;
    s.weight_decay = 0.01;
    MemoryTracker tr;
    auto scaled = make_optimizer(s, {{"w", p.data(), g.data(), n, 8.0}}, &tr);
    auto plain = make_optimizer(s, {{"w", q.data(), g.data(), n}}, &tr);
    for (int t = 0; t < 3; ++t) {
      for (float& x : g) x = 0.01f * nd(rng);
      scaled->step(2e-4);
      plain->step(2e-4 * 8.0);
    }
    EXPECT_EQ(p, q) << n << " elements";
  }
}

// Through the trainer: B starts at 0, so step 1 leaves A where it was (its gradient is 0) and moves
// each B element by about lr x ratio (AdamW's first step is lr x g / |g|): with ratio 16, B is
// 16 times ratio 1's B.
TEST(LoraPlus, TrainerGivesEveryBTheRatio) {
  Stories* s = stories();
  if (!s) QLFT_SKIP("shared-missing") << "stories260K.gguf or tinyshakespeare.txt not found";
  std::vector<float> A[2], B[2];
  const char* ratios[2] = {"1", "16"};
  for (int i = 0; i < 2; ++i) {
    Config c = lora_config("default");
    c.set("optim.loraplus_lr_ratio", ratios[i]);
    c.set("optim.max_grad_norm", "0");
    c.set("optim.lr", "1e-3");
    c.set("train.max_steps", "1");
    Trainer t(*s->fp, &s->tracker, s->data.get(), parse_run_spec(c));
    StepReport r;
    ASSERT_TRUE(t.step(&r));
    for (int l = 0; l < t.lora().n_layers(); ++l)
      for (int p = 0; p < kProjCount; ++p) {
        std::vector<float> a = t.lora().get_hf(l, static_cast<Proj>(p), LoraAdapter::Part::A);
        std::vector<float> b = t.lora().get_hf(l, static_cast<Proj>(p), LoraAdapter::Part::B);
        A[i].insert(A[i].end(), a.begin(), a.end());
        B[i].insert(B[i].end(), b.begin(), b.end());
      }
  }
  EXPECT_EQ(A[0], A[1]);
  ASSERT_EQ(B[0].size(), B[1].size());
  size_t moved = 0;
  for (size_t i = 0; i < B[0].size(); ++i) {
    EXPECT_NEAR(B[1][i], 16.f * B[0][i], 1e-5f * std::fabs(16.f * B[0][i]) + 1e-9f) << i;
    moved += B[0][i] != 0;
  }
  EXPECT_GT(moved, B[0].size() / 2) << "most B elements move in step 1";
}

namespace {

// One matrix and what PEFT's init made of it: w [out, in], A [r, in], B [out, r], (where the
// fixture has it) the residual base weight W - scale B A that PEFT wrote, and for PiSSA the same
// formula with a float64 SVD (A64, B64).
struct InitCase {
  std::string name;
  std::vector<float> w, A, B, residual, A64, B64;
  int64_t out, in;
  int r;
  float scale;
};

// The fixtures' cases for `init` ("pissa" / "olora"): the wide and tall Linear layers of
// init_factors.safetensors (r 6, scale 1.5, with the residual), and syn_llama's 7 projections
// with the factors of {init}.safetensors (r 4, scale 2; F16 weights, exact in fp32).
std::vector<InitCase> init_cases(const std::string& init) {
  std::vector<InitCase> cs;
  model_test::Fixture f(qlft_test::fixture_path("lora_variants/init_factors.safetensors"));
  const bool pissa = init == "pissa";
  for (const char* name : {"wide", "tall"}) {
    const std::string k = name;
    InitCase c{k,
               f.f32(k + ".w"),
               f.f32(k + "." + init + ".A"),
               f.f32(k + "." + init + ".B"),
               f.f32(k + "." + init + ".residual"),
               pissa ? f.f32(k + ".pissa64.A") : std::vector<float>(),
               pissa ? f.f32(k + ".pissa64.B") : std::vector<float>(),
               f.shape(k + ".w")[0],
               f.shape(k + ".w")[1],
               f.i32("rank")[0],
               f.f32("scale")[0]};
    cs.push_back(std::move(c));
  }
  model_test::Fixture m(model_test::model_fixture("syn_llama/model.safetensors"));
  model_test::Fixture v(qlft_test::fixture_path("lora_variants/" + init + ".safetensors"));
  for (const std::string p :
       {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}) {
    const bool attn = p == "q_proj" || p == "k_proj" || p == "v_proj" || p == "o_proj";
    const std::string wk =
        "model.layers.0." + std::string(attn ? "self_attn." : "mlp.") + p + ".weight";
    const std::string fk = "init.l0." + p + ".", k64 = "l0." + p + ".pissa64.";
    InitCase c{"syn_llama " + p,
               m.f32(wk),
               v.f32(fk + "A"),
               v.f32(fk + "B"),
               {},
               pissa ? f.f32(k64 + "A") : std::vector<float>(),
               pissa ? f.f32(k64 + "B") : std::vector<float>(),
               m.shape(wk)[0],
               m.shape(wk)[1],
               static_cast<int>(v.shape(fk + "A")[0]),
               2.f};
    cs.push_back(std::move(c));
  }
  return cs;
}

// w - scale B A.
std::vector<float> residual_of(const InitCase& c, const std::vector<float>& A,
                               const std::vector<float>& B) {
  std::vector<float> ba = product(B, A, c.out, c.in, c.r), res(c.w.size());
  for (size_t i = 0; i < res.size(); ++i) res[i] = c.w[i] - c.scale * ba[i];
  return res;
}

// Flips component j of (A, B) where B's column j points away from ref_B's: singular vectors are
// unique up to that sign only.
void align_signs(std::vector<float>& A, std::vector<float>& B, const std::vector<float>& ref_B,
                 int64_t out, int64_t in, int r) {
  for (int j = 0; j < r; ++j) {
    double dot = 0;
    for (int64_t i = 0; i < out; ++i) dot += static_cast<double>(B[i * r + j]) * ref_B[i * r + j];
    if (dot >= 0) continue;
    for (int64_t i = 0; i < out; ++i) B[i * r + j] = -B[i * r + j];
    for (int64_t k = 0; k < in; ++k) A[j * in + k] = -A[j * in + k];
  }
}

}  // namespace

// s B A is the rank-r SVD part of w; each singular component equals the reference's up to its
// sign (aligned here, test side); pissa_factors' own sign is its documented one (the
// largest-magnitude entry of each column of B positive); w - s B A equals PEFT's residual base.
// Two references: pissa_init's formula with a float64 SVD (tight: both are exact to float
// rounding; they agree bit for bit), and PEFT's own factors, whose fp32 SVD is off the float64
// one by up to 1.1e-5 in s B A (syn_llama up_proj, close 4th/5th singular values) and 2.2e-5 in
// a factor (wide's B): 5e-5 leaves room for that and still fails on a wrong scale, sqrt, rank or
// vector (errors of order 1).
TEST(Pissa, FactorsEqualPeftsUpToEachComponentsSign) {
  for (const InitCase& c : init_cases("pissa")) {
    SCOPED_TRACE(c.name);
    std::vector<float> A(static_cast<size_t>(c.r * c.in)), B(static_cast<size_t>(c.out * c.r));
    pissa_factors(c.w.data(), c.out, c.in, c.r, c.scale, A.data(), B.data());
    const std::vector<float> ba = product(B, A, c.out, c.in, c.r);
    const double e_ba = rel_err(ba, product(c.B, c.A, c.out, c.in, c.r));
    const double e_ba64 = rel_err(ba, product(c.B64, c.A64, c.out, c.in, c.r));
    EXPECT_LT(e_ba64, 1e-6) << "s B A differs from the float64 SVD's";
    EXPECT_LT(e_ba, 5e-5) << "s B A differs from PEFT's";
    if (!c.residual.empty()) {
      EXPECT_LT(rel_err(residual_of(c, A, B), c.residual), 1e-5);
    }
    for (int j = 0; j < c.r; ++j) {
      float big = 0;
      for (int64_t i = 0; i < c.out; ++i)
        if (std::fabs(B[i * c.r + j]) > std::fabs(big)) big = B[i * c.r + j];
      EXPECT_GT(big, 0) << "component " << j << ": the sign convention";
    }
    std::vector<float> A64 = A, B64 = B;
    align_signs(A64, B64, c.B64, c.out, c.in, c.r);
    align_signs(A, B, c.B, c.out, c.in, c.r);
    const double ea = rel_err(A, c.A), eb = rel_err(B, c.B);
    const double ea64 = rel_err(A64, c.A64), eb64 = rel_err(B64, c.B64);
    std::printf(
        "%s: max error / max vs PEFT: s B A %.2g, A %.2g, B %.2g; vs float64: %.2g %.2g %.2g\n",
        c.name.c_str(), e_ba, ea, eb, e_ba64, ea64, eb64);
    EXPECT_LT(ea64, 1e-6);
    EXPECT_LT(eb64, 1e-6);
    EXPECT_LT(ea, 5e-5);
    EXPECT_LT(eb, 5e-5);
  }
}

// Householder QR with LAPACK's sign convention: A = R[:r] and B = Q[:, :r] equal torch.linalg.qr's
// (PEFT's olora_init) element for element, on wide (out < in) and tall (out > in) matrices, and
// w - s B A equals the residual base PEFT wrote.
TEST(Olora, FactorsEqualPefts) {
  for (const InitCase& c : init_cases("olora")) {
    SCOPED_TRACE(c.name);
    std::vector<float> A(static_cast<size_t>(c.r * c.in)), B(static_cast<size_t>(c.out * c.r));
    olora_factors(c.w.data(), c.out, c.in, c.r, A.data(), B.data());
    const double ea = rel_err(A, c.A), eb = rel_err(B, c.B);
    std::printf("%s: A %.2g, B %.2g (max error / max)\n", c.name.c_str(), ea, eb);
    EXPECT_LT(ea, 1e-5);
    EXPECT_LT(eb, 1e-5);
    if (!c.residual.empty()) {
      EXPECT_LT(rel_err(residual_of(c, A, B), c.residual), 1e-5);
    }
  }
}
// A rank above min(out, in) keeps the factors of rank min(out, in) and zeros the rest (both
// inits), so s B A is then all of w.
TEST(Olora, RankAboveTheShortSideZeroFillsAndReproducesW) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  const int64_t out = 5, in = 9;
  const int r = 7;
  std::vector<float> w(static_cast<size_t>(out * in));
  for (float& x : w) x = nd(rng);
  std::vector<float> A(static_cast<size_t>(r * in)), B(static_cast<size_t>(out * r));
  olora_factors(w.data(), out, in, r, A.data(), B.data());
  EXPECT_LT(rel_err(product(B, A, out, in, r), w), 1e-6);
  for (int j = 5; j < r; ++j)
    for (int64_t i = 0; i < out; ++i) EXPECT_EQ(B[i * r + j], 0.f);
  pissa_factors(w.data(), out, in, r, 0.5f, A.data(), B.data());
  std::vector<float> ba = product(B, A, out, in, r);
  for (float& x : ba) x *= 0.5f;
  EXPECT_LT(rel_err(ba, w), 1e-6);
  for (int j = 5; j < r; ++j)
    for (int64_t k = 0; k < in; ++k) EXPECT_EQ(A[j * in + k], 0.f);
}
