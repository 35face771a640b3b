// The kernels a bf16 training step launches, in order (issue 45, Done when 2: "a bf16
// SmolLM2-shaped step lists no conversion or rounding kernel between producer and consumer").
// The step: the runner at precision bf16 with autocast (as make_backend sets it), 16-bit stored
// activations, NF4 base weights of SmolLM2-135M's widths (dim 576, 9 query / 3 KV heads of 64,
// ffn 1536; two of its 30 layers: the list repeats per layer), LoRA r 8 on all seven projections,
// the adapter resident on the device and stepped there by the device AdamW (as the trainer does
// it: forward, backward, optimizer step). The launch order comes from the backend's own launch
// wrapper (cuda_launch_sequence); each conversion or rounding kernel is listed with the launches
// around it (its producer before, its consumer after), and the test holds the list of those left
// to what the backend is known to launch, so a conversion added or removed shows here.
// History of the same step: 439 launches, 255 of them conversions (k_round16 147, k_convert 76,
// k_widen 32) before the CUDA backend took the runner's 16-bit operands; 325 / 143 before LoRA
// ran in bf16 (bf16 copies of A / B written by the optimizer, xa and dy B written in bf16 by
// their GEMMs, xa stored as written); 195 / 14 (the head's gone) before the GEMMs wrote the
// bf16 outputs their consumers read (gate / up, the o projection's dx) and the attention
// backward wrote dv in bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda_entry.h"
#include "core/half.h"
#include "cuda_test_util.h"
#include "model/llama.h"
#include "model/lora.h"
#include "model/model.h"
#include "quant/qweight.h"
#include "smollm2_shaped.h"
#include "train/device_adamw.h"

namespace {

using namespace qlft;

bool is_conversion(const std::string& k) {  // fp32 <-> 16-bit copies and rounding copies
  return k.rfind("k_convert", 0) == 0 || k.rfind("k_round16", 0) == 0 || k.rfind("k_widen", 0) == 0;
}

}  // namespace

TEST(CudaLaunchList, Bf16StepListsItsConversionKernels) {
  QLFT_NEED_GPU();
  MemoryTracker tr;
  auto m = qlft_cuda_test::smollm2_shaped(&tr, 2);  // the head's width does not change the list
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
  run.keep_lora_on_device();  // as the trainer does for a device optimizer
  const int64_t n = run.lora_device_count();
  ASSERT_NE(run.lora_device_weights16(), nullptr);  // the bf16 copy of A / B is kept
  OptimSettings os;
  os.lr = 1e-3;
  const std::vector<ParamRef> params = {ParamRef{"lora", nullptr, nullptr, size_t(n), 1.0}};
  auto opt = make_device_adamw(os, params, *gpu, run.lora_device_weights(), run.lora_device_grads(),
                               n, run.lora_device_weights16());
  auto step = [&] {
    run.zero_lora_grads();
    const double l = run.forward(b).mean();
    run.backward();
    opt->step(1e-3);
    run.lora_device_written(true);  // (what the trainer says after this optimizer's step)
    return l;
  };
  // The device copy of A / B and its bf16 copy, on the host.
  auto factors = [&] {
    std::vector<float> w(size_t(n), 0.f), w16(size_t(n), 0.f);
    gpu->copy(w.data(), run.lora_device_weights(), n);
    Buffer wide =
        gpu->alloc(MemCategory::Workspace, size_t(n) * 4, "bf16 copy widened", BufferInit::Uninit);
    gpu->from_16(DType::BF16, run.lora_device_weights16(), wide.as<float>(), n);
    wide.copy_to_host(w16.data(), size_t(n) * 4);
    return std::make_pair(w, w16);
  };
  (void)step();  // the first step uploads the weights; the second is the one listed
  const std::vector<float> before16 = factors().second;
  cuda_trace_launches(true);
  const double loss = step();
  cuda_trace_launches(false);
  const std::vector<std::string> seq = cuda_launch_sequence();
  ASSERT_TRUE(std::isfinite(loss));
  // The optimizer moved A / B and wrote their bf16 copy: each value the fp32 one rounded to
  // nearest even (what a conversion kernel would have made), not the step before's.
  const auto [w, w16] = factors();
  int64_t moved = 0, wrong = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    moved += w16[i] != before16[i];
    wrong += w16[i] != bf16_to_f32(f32_to_bf16(w[i]));
  }
  EXPECT_GT(moved, n / 2);
  EXPECT_EQ(wrong, 0);

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
  // sits between (per step of these 2 layers). LoRA makes none: the optimizer writes A / B's
  // bf16 copy beside them (k_adamw_torch), the forward's xa and the backward's dy B are written
  // in bf16 by their GEMMs (cuBLASLt's bf16 output) and xa is stored as written. Nor do the
  // GEMM outputs that feed a bf16 operand: gate and up (linear_fwd_to_16) and the o
  // projection's dx into attention's dout (next_dx_16) are written in bf16 by their GEMMs, the
  // LoRA GEMM first and the weight panel's GEMM adding into its bf16 output (cuBLASLt's C and D
  // share one type, so an fp32 sum could not be finished in bf16); attention's dv is written in
  // bf16 by the tensor-core kernel. Nor v (linear_fwd_to_16: its GEMM writes the stored bf16
  // copy attention reads), nor the residual gradient into the down / o projections' dy (the
  // norm's backward writes its bf16 copy beside the fp32 sum: rmsnorm_bwd_16, next_dy_16).
  // Outside the head, none is left.
  const std::map<std::string, int> left = {};
  // The head makes none: the final norm writes h's bf16 copy beside its fp32 output
  // (rmsnorm_fwd_16, handed over by begin_shared_input_16), the fp32 head is kept in bf16 on the
  // device and read in place as the GEMMs' panels, and k_ce_grad writes the logits' gradient in
  // bf16 for the dh GEMM.
  for (const auto& [key, cnt] : between) {
    EXPECT_NE(std::get<1>(key).rfind("k_ce_", 0), 0u) << std::get<0>(key) << " x" << cnt;
    EXPECT_NE(std::get<1>(key), "k_rmsnorm_fwd") << std::get<0>(key) << " x" << cnt;
  }
  // None of LoRA's: no conversion between two GEMMs, none at the step's start (A / B).
  EXPECT_EQ((between[{"k_convert<(qlft::cu::TileType)1>", "cublasLtMatmul", "cublasLtMatmul"}]), 0);
  EXPECT_EQ((between[{"k_round16<(qlft::cu::TileType)1>", "cublasLtMatmul", "cublasLtMatmul"}]), 0);
  for (const auto& [key, cnt] : between)
    EXPECT_NE(std::get<1>(key), "(step start)") << std::get<0>(key) << " x" << cnt;
  std::map<std::string, int> found;
  for (const auto& [k, n] : by_kernel)
    if (is_conversion(k)) found[k] = n;
  EXPECT_EQ(found, left);
}
