// Optimizer and loss-scaler kernels against the CPU: torch AdamW against the shared per-element
// helper run on the host, bitsandbytes 8-bit AdamW against the CPU AdamW8bit optimizer (params,
// 8-bit codes and absmax after three steps, a non-finite gradient included), gradient sum of
// squares, scaling and the non-finite count against host loops.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cuda_entry.h"
#include "cuda_test_util.h"
#include "optim/adamw8bit.h"
#include "optim/optimizer.h"

using qlft_cuda_test::norm_err;

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

// The coefficients the CPU AdamW8bit computes for step t (adamw8bit.cpp).
qlft::AdamBnbCoeffs bnb_coeffs(const qlft::OptimSettings& s, double lr, int64_t t) {
  qlft::AdamBnbCoeffs c;
  c.beta1 = float(s.beta1);
  c.one_m_beta1 = float(1.0 - s.beta1);
  c.beta2 = float(s.beta2);
  c.one_m_beta2 = float(1.0 - s.beta2);
  c.apply_decay = s.weight_decay > 0.0;
  c.decay = float(1.0 - lr * s.weight_decay);
  const double c1 = 1.0 - std::pow(s.beta1, double(t));
  const double c2 = std::sqrt(1.0 - std::pow(s.beta2, double(t)));
  c.corr2 = float(c2);
  c.eps = float(s.eps);
  c.neg_lr_over_c1 = float(-lr / c1);
  c.step_size_32 = float(-lr * c2 / c1);
  c.eps_corr2 = float(s.eps * c2);
  return c;
}

}  // namespace

TEST(CudaOptim, AdamWTorchMatchesHostHelper) {
  QLFT_NEED_GPU();
  qlft::MemoryTracker t;
  const size_t n = 10007;
  FVec p = normal(n, 1), m(n, 0.f), v(n, 0.f);
  auto P = to_dev(&t, p), Mm = to_dev(&t, m), Vv = to_dev(&t, v);
  for (int step = 1; step <= 3; ++step) {
    FVec g = normal(n, 10 + step);
    auto G = to_dev(&t, g);
    qlft::AdamWTorchCoeffs c{float(1.0 - 1e-3 * 0.01),
                             0.1f,
                             0.999f,
                             float(1.0 - 0.999),
                             float(std::sqrt(1.0 - std::pow(0.999, step))),
                             1e-8f,
                             float(-1e-3 / (1.0 - std::pow(0.9, step)))};
    for (size_t i = 0; i < n; ++i) qlft::adamw_torch_update(p[i], m[i], v[i], g[i], c);
    qlft::cuda_adamw_torch_step(P.as<float>(), Mm.as<float>(), Vv.as<float>(), G.as<float>(),
                                int64_t(n), c);
  }
  EXPECT_LT(norm_err(from_dev<float>(P, n), p), 1e-6);
  EXPECT_LT(norm_err(from_dev<float>(Mm, n), m), 1e-6);
  EXPECT_LT(norm_err(from_dev<float>(Vv, n), v), 1e-6);
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
