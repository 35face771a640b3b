// The mixture-of-experts FFN (model/moe.h) against transformers' MixtralSparseMoeBlock in fp32
// (fixture of tests/reference/gen_moe_fixtures.py): the routing, the output, and the input
// gradient through the experts and the routing weights; NF4 experts against a double-precision
// oracle over their dequantized weights; PEFT's LoRA on the experts and the router.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "core/memory.h"
#include "model/lora.h"
#include "model/moe.h"
#include "support/format_cases.h"
#include "test_model_util.h"
#include "support/test_support.h"
#include "train/planner.h"

namespace {

using namespace qlft;

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0, m = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    e = std::max(e, std::fabs(double(a[i]) - b[i]));
    m = std::max(m, std::fabs(double(b[i])));
  }
  return e / std::max(m, 1e-6);
}

struct Block {
  model_test::Fixture f;
  int64_t R = 0, D = 0, F = 0;
  int E = 0, K = 0;
  explicit Block(const char* file = "mixtral_block")
      : f(qlft_test::fixture_path(std::string("moe/") + file + ".safetensors")) {
    R = f.shape("x")[0], D = f.shape("x")[1], E = static_cast<int>(f.shape("router")[0]);
    F = f.shape("e0.w1")[0], K = f.i32("top_k")[0];
  }
  MoeWeights weights(MemoryTracker* t, QuantKind kind) const {
    MoeWeights w;
    w.top_k = K;
    if (f.has("norm_topk")) w.norm_topk = f.i32("norm_topk")[0] != 0;  // (Qwen3-MoE's: false)
    auto q = [&](const std::string& n, QuantKind k) {
      auto v = f.f32(n);
      return qweight_from_f32(t, v.data(), f.shape(n)[0], f.shape(n)[1], k);
    };
    w.router = q("router", QuantKind::F32);
    for (int e = 0; e < E; ++e) {
      const std::string p = "e" + std::to_string(e) + ".";
      w.w1.push_back(q(p + "w1", kind));
      w.w3.push_back(q(p + "w3", kind));
      w.w2.push_back(q(p + "w2", kind));
    }
    return w;
  }
};

// top_k 2 (Mixtral's), and top_k 1, where the renormalised weight is 1 and the routing path
// carries no gradient.
class MoeBlock : public ::testing::TestWithParam<const char*> {};

TEST_P(MoeBlock, MatchesTransformers) {
  Block b(GetParam());
  MemoryTracker tracker;
  std::unique_ptr<Backend> be = make_cpu_backend(&tracker);
  MoeWeights w = b.weights(&tracker, QuantKind::F32);
  const auto x = b.f.f32("x"), dout = b.f.f32("dout");
  std::vector<float> out(static_cast<size_t>(b.R * b.D)), dx(out.size(), 0.f);
  MoeSaved s;
  moe_fwd(*be, w, CMatF(x.data(), b.R, b.D), MatF(out.data(), b.R, b.D), s);
  EXPECT_EQ(moe_routed_experts(s), b.f.i32("index"));
  EXPECT_LT(max_rel(moe_routing_weights(s), b.f.f32("weight")), 1e-5);
  EXPECT_LT(max_rel(out, b.f.f32("out")), 1e-4);
  moe_bwd(*be, w, s, CMatF(x.data(), b.R, b.D), CMatF(dout.data(), b.R, b.D),
          MatF(dx.data(), b.R, b.D));
  const double e = max_rel(dx, b.f.f32("dx"));
  std::printf("out %.2e, dx %.2e (max rel vs transformers)\n", max_rel(out, b.f.f32("out")), e);
  EXPECT_LT(e, 1e-4);
  // With top_k 2 the routing path is a large part of the gradient: without it dx would be far
  // off (with top_k 1 it is zero).
  if (b.K > 1) EXPECT_GT(max_rel(b.f.f32("dx_no_route"), b.f.f32("dx")), 0.1);
  // Every expert got rows, so the test reaches each expert's backward.
  for (int e = 0; e < s.n_experts; ++e) EXPECT_GT(s.offset[size_t(e) + 1], s.offset[size_t(e)]);
}

INSTANTIATE_TEST_SUITE_P(Moe, MoeBlock, ::testing::Values("mixtral_block", "mixtral_block_top1"));

// PEFT's LoRA on the experts' fused gate_up_proj and down_proj and on the router (LoraConfig
// target_parameters, ParamWrapper; fixtures mixtral_block_lora and qwen3_moe_block_lora (top-k
// weights not renormalised) of gen_moe_fixtures.py, random non-zero B): the output, the input
// gradient and the gradients of every lora_A / lora_B in PEFT's layouts (1e-4).
class MoeLoraBlock : public ::testing::TestWithParam<const char*> {};

TEST_P(MoeLoraBlock, ExpertAndRouterLoraMatchPeft) {
  Block b(GetParam());
  MemoryTracker tracker;
  std::unique_ptr<Backend> be = make_cpu_backend(&tracker);
  MoeWeights w = b.weights(&tracker, QuantKind::F32);
  const int r = 2;
  struct Part {
    const char* name;
    int64_t out;
    int experts;
    MoeLoraPart MoeLora::*part;
    std::vector<float> A, B, dA, dB;
  };
  Part parts[] = {{"gate_up", 2 * b.F, b.E, &MoeLora::gate_up, {}, {}, {}, {}},
                  {"down", b.D, b.E, &MoeLora::down, {}, {}, {}, {}},
                  {"router", b.E, 1, &MoeLora::router, {}, {}, {}, {}}};
  MoeLora lora;
  for (Part& p : parts) {
    const std::string n = p.name;
    p.A = b.f.f32(n + ".A");
    p.B = moe_lora_b_from_peft(b.f.f32(n + ".B").data(), p.out, r, p.experts);
    p.dA.assign(p.A.size(), 0.f), p.dB.assign(p.B.size(), 0.f);
    lora.*p.part = MoeLoraPart{p.A.data(), p.B.data(), p.dA.data(), p.dB.data(), r, 3.f};
  }
  const auto x = b.f.f32("x"), dout = b.f.f32("dout");
  std::vector<float> out(static_cast<size_t>(b.R * b.D)), dx(out.size(), 0.f), plain(out.size());
  MoeSaved s;
  moe_fwd(*be, w, CMatF(x.data(), b.R, b.D), MatF(plain.data(), b.R, b.D), s);
  moe_fwd(*be, w, CMatF(x.data(), b.R, b.D), MatF(out.data(), b.R, b.D), s, &lora);
  EXPECT_LT(max_rel(out, b.f.f32("out")), 1e-4);
  EXPECT_GT(max_rel(plain, b.f.f32("out")), 0.05);  // the LoRA terms count
  moe_bwd(*be, w, s, CMatF(x.data(), b.R, b.D), CMatF(dout.data(), b.R, b.D),
          MatF(dx.data(), b.R, b.D), &lora);
  EXPECT_LT(max_rel(dx, b.f.f32("dx")), 1e-4);
  for (const Part& p : parts) {
    const std::string n = p.name;
    const double ea = max_rel(p.dA, b.f.f32(n + ".dA"));
    const double eb =
        max_rel(moe_lora_b_to_peft(p.dB.data(), p.out, r, p.experts), b.f.f32(n + ".dB"));
    std::printf("%s: dA %.2e, dB %.2e (max rel vs PEFT)\n", p.name, ea, eb);
    EXPECT_LT(ea, 1e-4) << n;
    EXPECT_LT(eb, 1e-4) << n;
  }
  // The saved LoRA inputs are what the planner counts (the tracker's 64-byte granules).
  auto counted = [](const Buffer& m) { return (uint64_t(m.size()) + 63) / 64 * 64; };
  EXPECT_GT(s.lora.size(), 0u);
  EXPECT_EQ(moe_saved_bytes(b.R, b.D, b.F, b.E, b.K, nullptr, MoeLoraRanks{r, r, r}),
            counted(s.route) + counted(s.acts) + counted(s.lora));
  // The backward refuses a LoRA other than the forward's.
  EXPECT_THROW(moe_bwd(*be, w, s, CMatF(x.data(), b.R, b.D), CMatF(dout.data(), b.R, b.D),
                       MatF(dx.data(), b.R, b.D)),
               Error);
}

INSTANTIATE_TEST_SUITE_P(Moe, MoeLoraBlock,
                         ::testing::Values("mixtral_block_lora", "qwen3_moe_block_lora"));

// The names PEFT 0.21 users pass for an MoE layer's experts and router (Mixtral's w1 / w2 / w3 and
// gate, which PEFT maps onto target_parameters, and those parameters' own names) read as the
// projections they stand for (on an MoE layer gate / up / down adapt the experts) and the router
// (test_moe_lora: the adapter and runner against PEFT).
TEST(Moe, PeftExpertTargetsRead) {
  struct Case {
    const char* name;
    Proj p;
    bool router;
  };
  for (const Case& c :
       {Case{"w1", Proj::Gate, false}, Case{"w3", Proj::Up, false}, Case{"w2", Proj::Down, false},
        Case{"gate", Proj::Q, true}, Case{"mlp.experts.gate_up_proj", Proj::Up, false},
        Case{"experts.down_proj", Proj::Down, false}, Case{"mlp.gate.weight", Proj::Q, true},
        Case{"block_sparse_moe.gate", Proj::Q, true}}) {
    LoraConfig cfg;
    cfg.set_targets(std::string("q_proj,") + c.name);
    EXPECT_TRUE(cfg.targets[int(c.p)]) << c.name;
    EXPECT_EQ(cfg.router, c.router) << c.name;
  }
  LoraConfig c;
  EXPECT_NO_THROW(c.set_targets("q_proj,gate_proj"));  // a dense model's gate stays a target
  EXPECT_FALSE(c.router);
}

// A malformed layer is refused naming what is wrong: the expert whose shape is off, the top_k.
TEST(Moe, BadWeightsRefusedByName) {
  Block b;
  MemoryTracker tracker;
  std::unique_ptr<Backend> be = make_cpu_backend(&tracker);
  const auto x = b.f.f32("x");
  std::vector<float> out(static_cast<size_t>(b.R * b.D));
  auto refusal = [&](const MoeWeights& w) {
    MoeSaved s;
    try {
      moe_fwd(*be, w, CMatF(x.data(), b.R, b.D), MatF(out.data(), b.R, b.D), s);
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), QLFT_ERR_INVALID_ARGUMENT);
      return std::string(e.what());
    }
    ADD_FAILURE() << "accepted";
    return std::string();
  };
  MoeWeights w = b.weights(&tracker, QuantKind::F32);
  std::swap(w.w2[2], w.w3[2]);  // expert 2's down projection [dim, ffn] where up [ffn, dim] goes
  std::string m = refusal(w);
  EXPECT_NE(m.find("expert 2 has w1 [40, 24], w3 [24, 40]"), std::string::npos) << m;
  w = b.weights(&tracker, QuantKind::F32);
  w.top_k = 5;
  m = refusal(w);
  EXPECT_NE(m.find("top_k 5 of 4 experts"), std::string::npos) << m;
}

// NF4 experts (quant.type's default) against a double-precision oracle of the same block over the
// experts' dequantized weights, routing taken from the fixture (its margins keep it unchanged).
TEST(Moe, Nf4ExpertsMatchDequantizedOracle) {
  Block b;
  MemoryTracker tracker;
  std::unique_ptr<Backend> be = make_cpu_backend(&tracker);
  MoeWeights w = b.weights(&tracker, QuantKind::NF4);
  const auto x = b.f.f32("x");
  const auto idx = b.f.i32("index");
  const auto wt = b.f.f32("weight");
  std::vector<float> out(static_cast<size_t>(b.R * b.D));
  MoeSaved s;
  moe_fwd(*be, w, CMatF(x.data(), b.R, b.D), MatF(out.data(), b.R, b.D), s);
  EXPECT_EQ(moe_routed_experts(s), idx);
  auto deq = [](const QWeight& q) {
    std::vector<float> v(static_cast<size_t>(q.rows * q.cols));
    q.dequantize_rows(0, q.rows, v.data());
    return v;
  };
  std::vector<float> ref(out.size(), 0.f);
  for (int64_t r = 0; r < b.R; ++r)
    for (int k = 0; k < b.K; ++k) {
      const int e = idx[static_cast<size_t>(r * b.K + k)];
      const auto w1 = deq(w.w1[e]), w3 = deq(w.w3[e]), w2 = deq(w.w2[e]);
      std::vector<double> h(static_cast<size_t>(b.F));
      for (int64_t j = 0; j < b.F; ++j) {
        double g = 0, u = 0;
        for (int64_t d = 0; d < b.D; ++d) {
          g += double(w1[j * b.D + d]) * x[r * b.D + d];
          u += double(w3[j * b.D + d]) * x[r * b.D + d];
        }
        h[j] = g / (1 + std::exp(-g)) * u;
      }
      for (int64_t d = 0; d < b.D; ++d) {
        double y = 0;
        for (int64_t j = 0; j < b.F; ++j) y += double(w2[d * b.F + j]) * h[j];
        ref[r * b.D + d] += static_cast<float>(wt[r * b.K + k] * y);
      }
    }
  EXPECT_LT(max_rel(out, ref), 1e-4);
  // NF4 moved the block's output off the fp32 reference: the quantized weights were used.
  EXPECT_GT(max_rel(out, b.f.f32("out")), 1e-3);
}

// llama.cpp's MoE GGUF (Mixtral is written as general.architecture "llama" with
// llama.expert_count and the routers blk.N.ffn_gate_inp): a router without expert_count is
// refused, and expert_count without any router is a format error, at load and by the planner
// behind `estimate`, naming the keys and tensors; the same file without them loads (the
// Mixtral GGUF itself: Families.MixtralMatchesTransformersAndPeft).
TEST(Moe, GgufMoeRefusedByName) {
  const std::string dir = qlft_test::temp_dir("moe-gguf");
  auto write = [&](const qlft_test::RawGguf& g, const std::string& name) {
    const auto b = g.build();
    const std::string p = dir + "/" + name + ".gguf";
    qlft_test::write_file(p, b.data(), b.size());
    return p;
  };
  LoadOptions keep;
  keep.quant_type = QuantType::Keep;
  {
    MemoryTracker tr;
    EXPECT_NO_THROW(load_model(&tr, write(qlft_test::tiny_llama_gguf(), "dense"), keep));
  }
  qlft_test::RawGguf with_key = qlft_test::tiny_llama_gguf();
  with_key.kv.push_back(qlft_test::kv_u32("llama.expert_count", 4));
  with_key.kv.push_back(qlft_test::kv_u32("llama.expert_used_count", 2));
  qlft_test::RawGguf with_router = qlft_test::tiny_llama_gguf();
  with_router.find("blk.0.ffn_gate.weight")->name = "blk.0.ffn_gate_inp.weight";
  struct Case {
    qlft_test::RawGguf g;
    int32_t status;
    std::vector<std::string> named;
  };
  const Case cases[] = {
      {with_key, QLFT_ERR_FORMAT, {"llama.expert_count' is 4", "blk.N.ffn_gate_inp.weight"}},
      {with_router,
       QLFT_ERR_UNSUPPORTED,
       {"mixture-of-experts layers (llama.expert_count 0", "ffn_gate_exps"}}};
  for (const Case& c : cases) {
    const std::string p = write(c.g, "moe");
    for (int planner = 0; planner < 2; ++planner) {
      MemoryTracker tr;
      ModelConfig mc;
      try {
        if (planner)
          weight_footprint_of_file(p, keep, &mc);
        else
          load_model(&tr, p, keep);
        ADD_FAILURE() << "an MoE GGUF was accepted";
      } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_EQ(e.status(), c.status) << m;
        for (const std::string& n : c.named) EXPECT_NE(m.find(n), std::string::npos) << m;
        EXPECT_NE(m.find(p), std::string::npos) << m;
      }
      EXPECT_EQ(tr.total_reserved(), 0u);
    }
  }
}

}  // namespace
