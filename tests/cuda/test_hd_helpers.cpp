// The QLFT_HD helpers the CUDA kernels are built from, exercised on the CPU against independent
// oracles (double-precision formulas, finite differences, direct definitions). Runs in every
// configuration (label unit): it is how the kernels' arithmetic is tested where no GPU exists.
// The CPU backend, quantizers and optimizers use the same helpers and are tested against the
// reference peers in tests/unit (see docs/ARCHITECTURE.md, "CUDA backend").
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/activation_math.h"
#include "backend/dropout.h"
#include "backend/norm_math.h"
#include "backend/rope_math.h"
#include "backend/softmax_math.h"
#include "core/half.h"
#include "backend/adamw_math.h"
#include "quant/ggml_math.h"
#include "quant/nf4_math.h"

namespace qlft {
namespace {

std::vector<float> normal(size_t n, uint64_t seed, float sd = 1.f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

TEST(HdHelpers, OnlineSoftmaxMergeEqualsDirectLogSumExp) {
  // Attention (k_attn_fwd) and cross-entropy (k_ce_merge) fold pieces of a row in any order.
  std::mt19937_64 g(1);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> x = normal(1 + g() % 300, 100 + trial, 4.f);
    double ref = 0, mx = -INFINITY;
    for (float v : x) mx = std::max(mx, double(v));
    for (float v : x) ref += std::exp(double(v) - mx);
    ref = mx + std::log(ref);
    OnlineSoftmax<float> sf;
    OnlineSoftmax<double> sd;
    for (size_t s = 0; s < x.size();) {
      const size_t n = std::min(x.size() - s, size_t(1 + g() % 40));
      float pm = -INFINITY;
      for (size_t i = s; i < s + n; ++i) pm = std::max(pm, x[i]);
      float ps = 0;
      double pd = 0;
      for (size_t i = s; i < s + n; ++i) {
        ps += std::exp(x[i] - pm);
        pd += std::exp(double(x[i]) - pm);
      }
      online_softmax_merge(sf, pm, ps);
      online_softmax_merge(sd, pm, pd);
      online_softmax_merge(sf, -INFINITY, 0.f);  // a fully masked piece changes nothing
      s += n;
    }
    EXPECT_NEAR(online_softmax_lse(sf), ref, 1e-5 * std::max(1.0, std::fabs(ref)));
    EXPECT_NEAR(online_softmax_lse(sd), ref, 1e-6 * std::max(1.0, std::fabs(ref)));
    double psum = 0;
    for (float v : x) psum += softmax_prob(v, online_softmax_lse(sd));
    EXPECT_NEAR(psum, 1.0, 1e-5);
  }
  EXPECT_EQ(online_softmax_lse(OnlineSoftmax<float>{}), -INFINITY);
}

TEST(HdHelpers, SwigluFromSigmoidMatchesFormulaAndFiniteDifferences) {
  for (float gte : {-6.f, -1.3f, -0.2f, 0.f, 0.7f, 2.5f, 9.f})
    for (float up : {-2.f, 0.5f, 3.f}) {
      const double s = 1.0 / (1.0 + std::exp(-double(gte)));
      EXPECT_NEAR(swiglu_from_sigmoid(gte, up, sigmoidf_(gte)), gte * s * up,
                  1e-6 * std::max(1.0, std::fabs(gte * s * up)));
      float dg, du;
      swiglu_bwd_from_sigmoid(gte, up, 1.f, sigmoidf_(gte), dg, du);
      auto f = [&](double gg, double uu) { return gg / (1.0 + std::exp(-gg)) * uu; };
      const double h = 1e-4;
      EXPECT_NEAR(dg, (f(gte + h, up) - f(gte - h, up)) / (2 * h), 1e-4);
      EXPECT_NEAR(du, (f(gte, up + h) - f(gte, up - h)) / (2 * h), 1e-4);
    }
}

TEST(HdHelpers, RmsNormForwardAndBackwardAgainstDouble) {
  const int n = 96;
  std::vector<float> x = normal(n, 2), w = normal(n, 3), dy = normal(n, 4);
  auto fwd = [&](const std::vector<double>& xd, int j) {
    double ss = 0;
    for (double v : xd) ss += v * v;
    return w[j] * xd[j] / std::sqrt(ss / n + 1e-5);
  };
  double ss = 0, dot = 0;
  for (int i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const float r = rmsnorm_rstd(ss, n, 1e-5f);
  EXPECT_NEAR(r, 1.0 / std::sqrt(ss / n + 1e-5), 1e-6 * r);
  for (int i = 0; i < n; ++i) dot += double(dy[i]) * w[i] * x[i];
  const float coef = rmsnorm_bwd_coef(dot, n, r);
  std::vector<double> xd(x.begin(), x.end());
  for (int j = 0; j < n; j += 7) {  // d(sum_i dy_i y_i)/dx_j by central differences
    const double h = 1e-5;
    xd[j] += h;
    double lp = 0;
    for (int i = 0; i < n; ++i) lp += dy[i] * fwd(xd, i);
    xd[j] -= 2 * h;
    double lm = 0;
    for (int i = 0; i < n; ++i) lm += dy[i] * fwd(xd, i);
    xd[j] += h;
    EXPECT_NEAR(rmsnorm_bwd_elem(x[j], w[j], dy[j], r, coef), (lp - lm) / (2 * h), 1e-4);
    EXPECT_NEAR(rmsnorm_apply(x[j], w[j], r), fwd(xd, j), 1e-5);
  }
}

TEST(HdHelpers, RopeFrequenciesAndInverseRotation) {
  for (int i = 0; i < 32; ++i)
    EXPECT_NEAR(rope_inv_freq(10000.f, i, 64), std::pow(10000.0, -2.0 * i / 64), 1e-6);
  float a = 0.3f, b = -1.7f;
  const float ang = rope_angle(77, rope_inv_freq(10000.f, 3, 64));
  rope_rotate_pair(a, b, std::cos(ang), std::sin(ang));
  EXPECT_NEAR(a, 0.3 * std::cos(ang) + 1.7 * std::sin(ang), 1e-6);
  rope_rotate_pair(a, b, std::cos(ang), -std::sin(ang));  // the backward rotation undoes it
  EXPECT_NEAR(a, 0.3f, 1e-6);
  EXPECT_NEAR(b, -1.7f, 1e-6);
}

TEST(HdHelpers, QuantDecodeHelpers) {
  // NF4: element 2i in the high nibble of byte i.
  const uint8_t packed[2] = {0x3C, 0xF0};
  EXPECT_EQ(nf4_nibble(packed, 0), 0x3u);
  EXPECT_EQ(nf4_nibble(packed, 1), 0xCu);
  EXPECT_EQ(nf4_nibble(packed, 2), 0xFu);
  EXPECT_EQ(nf4_decode(15, 2.5f), 2.5f);
  EXPECT_EQ(nf4_decode(0, 2.5f), -2.5f);
  EXPECT_EQ(nf4_decode(7, 2.5f), 0.f);
  // 8-bit blockwise: the LUT index covers [-1, 1] in 65536 steps.
  EXPECT_EQ(blockwise8_lut_index(-1.f), 0u);
  EXPECT_EQ(blockwise8_lut_index(1.f), 65535u);
  EXPECT_EQ(blockwise8_lut_index(7.f), 65535u);  // clamped
  EXPECT_EQ(blockwise8_lut_index(0.f), 32768u);
  const float code[3] = {-1.f, 0.f, 0.5f};
  EXPECT_EQ(blockwise8_decode(code, 2, 4.f), 2.f);
  EXPECT_NEAR(int8_decode(127, 3.f), 3.0, 1e-6);
  EXPECT_NEAR(int8_decode(-64, 3.f), -64 * 3.0 / 127, 1e-6);
  // Q4_0: x = (q - 8) * d, low nibbles first.
  uint8_t blk[18] = {};
  const uint16_t d = f32_to_f16(0.5f);
  std::memcpy(blk, &d, 2);
  blk[2] = 0x1F;  // element 0: 15 -> 3.5; element 16: 1 -> -3.5
  float y[32];
  ggml_dequant_q4_0(blk, y);
  EXPECT_EQ(y[0], 3.5f);
  EXPECT_EQ(y[16], -3.5f);
  EXPECT_EQ(y[1], -4.f);
  // bf16 rounding is to nearest even (the 16-bit GEMM tiles).
  EXPECT_EQ(f32_to_bf16(bits_f32(0x3F808000u)), 0x3F80u);  // tie, even stays
  EXPECT_EQ(f32_to_bf16(bits_f32(0x3F818000u)), 0x3F82u);  // tie, odd rounds up
}

TEST(HdHelpers, AdamWUpdatesAgainstDoubleFormula) {
  float p = 0.5f, m = 0.01f, v = 0.002f;
  const float g = 0.3f;
  AdamWTorchCoeffs c{float(1.0 - 1e-3 * 0.01),
                     0.1f,
                     0.999f,
                     float(1.0 - 0.999),
                     float(std::sqrt(1.0 - 0.999 * 0.999)),
                     1e-8f,
                     float(-1e-3 / (1.0 - 0.81))};
  double pd = 0.5 * (1.0 - 1e-3 * 0.01), md = 0.9 * 0.01 + 0.1 * 0.3,
         vd = 0.999 * 0.002 + 0.001 * 0.09;
  pd += -1e-3 / (1.0 - 0.81) * md / (std::sqrt(vd) / std::sqrt(1.0 - 0.999 * 0.999) + 1e-8);
  adamw_torch_update(p, m, v, g, c);
  EXPECT_NEAR(m, md, 1e-7);
  EXPECT_NEAR(v, vd, 1e-8);
  EXPECT_NEAR(p, pd, 1e-6);
  // bnb paths: a non-finite gradient leaves p and restarts the element's state.
  AdamBnbCoeffs b{};
  b.beta1 = 0.9f;
  b.one_m_beta1 = 0.1f;
  b.beta2 = 0.999f;
  b.one_m_beta2 = 0.001f;
  b.corr2 = 1.f;
  b.eps = 1e-8f;
  b.neg_lr_over_c1 = -1e-3f;
  b.step_size_32 = -1e-3f;
  b.eps_corr2 = 1e-8f;
  float q = 1.f, mm = 0.2f, vv = 0.3f;
  EXPECT_FALSE(adam_bnb_8bit_update(q, mm, vv, NAN, b));
  EXPECT_EQ(q, 1.f);
  EXPECT_EQ(mm, 0.f);
  EXPECT_EQ(vv, 0.f);
  EXPECT_TRUE(adam_bnb_8bit_update(q, mm, vv, 0.5f, b));
  EXPECT_NEAR(mm, 0.05, 1e-7);
  EXPECT_NEAR(q, 1.0 - 1e-3 * 0.05 / (std::sqrt(0.00025) + 1e-8), 1e-6);
  mm = vv = 0.f;
  q = 1.f;
  EXPECT_TRUE(adam_bnb_32bit_update(q, mm, vv, 0.5f, b));
  EXPECT_NEAR(q, 1.0 - 1e-3 * 0.05 / (std::sqrt(0.00025) + 1e-8), 1e-6);
  EXPECT_FALSE(optim_isfinite(INFINITY));
  EXPECT_FALSE(optim_isfinite(-INFINITY));
  EXPECT_FALSE(optim_isfinite(NAN));
  EXPECT_TRUE(optim_isfinite(std::numeric_limits<float>::max()));
}

TEST(HdHelpers, DropoutMaskIsDeterministicWithKeepRateOneMinusP) {
  int kept = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const bool k = lora_dropout_keep(99, i / 500, i % 500, 0.3f);
    EXPECT_EQ(k, lora_dropout_keep(99, i / 500, i % 500, 0.3f));
    kept += k;
  }
  EXPECT_NEAR(double(kept) / n, 0.7, 0.005);
  EXPECT_TRUE(lora_dropout_keep(1, 2, 3, 0.f));
}

}  // namespace
}  // namespace qlft
