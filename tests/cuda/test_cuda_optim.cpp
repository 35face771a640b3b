// Optimizer and loss-scaler kernels against the CPU: torch AdamW against the host AdamW optimizer
// (bit for bit), bitsandbytes 8-bit AdamW against the CPU AdamW8bit optimizer (params,
// 8-bit codes and absmax after three steps, a non-finite gradient included), gradient sum of
// squares, scaling and the non-finite count against host loops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda_entry.h"
#include "cuda_test_util.h"
#include "optim/adamw.h"
#include "optim/adamw8bit.h"
#include "optim/optimizer.h"
#include "train/device_adamw.h"

using qlft_cuda_test::norm_err;

#if QLFT_CUDA_EMULATE
namespace qlft_emu {  // cuda/emu/src/emu_internal.h (not in the CUDA API the shim copies)
struct ManagedPrefetchStats {
  uint64_t requested_bytes = 0, to_device_bytes = 0, to_host_bytes = 0;
};
ManagedPrefetchStats managed_prefetch_stats();
}  // namespace qlft_emu
#endif

namespace {

using FVec = std::vector<float>;

FVec normal(size_t n, uint64_t seed, float sd = 1.f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, sd);
  FVec v(n);
  for (auto& x : v) x = d(g);
  return v;
}

template <class T>
qlft::DeviceMemory to_dev(qlft::MemoryTracker* t, const std::vector<T>& h) {
  qlft::DeviceMemory d(t, qlft::MemCategory::Workspace, h.size() * sizeof(T), "test array");
  d.upload(h.data(), h.size() * sizeof(T));
  return d;
}
template <class T>
std::vector<T> from_dev(const qlft::DeviceMemory& d, size_t n) {
  std::vector<T> h(n);
  d.download(h.data(), n * sizeof(T));
  return h;
}

// The coefficients the CPU AdamW8bit computes for step t.
qlft::AdamBnbCoeffs bnb_coeffs(const qlft::OptimSettings& s, double lr, int64_t t) {
  return qlft::adam_bnb_coeffs(s, lr, t);
}

}  // namespace

// The device AdamW kernel against the host AdamW optimizer (optim/adamw.cpp: the trainer's host
// step, the one the CPU backend and the host-step path over MPI use) over three steps: the same
// bits in parameters and both moments. The second moment's multiply-add is one fmaf in
// adamw_torch_update: left to the compiler, the host's vectorized loop and the kernel contracted
// it differently, and the NCCL device step parted from the MPI host step by an ulp of v (ctest
// dist_nccl_loss_curve, fp16).
TEST(CudaOptim, AdamWTorchEqualsHostOptimizer) {
  QLFT_NEED_GPU();
  qlft::MemoryTracker t;
  const size_t n = 10007;
  FVec p = normal(n, 1), grad(n);
  qlft::OptimSettings s;
  s.kind = qlft::OptimizerKind::AdamW;
  s.lr = 1e-3;
  s.weight_decay = 0.01;
  auto opt = qlft::make_optimizer(s, {{"w", p.data(), grad.data(), n}}, &t);
  auto P = to_dev(&t, p), Mm = to_dev(&t, FVec(n, 0.f)), Vv = to_dev(&t, FVec(n, 0.f));
  for (int step = 1; step <= 3; ++step) {
    const FVec g = normal(n, 10 + step);
    std::copy(g.begin(), g.end(), grad.begin());  // in place: the optimizer holds grad.data()
    auto G = to_dev(&t, grad);
    opt->step(s.lr);
    qlft::cuda_adamw_torch_step(P.as<float>(), Mm.as<float>(), Vv.as<float>(), G.as<float>(),
                                int64_t(n), qlft::adamw_torch_coeffs(s, s.lr, step));
  }
  qlft::StateDict sd;
  opt->save_state(sd, "o.");
  auto bits_differ = [&](const FVec& dev, const void* host) {
    size_t d = 0;
    for (size_t i = 0; i < n; ++i)
      d += std::memcmp(&dev[i], static_cast<const float*>(host) + i, 4) != 0;
    return d;
  };
  EXPECT_EQ(bits_differ(from_dev<float>(P, n), p.data()), 0u) << "parameters";
  EXPECT_EQ(bits_differ(from_dev<float>(Mm, n), sd.tensors().at("o.w.exp_avg").bytes.data()), 0u)
      << "exp_avg";
  EXPECT_EQ(bits_differ(from_dev<float>(Vv, n), sd.tensors().at("o.w.exp_avg_sq").bytes.data()), 0u)
      << "exp_avg_sq";
}

TEST(CudaOptim, AdamW8bitMatchesCpuOptimizer) {
  QLFT_NEED_GPU();
  qlft::MemoryTracker t;
  const size_t n = 256 * 20 + 77;  // a partial last block
  FVec p = normal(n, 2, 0.1f), grad(n);
  qlft::OptimSettings s;
  s.kind = qlft::OptimizerKind::AdamW8bit;
  s.lr = 1e-3;
  s.weight_decay = 0.01;
  auto opt = qlft::make_optimizer(s, {{"w", p.data(), grad.data(), n}}, &t);

  const size_t blocks = (n + 255) / 256;
  auto P = to_dev(&t, p);
  auto Q1 = to_dev(&t, std::vector<uint8_t>(n, 0)), Q2 = to_dev(&t, std::vector<uint8_t>(n, 0));
  auto A1 = to_dev(&t, FVec(blocks, 0.f)), A2 = to_dev(&t, FVec(blocks, 0.f));
  int64_t skipped_gpu = 0, skipped_cpu = 0;
  for (int step = 1; step <= 3; ++step) {
    // In place: the optimizer holds grad.data() (assigning a new vector would leave it a
    // dangling pointer).
    const FVec g = normal(n, 20 + step, 0.01f);
    std::copy(g.begin(), g.end(), grad.begin());
    if (step == 2) grad[300] = NAN;  // one non-finite element: skipped, its state restarts
    auto G = to_dev(&t, grad);
    skipped_cpu += opt->step(s.lr).skipped_elements;
    skipped_gpu += qlft::cuda_adamw_bnb8_step(P.as<float>(), Q1.as<uint8_t>(), Q2.as<uint8_t>(),
                                              A1.as<float>(), A2.as<float>(), G.as<float>(),
                                              int64_t(n), bnb_coeffs(s, s.lr, step));
  }
  EXPECT_EQ(skipped_gpu, skipped_cpu);
  EXPECT_EQ(skipped_gpu, 1);
  EXPECT_LT(norm_err(from_dev<float>(P, n), p), 1e-6);
  qlft::StateDict sd;
  opt->save_state(sd, "o.");
  const auto& tens = sd.tensors();
  const auto& q1 = tens.at("o.w.state1").bytes;
  const auto& q2 = tens.at("o.w.state2").bytes;
  const auto g1 = from_dev<uint8_t>(Q1, n), g2 = from_dev<uint8_t>(Q2, n);
  size_t diff = 0;
  for (size_t i = 0; i < n; ++i) diff += (g1[i] != q1[i]) + (g2[i] != q2[i]);
  EXPECT_EQ(diff, 0u) << "8-bit state codes differ from the CPU optimizer's";
  FVec a1(blocks);
  std::memcpy(a1.data(), tens.at("o.w.absmax1").bytes.data(), blocks * 4);
  EXPECT_LT(norm_err(from_dev<float>(A1, blocks), a1), 1e-6);
}

TEST(CudaOptim, GradNormScaleAndNonFinite) {
  QLFT_NEED_GPU();
  qlft::MemoryTracker t;
  const size_t n = 300001;
  FVec g = normal(n, 3);
  double ss = 0;
  for (float x : g) ss += double(x) * x;
  auto G = to_dev(&t, g);
  EXPECT_NEAR(qlft::cuda_sum_squares(G.as<float>(), int64_t(n)), ss, 1e-9 * ss);
  qlft::cuda_scale(G.as<float>(), int64_t(n), 0.5f);
  FVec h = from_dev<float>(G, n);
  for (size_t i = 0; i < n; i += 997) ASSERT_EQ(h[i], g[i] * 0.5f);
  EXPECT_EQ(qlft::cuda_count_nonfinite(G.as<float>(), int64_t(n)), 0);
  h[5] = INFINITY;
  h[n - 1] = NAN;
  h[1234] = -INFINITY;
  G.upload(h.data(), n * 4);
  EXPECT_EQ(qlft::cuda_count_nonfinite(G.as<float>(), int64_t(n)), 3);
}

// The trainer's device 8-bit AdamW (train/device_adamw8bit.cpp: Backend::adamw_bnb8 / adamw_bnb32
// per tensor on one flat device array) against the host AdamW8bit (optim/adamw8bit.cpp) on the
// same random gradients: a tensor with a partial last block, one under 4096 elements (fp32 state)
// and one with a LoRA+ lr_scale; a NaN gradient element at step 2 (skipped, its state restarts).
// Both write the same checkpoint entries; after 3 steps the 8-bit codes, absmax and those
// tensors' parameters must be the same bits (the fp32-state path within 1e-6 normalized: FMA
// contraction may differ by an ulp), and a device optimizer that loads the host's state steps as
// the host does. Run for adamw8bit (device memory) and paged_adamw8bit (managed memory, prefetched
// per tensor).
class CudaDeviceAdamW8bit : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaDeviceAdamW8bit, StateAndParamsEqualHostOptimizer) {
  QLFT_NEED_GPU();
  qlft::MemoryTracker t;
  qlft::CudaBackendOptions o;
  auto be = qlft::make_cuda_backend(&t, o);
  qlft::OptimSettings s;
  s.kind = std::string(GetParam()) == "paged_adamw8bit" ? qlft::OptimizerKind::PagedAdamW8bit
                                                        : qlft::OptimizerKind::AdamW8bit;
  s.lr = 2e-3;
  s.weight_decay = 0.01;
  const std::vector<size_t> sizes = {256 * 20 + 77, 1000, 8192};
  size_t n = 0;
  for (size_t k : sizes) n += k;
  FVec p = normal(n, 5, 0.1f), grad(n);
  auto params = [&](float* data, const float* g) {
    std::vector<qlft::ParamRef> ps;
    size_t o = 0;
    for (size_t k = 0; k < sizes.size(); ++k) {
      ps.push_back({"t" + std::to_string(k), data + o, g + o, sizes[k]});
      o += sizes[k];
    }
    ps[2].lr_scale = 4.0;  // LoRA+: this tensor's lr is 4x
    return ps;
  };
  // The host optimizer on host memory; a paged host store is files, so adamw8bit there.
  qlft::OptimSettings hs = s;
  hs.kind = qlft::OptimizerKind::AdamW8bit;
  auto host = qlft::make_optimizer(hs, params(p.data(), grad.data()), &t);
  qlft::Buffer w = be->alloc(qlft::MemCategory::Adapter, n * 4, "test params");
  qlft::Buffer g = be->alloc(qlft::MemCategory::Gradients, n * 4, "test grads");
  w.copy_from_host(p.data(), n * 4);
  auto dev = qlft::make_device_adamw8bit(s, params(p.data(), grad.data()), *be, w.as<float>(),
                                         g.as<float>(), int64_t(n));
  auto step_both = [&](qlft::Optimizer& d, int step) {
    const FVec r = normal(n, 40 + step, 0.01f);
    std::copy(r.begin(), r.end(), grad.begin());  // in place: the host optimizer holds grad
    if (step == 2) grad[300] = NAN;
    g.copy_from_host(grad.data(), n * 4);
    host->step(s.lr);
    d.step(s.lr);
  };
  auto expect_same = [&](const qlft::Optimizer& d, const char* when) {
    qlft::StateDict hd, dd;
    host->save_state(hd, "o.");
    d.save_state(dd, "o.");
    ASSERT_EQ(hd.size(), dd.size()) << when;
    for (const auto& [name, ht] : hd.tensors()) {
      ASSERT_TRUE(dd.tensors().count(name)) << when << ": " << name;
      const auto& dt = dd.tensors().at(name);
      EXPECT_EQ(dt.dtype, ht.dtype) << when << ": " << name;
      EXPECT_EQ(dt.shape, ht.shape) << when << ": " << name;
      if (name.find(".exp_avg") == std::string::npos) {  // 8-bit codes, absmax, step
        EXPECT_TRUE(dt.bytes == ht.bytes) << when << ": " << name << " differs from the host's";
      } else {  // fp32 state: FMA contraction may differ by an ulp (as the kernel test's bound)
        FVec a(dt.bytes.size() / 4), b(ht.bytes.size() / 4);
        std::memcpy(a.data(), dt.bytes.data(), dt.bytes.size());
        std::memcpy(b.data(), ht.bytes.data(), ht.bytes.size());
        EXPECT_LT(norm_err(a, b), 1e-6) << when << ": " << name;
      }
    }
    FVec dp(n);
    w.copy_to_host(dp.data(), n * 4);
    EXPECT_LT(norm_err(dp, p), 1e-6) << when << ": parameters";
    // The 8-bit tensors' parameters are the host's bits.
    size_t diff = 0;
    for (size_t i = 0; i < n; ++i)
      if (i < sizes[0] || i >= sizes[0] + sizes[1]) diff += std::memcmp(&dp[i], &p[i], 4) != 0;
    EXPECT_EQ(diff, 0u) << when << ": 8-bit tensors' parameters differ from the host's";
  };
#if QLFT_CUDA_EMULATE
  const qlft_emu::ManagedPrefetchStats before = qlft_emu::managed_prefetch_stats();
#endif
  for (int step = 1; step <= 3; ++step) step_both(*dev, step);
#if QLFT_CUDA_EMULATE
  // paged_adamw8bit prefetches all of its state to the device once per step (each tensor's as
  // its update begins, bitsandbytes' prefetch_state), and none of it moves: it stays resident
  // from its allocation on. adamw8bit's device memory is never prefetched.
  const qlft_emu::ManagedPrefetchStats after = qlft_emu::managed_prefetch_stats();
  const bool paged = s.kind == qlft::OptimizerKind::PagedAdamW8bit;
  EXPECT_EQ(after.requested_bytes - before.requested_bytes, paged ? 3 * dev->state_bytes() : 0);
  EXPECT_EQ(after.to_device_bytes, before.to_device_bytes);
  EXPECT_EQ(after.to_host_bytes, before.to_host_bytes);
#endif
  expect_same(*dev, "after 3 steps");
  EXPECT_EQ(dev->steps(), 3);
  EXPECT_GT(dev->state_bytes(), 0u);

  // A device optimizer resumed from the host's checkpoint entries (its own state zero until then)
  // steps as the host does.
  qlft::StateDict hd;
  host->save_state(hd, "o.");
  auto resumed = qlft::make_device_adamw8bit(s, params(p.data(), grad.data()), *be, w.as<float>(),
                                             g.as<float>(), int64_t(n));
  resumed->load_state(hd, "o.");
  EXPECT_EQ(resumed->steps(), 3);
  step_both(*resumed, 4);
  expect_same(*resumed, "after a step resumed from the host's state");

  // A state entry of the wrong shape is refused, naming it, and changes nothing.
  qlft::StateDict bad;
  bad.put_string("o.type", "adamw8bit");
  bad.put_i64("o.step", 1);
  try {
    resumed->load_state(bad, "o.");
    ADD_FAILURE() << "a checkpoint without state entries was accepted";
  } catch (const qlft::Error& e) {
    EXPECT_NE(std::string(e.what()).find("o.t0.state1"), std::string::npos) << e.what();
  }
  EXPECT_EQ(resumed->steps(), 4);
}

INSTANTIATE_TEST_SUITE_P(Kind, CudaDeviceAdamW8bit,
                         ::testing::Values("adamw8bit", "paged_adamw8bit"));
