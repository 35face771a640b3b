// Shared pieces of the backend tests: random data, double-precision oracles and a
// finite-difference gradient checker. The oracles are naive loops written independently of
// the kernels; only the LoRA dropout mask function (its definition) is shared.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/dropout.h"

namespace qlft_test {

using Vec = std::vector<double>;
using FVec = std::vector<float>;

struct Rng {
  std::mt19937_64 g;
  explicit Rng(uint64_t seed) : g(seed) {}
  FVec normal(size_t n, float sd = 1.f) {
    std::normal_distribution<float> d(0.f, sd);
    FVec v(n);
    for (auto& x : v) x = d(g);
    return v;
  }
  int uniform_int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(g); }
};

inline Vec to_d(const FVec& v) {
  return Vec(v.begin(), v.end());
}
inline FVec to_f(const Vec& v) {
  return FVec(v.begin(), v.end());
}

// max |a - b| / max(max |b|, floor)
inline double rel_err(const FVec& a, const Vec& b, double floor = 1e-6) {
  double m = 0, e = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    m = std::max(m, std::fabs(b[i]));
    e = std::max(e, std::fabs(double(a[i]) - b[i]));
  }
  return e / std::max(m, floor);
}

inline double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Checks an analytic gradient g of the scalar f at x0 against central differences of f
// (computed in double): a few random directional derivatives and a sample of single elements.
// tol is relative to the gradient's scale; a wrong sign or a missing term fails it by far.
inline void check_grad(const char* what, const std::function<double(const Vec&)>& f, const Vec& x0,
                       const FVec& g, uint64_t seed, double tol = 2e-4, int n_dirs = 3,
                       int n_elems = 12) {
  ASSERT_EQ(x0.size(), g.size()) << what;
  const double eps = 1e-5;
  Rng rng(seed);
  double gnorm = 0, gmax = 0;
  for (float v : g) {
    gnorm += double(v) * v;
    gmax = std::max(gmax, std::fabs(double(v)));
  }
  gnorm = std::sqrt(gnorm);
  auto fd_along = [&](const Vec& u) {
    Vec xp = x0, xm = x0;
    for (size_t i = 0; i < u.size(); ++i) {
      xp[i] += eps * u[i];
      xm[i] -= eps * u[i];
    }
    return (f(xp) - f(xm)) / (2 * eps);
  };
  for (int d = 0; d < n_dirs; ++d) {
    Vec u = to_d(rng.normal(x0.size()));
    double fd = fd_along(u);
    double an = 0;
    for (size_t i = 0; i < u.size(); ++i) an += double(g[i]) * u[i];
    double scale = std::max({std::fabs(fd), gnorm, 1e-8});
    EXPECT_LE(std::fabs(an - fd) / scale, tol)
        << what << ": directional derivative " << d << ": analytic " << an << " vs fd " << fd;
  }
  for (int e = 0; e < n_elems && e < int(x0.size()); ++e) {
    size_t i = size_t(rng.uniform_int(0, int(x0.size()) - 1));
    Vec u(x0.size(), 0.0);
    u[i] = 1.0;
    double fd = fd_along(u);
    double scale = std::max({gmax, std::fabs(fd), 1e-8});
    EXPECT_LE(std::fabs(double(g[i]) - fd) / scale, tol)
        << what << ": element " << i << ": analytic " << g[i] << " vs fd " << fd;
  }
}

// ---- oracles (double precision, naive loops) ------------------------------------------------

// y = x W^T + b + scale * drop(x) A^T B^T ; x [M, K], W [N, K], A [r, K], B [N, r].
inline Vec linear_oracle(const Vec& x, const FVec& W, const FVec* bias, const Vec& A, const Vec& B,
                         int r, double scale, float p, uint64_t seed, int M, int N, int K) {
  Vec y(size_t(M) * N, 0.0);
  for (int i = 0; i < M; ++i) {
    Vec xa(r, 0.0);
    for (int a = 0; a < r; ++a)
      for (int c = 0; c < K; ++c) {
        double xd = qlft::lora_dropout_keep(seed, i, c, p) ? x[i * K + c] / (1.0 - double(p)) : 0;
        xa[a] += xd * A[a * K + c];
      }
    for (int j = 0; j < N; ++j) {
      double s = bias ? (*bias)[j] : 0.0;
      for (int c = 0; c < K; ++c) s += x[i * K + c] * W[size_t(j) * K + c];
      for (int a = 0; a < r; ++a) s += scale * xa[a] * B[j * r + a];
      y[size_t(i) * N + j] = s;
    }
  }
  return y;
}

inline Vec rmsnorm_oracle(const Vec& x, const FVec& w, double eps, int M, int C) {
  Vec y(x.size());
  for (int i = 0; i < M; ++i) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += x[i * C + c] * x[i * C + c];
    double r = 1.0 / std::sqrt(ss / C + eps);
    for (int c = 0; c < C; ++c) y[i * C + c] = w[c] * x[i * C + c] * r;
  }
  return y;
}

// Angles as Hugging Face computes them (float32 inv_freq and product); cos/sin in double.
inline Vec rope_oracle(const Vec& x, const std::vector<int32_t>& pos, int M, int heads, int hd,
                       int cols, float theta, bool adjacent) {
  Vec y = x;
  const int half = hd / 2;
  for (int i = 0; i < M; ++i)
    for (int f = 0; f < half; ++f) {
      float inv = 1.0f / std::pow(theta, float(2 * f) / float(hd));
      float ang = float(pos[i]) * inv;
      double c = std::cos(double(ang)), s = std::sin(double(ang));
      for (int h = 0; h < heads; ++h) {
        int a = h * hd + (adjacent ? 2 * f : f), b = h * hd + (adjacent ? 2 * f + 1 : f + half);
        double xa = x[i * cols + a], xb = x[i * cols + b];
        y[i * cols + a] = xa * c - xb * s;
        y[i * cols + b] = xb * c + xa * s;
      }
    }
  return y;
}

inline double silu_d(double g) {
  return g / (1.0 + std::exp(-g));
}

// An attention shape (no document ids).
inline qlft::AttnShape attn_shape(int batch, int seq, int heads, int kv, int head_dim) {
  qlft::AttnShape s;
  s.batch = batch;
  s.seq = seq;
  s.n_heads = heads;
  s.n_kv_heads = kv;
  s.head_dim = head_dim;
  return s;
}

// out, lse of causal GQA attention with optional document mask, sliding window, the scores'
// scale (AttnShape::scale, 0: head_dim^-0.5) and soft-cap (cap tanh(s / cap); 0: none).
inline void attention_oracle(const qlft::AttnShape& s, const Vec& q, const Vec& k, const Vec& v,
                             const std::vector<int32_t>* doc, Vec& out, Vec* lse) {
  const int T = s.seq, H = s.n_heads, KV = s.n_kv_heads, D = s.head_dim;
  const int rows = s.batch * T, qc = H * D, kc = KV * D;
  out.assign(size_t(rows) * qc, 0.0);
  if (lse) lse->assign(size_t(H) * rows, 0.0);
  const double scale = s.scale > 0 ? double(s.scale) : 1.0 / std::sqrt(double(D));
  const double cap = s.softcap;
  Vec sc(T);
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < H; ++h) {
      int kh = h / (H / KV);
      for (int i = 0; i < T; ++i) {
        int ri = b * T + i;
        double m = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          int rj = b * T + j;
          if ((doc && (*doc)[ri] != (*doc)[rj]) || (s.window > 0 && j <= i - s.window)) {
            sc[j] = -INFINITY;
            continue;
          }
          double d = 0;
          for (int e = 0; e < D; ++e) d += q[ri * qc + h * D + e] * k[rj * kc + kh * D + e];
          sc[j] = d * scale;
          if (cap > 0) sc[j] = cap * std::tanh(sc[j] / cap);
          m = std::max(m, sc[j]);
        }
        double z = 0;
        for (int j = 0; j <= i; ++j) z += std::exp(sc[j] - m);
        if (lse) (*lse)[size_t(h) * rows + ri] = m + std::log(z);
        for (int j = 0; j <= i; ++j) {
          double p = std::exp(sc[j] - m) / z;
          int rj = b * T + j;
          for (int e = 0; e < D; ++e) out[ri * qc + h * D + e] += p * v[rj * kc + kh * D + e];
        }
      }
    }
}

// Sum over counted rows of -log softmax(h head^T)[t]; cap > 0: of the logits cap tanh(l / cap).
inline double ce_oracle(const Vec& h, const FVec& head, const std::vector<int32_t>& t,
                        int32_t ignore, int M, int V, int H, int64_t* count = nullptr,
                        double cap = 0) {
  double loss = 0;
  int64_t n = 0;
  Vec l(V);
  for (int i = 0; i < M; ++i) {
    if (t[i] == ignore) continue;
    ++n;
    double m = -INFINITY;
    for (int j = 0; j < V; ++j) {
      double s = 0;
      for (int c = 0; c < H; ++c) s += h[i * H + c] * head[size_t(j) * H + c];
      l[j] = cap > 0 ? cap * std::tanh(s / cap) : s;
      m = std::max(m, l[j]);
    }
    double z = 0;
    for (int j = 0; j < V; ++j) z += std::exp(l[j] - m);
    loss += m + std::log(z) - l[t[i]];
  }
  if (count) *count = n;
  return loss;
}

}  // namespace qlft_test
