// The embedding and head at 16-bit GEMM tiles (issue 47: "embedding and head in bf16 on the
// device"; issue 45: the head reads bf16 operands with no conversion kernel before its GEMMs).
// A plain fp32 embedding / head table is kept on the device in bf16 (fp16) at precision bf16
// (fp16), half the bytes, counted as weights, and in fp32 at precision fp32; the lookup gathers
// its rows widened.
// Oracles: the host's own rounding (core/half.h) for the lookup, and the CPU backend at fp32 on
// the bf16-rounded operands for the logits and the fused cross-entropy (the bf16 GEMMs accumulate
// in fp32, so only the logits' gradient, rounded to bf16 for its GEMM, departs from that).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda_entry.h"
#include "backend/cuda_sizes.h"
#include "core/half.h"
#include "cuda_test_util.h"
#include "quant/qweight.h"

namespace {

using FVec = std::vector<float>;
using qlft_cuda_test::norm_err;

FVec normal(std::mt19937_64& g, size_t n, float sd) {
  std::normal_distribution<float> d(0.f, sd);
  FVec v(n);
  for (auto& x : v) x = d(g);
  return v;
}
FVec rounded(const FVec& v, bool f16 = false) {
  FVec r(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    r[i] =
        f16 ? qlft::f16_to_f32(qlft::f32_to_f16(v[i])) : qlft::bf16_to_f32(qlft::f32_to_bf16(v[i]));
  return r;
}
std::vector<uint16_t> to_bf16(const FVec& v) {
  std::vector<uint16_t> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = qlft::f32_to_bf16(v[i]);
  return r;
}
std::unique_ptr<qlft::Backend> gpu_at(qlft::MemoryTracker* t, qlft::Precision p) {
  qlft::CudaBackendOptions o;
  o.spec.precision = p;
  o.autocast = p != qlft::Precision::FP32;  // as make_backend sets it for training
  return qlft::make_cuda_backend(t, o);
}
uint64_t weights(qlft::MemoryTracker& t) {
  return t.snapshot().reserved[QLFT_MEM_WEIGHTS];
}
bool is_conversion(const std::string& k) {
  return k.rfind("k_convert", 0) == 0 || k.rfind("k_round16", 0) == 0 || k.rfind("k_widen", 0) == 0;
}

}  // namespace

// The lookup at bf16 (fp16) gathers the table's rows rounded to bf16 (fp16, nearest even), from a
// device copy of V x H x 2 bytes; at fp32 the rows as they are, from V x H x 4. Used again (the
// head of a tied model), the copy is not uploaded twice.
TEST(CudaHead16, EmbeddingKeptIn16BitsAtPrecisionBf16OrFp16) {
  QLFT_NEED_GPU();
  for (qlft::Precision pr : {qlft::Precision::BF16, qlft::Precision::FP16, qlft::Precision::FP32}) {
    const bool half = pr != qlft::Precision::FP32, f16 = pr == qlft::Precision::FP16;
    SCOPED_TRACE(f16 ? "fp16" : half ? "bf16" : "fp32");
    qlft::MemoryTracker tr;
    auto gpu = gpu_at(&tr, pr);
    std::mt19937_64 g(47);
    const int64_t V = 515, H = 64, M = 29;
    const FVec ev = normal(g, size_t(V * H), 0.1f);
    qlft::QWeight emb = qlft::qweight_from_f32(&tr, ev.data(), V, H, qlft::QuantKind::F32);
    std::vector<int32_t> tok(static_cast<size_t>(M));
    for (int64_t i = 0; i < M; ++i) tok[size_t(i)] = int32_t((i * 37) % V);
    const FVec table = half ? rounded(ev, f16) : ev;
    FVec want(size_t(M * H)), e(size_t(M * H));
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < H; ++j)
        want[size_t(i * H + j)] = table[size_t(tok[size_t(i)] * H + j)];
    const uint64_t before = weights(tr);
    gpu->embedding_fwd(emb, tok.data(), {e.data(), M, H, H});
    EXPECT_EQ(e, want);
    const uint64_t copy = weights(tr) - before;
    EXPECT_EQ(copy, qlft::cuda_alloc_round(uint64_t(V * H) * (half ? 2 : 4)));
    FVec h = normal(g, size_t(M * H), 1.f), lg(size_t(M * V));
    gpu->head_logits(emb, {h.data(), M, H, H}, {lg.data(), M, V, V});
    EXPECT_EQ(weights(tr) - before, copy);  // the same copy serves the head
  }
}

// Logits and the fused cross-entropy at bf16 with an fp32 head kept in bf16, h given as the
// runner gives it (its bf16 copy, begin_shared_input_16) and as fp32 alone: against the CPU
// backend at fp32 on the rounded head and h. With the 16-bit h the cross-entropy launches no
// conversion or rounding kernel.
TEST(CudaHead16, HeadAndCrossEntropyReadBf16Operands) {
  QLFT_NEED_GPU();
  qlft::MemoryTracker tr;
  auto cpu = qlft::make_cpu_backend(&tr);
  auto gpu = gpu_at(&tr, qlft::Precision::BF16);
  std::mt19937_64 g(45);
  // V over one head panel at this H (kCudaPanelBytes / (H * 2) rows) would make the test slow in
  // the emulator; M over one logits chunk neither: the panel and chunk loops are the fp32 path's.
  const int64_t V = 777, H = 96, M = 37;
  const FVec hv = normal(g, size_t(V * H), 0.1f);
  qlft::QWeight head = qlft::qweight_from_f32(&tr, hv.data(), V, H, qlft::QuantKind::F32);
  const FVec hr = rounded(hv);
  qlft::QWeight head_r = qlft::qweight_from_f32(&tr, hr.data(), V, H, qlft::QuantKind::F32);
  const FVec h = normal(g, size_t(M * H), 1.f), h_r = rounded(h);
  // The runner's bf16 copy of h lives in the backend's memory.
  qlft::Buffer h16 = gpu->alloc(qlft::MemCategory::Activations, size_t(M * H) * 2, "h (bf16)",
                                qlft::BufferInit::Uninit);
  h16.copy_from_host(to_bf16(h).data(), size_t(M * H) * 2);
  std::vector<int32_t> tg(static_cast<size_t>(M));
  for (int64_t i = 0; i < M; ++i) tg[size_t(i)] = int32_t((i * 53 + 7) % V);
  tg[2] = tg[11] = -100;

  FVec lg0(size_t(M * V)), lg1(lg0.size());
  cpu->head_logits(head_r, {h_r.data(), M, H, H}, {lg0.data(), M, V, V});
  FVec dh0(size_t(M * H), 0.25f);
  int64_t n0 = 0;
  const double L0 = cpu->linear_cross_entropy(head_r, {h_r.data(), M, H, H}, tg.data(), -100, 0.5f,
                                              {dh0.data(), M, H, H}, &n0);
  const uint64_t before = weights(tr);
  for (bool given16 : {true, false}) {
    SCOPED_TRACE(given16 ? "h in bf16 from the runner" : "h in fp32");
    qlft::CMatF hm{h.data(), M, H, H};
    std::unique_ptr<qlft::SharedInput> scope;
    if (given16)
      scope = std::make_unique<qlft::SharedInput>(*gpu, hm, qlft::DType::BF16, h16.as<uint16_t>());
    gpu->head_logits(head, hm, {lg1.data(), M, V, V});
    EXPECT_LT(norm_err(lg1, lg0), 1e-5);
    FVec dh1(size_t(M * H), 0.25f);
    int64_t n1 = 0;
    qlft::cuda_trace_launches(true);
    const double L1 =
        gpu->linear_cross_entropy(head, hm, tg.data(), -100, 0.5f, {dh1.data(), M, H, H}, &n1);
    qlft::cuda_trace_launches(false);
    int conversions = 0;
    for (const std::string& k : qlft::cuda_launch_sequence()) conversions += is_conversion(k);
    EXPECT_EQ(n1, n0);
    EXPECT_NEAR(L1, L0, 1e-5 * std::fabs(L0));
    // The logits' gradient rounded to bf16 for its GEMM: relative error ~2^-9 per element.
    EXPECT_LT(norm_err(dh1, dh0), 5e-3);
    // (The backend's own launch record.) h's chunk converted only when fp32 h is all there is.
    EXPECT_EQ(conversions, given16 ? 0 : 1);
  }
  // The head's device copy in bf16, uploaded once.
  EXPECT_EQ(weights(tr) - before, qlft::cuda_alloc_round(uint64_t(V * H) * 2));
}
