// The kernels a bf16 training step launches, in order (issue 45, Done when 2: "a bf16
// SmolLM2-shaped step lists no conversion or rounding kernel between producer and consumer").
// The step: the runner at precision bf16 with autocast (as make_backend sets it), 16-bit stored
// activations, NF4 base weights of SmolLM2-135M's widths (dim 576, 9 query / 3 KV heads of 64,
// ffn 1536; two of its 30 layers: the list repeats per layer), LoRA r 8 on all seven projections.
// The launch order comes from the backend's own launch wrapper (cuda_launch_sequence); each
// conversion or rounding kernel is listed with the launches around it (its producer before, its
// consumer after), and the test holds the list of those left to what the backend is known to
// launch, so a conversion added or removed shows here. Before the CUDA backend took the
// runner's 16-bit operands the same step launched 439 kernels, 255 of them conversions
// (k_round16 147, k_convert 76, k_widen 32).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda_entry.h"
#include "cuda_test_util.h"
#include "model/llama.h"
#include "model/lora.h"
#include "model/model.h"
#include "quant/qweight.h"

namespace {

using namespace qlft;

// SmolLM2-135M's layer widths (its config.json), two layers, random NF4 weights.
std::unique_ptr<Model> smollm2_shaped(MemoryTracker* t) {
  auto m = std::make_unique<Model>();
  ModelConfig& c = m->cfg;
  c.arch = "llama";
  c.n_layers = 2;
  c.dim = 576;
  c.n_heads = 9;
  c.n_kv_heads = 3;
  c.head_dim = 64;
  c.ffn_dim = 1536;
  c.vocab = 256;  // the head's width does not change the list
  c.context_length = 2048;
  c.tied_embeddings = true;
  m->shapes = model_shapes(c);
  std::mt19937_64 g(45);
  auto weight = [&](int64_t rows, int64_t cols, QuantKind k) {
    std::normal_distribution<float> d(0.f, 0.04f);
    std::vector<float> w(size_t(rows * cols));
    for (float& x : w) x = d(g);
    return qweight_from_f32(t, w.data(), rows, cols, k, 64, false);
  };
  auto ones = [&](int n) {
    Buffer b(t, MemCategory::Weights, size_t(n) * 4, "norm");
    for (int i = 0; i < n; ++i) b.as<float>()[i] = 1.f;
    return b;
  };
  m->tok_embd = weight(c.vocab, c.dim, QuantKind::F32);
  m->output_norm = ones(c.dim);
  const int64_t qd = 576, kvd = 192;
  const int64_t shape[kProjCount][2] = {{qd, c.dim},       {kvd, c.dim},       {kvd, c.dim},
                                        {c.dim, qd},       {c.ffn_dim, c.dim}, {c.ffn_dim, c.dim},
                                        {c.dim, c.ffn_dim}};
  m->layers.resize(size_t(c.n_layers));
  for (LayerWeights& L : m->layers) {
    L.attn_norm = ones(c.dim);
    L.ffn_norm = ones(c.dim);
    for (int p = 0; p < kProjCount; ++p)
      L.proj[p] = weight(shape[p][0], shape[p][1], QuantKind::NF4);
  }
  return m;
}

bool is_conversion(const std::string& k) {  // fp32 <-> 16-bit copies and rounding copies
  return k.rfind("k_convert", 0) == 0 || k.rfind("k_round16", 0) == 0 || k.rfind("k_widen", 0) == 0;
}

}  // namespace

TEST(CudaLaunchList, Bf16StepListsItsConversionKernels) {
  QLFT_NEED_GPU();
  MemoryTracker tr;
  auto m = smollm2_shaped(&tr);
  CudaBackendOptions o;
  o.spec.precision = Precision::BF16;
  o.autocast = true;  // as make_backend sets it for train.precision=bf16
  auto gpu = make_cuda_backend(&tr, o);
  const int S = 32;
  std::vector<int32_t> tok(S), tgt(S), pos(S);
  std::mt19937_64 g(46);
  for (int i = 0; i < S; ++i) {
    tok[size_t(i)] = int32_t(g() % 256);
    pos[size_t(i)] = i;
  }
  for (int i = 0; i < S; ++i) tgt[size_t(i)] = i + 1 < S ? tok[size_t(i) + 1] : kIgnoreIndex;
  TokenBatch b;
  b.batch = 1;
  b.seq = S;
  b.tokens = tok.data();
  b.targets = tgt.data();
  b.positions = pos.data();
  LoraConfig lc;
  lc.r = 8;
  lc.alpha = 16;
  LoraAdapter lora(&tr, m->shapes, lc);
  LlamaRunner run(*m, *gpu, &lora);
  run.set_activation_dtype(activation_dtype(Precision::BF16));
  (void)run.forward(b);  // the first step uploads the weights; the second is the one listed
  run.backward();
  cuda_trace_launches(true);
  const double loss = run.forward(b).mean();
  run.backward();
  cuda_trace_launches(false);
  const std::vector<std::string> seq = cuda_launch_sequence();
  ASSERT_TRUE(std::isfinite(loss));

  std::map<std::string, int> by_kernel;
  for (const std::string& k : seq) ++by_kernel[k];
  std::printf("bf16 SmolLM2-shaped step (2 layers, seq %d): %zu launches\n", S, seq.size());
  for (const auto& [k, n] : by_kernel)
    std::printf("  %5d  %s%s\n", n, k.c_str(), is_conversion(k) ? "   <- conversion" : "");
  // Each conversion with the nearest other launch before it (producer) and after it (consumer).
  std::map<std::tuple<std::string, std::string, std::string>, int> between;
  int conversions = 0;
  for (size_t i = 0; i < seq.size(); ++i) {
    if (!is_conversion(seq[i])) continue;
    ++conversions;
    size_t p = i, c = i;
    while (p > 0 && is_conversion(seq[p - 1])) --p;
    while (c + 1 < seq.size() && is_conversion(seq[c + 1])) ++c;
    const std::string prod = p > 0 ? seq[p - 1] : "(step start)";
    const std::string cons = c + 1 < seq.size() ? seq[c + 1] : "(step end)";
    ++between[{seq[i], prod, cons}];
  }
  std::printf("conversion kernels: %d, by (kernel: producer -> consumer)\n", conversions);
  for (const auto& [key, n] : between)
    std::printf("  %5d  %s: %s -> %s\n", n, std::get<0>(key).c_str(), std::get<1>(key).c_str(),
                std::get<2>(key).c_str());
  // The conversions left, by kernel (TileType 1 = bf16), with the producer and consumer each
  // sits between (per step of these 2 layers; the CUDA backend takes the runner's 16-bit
  // operands, takes_input_16, so norms, RoPE, SwiGLU and attention write the bf16 their GEMMs
  // read, and the base GEMMs read the stored bf16 x / dy as they are):
  //  - LoRA, its GEMMs on bf16 operands with fp32 sums: the fp32 factors A (forward and
  //    backward) and B, and the intermediates dy B and xa (backward) converted: 70 k_convert
  //    (GEMM -> GEMM); the forward's up-projection rounds xa and B: 28 k_round16. A factor's
  //    bf16 copy would be written by the optimizer step that writes A / B, and xa by its GEMM.
  //  - xa's 16-bit storage: the runner packs it (14 k_convert, after the layer) and unpacks it
  //    (14 k_widen, before the layer's backward); it is not among the tensors the runner hands
  //    over in 16 bits (kHalfWrittenDirect).
  //  - fp32 GEMM outputs that feed a bf16 operand: v (2), gate / up (linear_fwd_to_16: 4), the o
  //    projection's dx into attention's dout (2); the residual gradient (rmsnorm_bwd, fp32 for
  //    the residual) into the down / o projections' dy (4); attention's dv (2): 14 k_convert.
  //  - the head: the final norm's output rounded and converted (1 k_round16, 1 k_convert), the
  //    logits' gradient converted (1 k_convert).
  const std::map<std::string, int> left = {{"k_convert<(qlft::cu::TileType)1>", 100},
                                           {"k_round16<(qlft::cu::TileType)1>", 29},
                                           {"k_widen<(qlft::cu::TileType)1>", 14}};
  std::map<std::string, int> found;
  for (const auto& [k, n] : by_kernel)
    if (is_conversion(k)) found[k] = n;
  EXPECT_EQ(found, left);
}
