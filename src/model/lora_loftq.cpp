#include "model/lora_loftq.h"

#include <algorithm>
#include <functional>
#include <cmath>
#include <numeric>

#include "backend/dropout.h"
#include "core/error.h"
#include "core/threads.h"

namespace qlft {

namespace {

// Eigenpairs of the symmetric [k, k] matrix g (row-major, destroyed) by cyclic Jacobi rotations:
// values into w, vectors as the columns of v. Exact to double rounding for the sizes used here.
void jacobi_eigen(std::vector<double>& g, int64_t k, std::vector<double>& w,
                  std::vector<double>& v) {
  v.assign(static_cast<size_t>(k * k), 0.0);
  for (int64_t i = 0; i < k; ++i) v[i * k + i] = 1.0;
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0, diag = 0;
    for (int64_t i = 0; i < k; ++i) {
      diag += g[i * k + i] * g[i * k + i];
      for (int64_t j = i + 1; j < k; ++j) off += g[i * k + j] * g[i * k + j];
    }
    if (off <= 1e-30 * diag || off == 0) break;
    for (int64_t p = 0; p < k; ++p)
      for (int64_t q = p + 1; q < k; ++q) {
        const double apq = g[p * k + q];
        if (apq == 0) continue;
        const double theta = (g[q * k + q] - g[p * k + p]) / (2 * apq);
        const double t = (theta >= 0 ? 1 : -1) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (int64_t i = 0; i < k; ++i) {  // columns p and q
          const double gp = g[i * k + p], gq = g[i * k + q];
          g[i * k + p] = c * gp - s * gq;
          g[i * k + q] = s * gp + c * gq;
        }
        for (int64_t i = 0; i < k; ++i) {  // rows p and q
          const double gp = g[p * k + i], gq = g[q * k + i];
          g[p * k + i] = c * gp - s * gq;
          g[q * k + i] = s * gp + c * gq;
        }
        for (int64_t i = 0; i < k; ++i) {
          const double vp = v[i * k + p], vq = v[i * k + q];
          v[i * k + p] = c * vp - s * vq;
          v[i * k + q] = s * vp + c * vq;
        }
      }
  }
  w.resize(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) w[i] = g[i * k + i];
}

// Orthonormalizes the p columns of the row-major [rows, p] matrix y (modified Gram-Schmidt,
// twice for double-precision orthogonality); a column that vanishes is left zero.
void orthonormalize(std::vector<double>& y, int64_t rows, int64_t p) {
  std::vector<double> before(static_cast<size_t>(p), 0.0);  // each column's norm as given
  for (int64_t j = 0; j < p; ++j)
    for (int64_t r = 0; r < rows; ++r)
      before[static_cast<size_t>(j)] += y[r * p + j] * y[r * p + j];
  for (double& b : before) b = std::sqrt(b);
  for (int pass = 0; pass < 2; ++pass)
    for (int64_t j = 0; j < p; ++j) {
      for (int64_t i = 0; i < j; ++i) {
        double d = 0;
        for (int64_t r = 0; r < rows; ++r) d += y[r * p + i] * y[r * p + j];
        for (int64_t r = 0; r < rows; ++r) y[r * p + j] -= d * y[r * p + i];
      }
      double nrm = 0;
      for (int64_t r = 0; r < rows; ++r) nrm += y[r * p + j] * y[r * p + j];
      nrm = std::sqrt(nrm);
      // A column that was (numerically) in the span of the previous ones: zero, not noise.
      const bool keep = nrm > 1e-10 * before[static_cast<size_t>(j)] && nrm > 0;
      for (int64_t r = 0; r < rows; ++r) y[r * p + j] = keep ? y[r * p + j] / nrm : 0.0;
    }
}

}  // namespace

void truncated_svd(const float* x, int64_t m, int64_t n, int r, std::vector<double>* u,
                   std::vector<double>* s, std::vector<double>* vt) {
  const int64_t k = std::min(m, n);
  QLFT_CHECK_ARG(r >= 1 && r <= k, "truncated_svd: rank %d of a %lld x %lld matrix", r,
                 static_cast<long long>(m), static_cast<long long>(n));
  // The Gram matrix of the short side, g [k, k] = x x^T (m <= n) or x^T x: its eigenvectors are
  // the left (resp. right) singular vectors, its eigenvalues the squared singular values. One
  // pass over x; everything after works on k x k.
  const bool rows = m <= n;
  const int64_t len = rows ? n : m;                      // the long side, summed over
  std::vector<double> xd(static_cast<size_t>(k * len));  // the short side's vectors, contiguous
  for (int64_t i = 0; i < m; ++i)
    for (int64_t c = 0; c < n; ++c) xd[rows ? i * n + c : c * m + i] = x[i * n + c];
  std::vector<double> g(static_cast<size_t>(k * k));
#pragma omp parallel for num_threads(qlft::num_threads()) \
    schedule(dynamic, 8) if (k * k * len >= (1 << 22))
  for (int64_t a = 0; a < k; ++a)
    for (int64_t b = a; b < k; ++b) {
      const double* pa = &xd[static_cast<size_t>(a * len)];
      const double* pb = &xd[static_cast<size_t>(b * len)];
      double d = 0;
      for (int64_t t = 0; t < len; ++t) d += pa[t] * pb[t];
      g[a * k + b] = g[b * k + a] = d;
    }
  // e [k, p]: eigenvectors (columns) of g, w their eigenvalues. Small k: all of them (Jacobi,
  // exact). Large k: the leading p by subspace iteration q <- orth(g q) with a Rayleigh-Ritz step
  // every few iterations, until the leading r eigenvalues stop changing (the error of the
  // subspace falls as (w_p+1 / w_r)^iterations, w being squared singular values).
  int64_t p = k;
  std::vector<double> e, w;
  if (k <= 256) {
    std::vector<double> gg = g;
    jacobi_eigen(gg, k, w, e);
  } else {
    p = std::min<int64_t>(k, 2 * r + 16);
    std::vector<double> q(static_cast<size_t>(k * p)), z(q.size()), h, hv, prev;
    for (int64_t i = 0; i < k * p; ++i)
      q[i] = static_cast<double>(mix64(0x10f7ull + static_cast<uint64_t>(i)) >> 11) *
                 (2.0 / 9007199254740992.0) -
             1.0;
    orthonormalize(q, k, p);
    for (int it = 1; it <= 400; ++it) {
      std::fill(z.begin(), z.end(), 0.0);
#pragma omp parallel for num_threads(qlft::num_threads()) \
    schedule(static) if (k * k * p >= (1 << 22))
      for (int64_t i = 0; i < k; ++i)
        for (int64_t c = 0; c < k; ++c) {
          const double gv = g[i * k + c];
          for (int64_t j = 0; j < p; ++j) z[i * p + j] += gv * q[c * p + j];
        }
      if (it % 4 != 0) {
        orthonormalize(z, k, p);
        q.swap(z);
        continue;
      }
      // Rayleigh-Ritz on span(q): h = q^T g q = q^T z; h = hv diag(w) hv^T; q <- q hv.
      h.assign(static_cast<size_t>(p * p), 0.0);
      for (int64_t a = 0; a < p; ++a)
        for (int64_t b = 0; b < p; ++b) {
          double d = 0;
          for (int64_t i = 0; i < k; ++i) d += q[i * p + a] * z[i * p + b];
          h[a * p + b] = d;
        }
      for (int64_t a = 0; a < p; ++a)  // (symmetric up to rounding)
        for (int64_t b = a + 1; b < p; ++b)
          h[a * p + b] = h[b * p + a] = 0.5 * (h[a * p + b] + h[b * p + a]);
      jacobi_eigen(h, p, w, hv);
      std::fill(z.begin(), z.end(), 0.0);
      for (int64_t i = 0; i < k; ++i)
        for (int64_t a = 0; a < p; ++a) {
          const double qv = q[i * p + a];
          for (int64_t b = 0; b < p; ++b) z[i * p + b] += qv * hv[a * p + b];
        }
      q.swap(z);
      // Stop when the energy the leading r capture (the sum of their eigenvalues, what the
      // rank-r approximation removes) grows by under 1e-9 of itself in 4 iterations: separated
      // singular values have then converged far below float precision; within a flat stretch
      // of the spectrum (white-noise error) any basis of it removes about the same energy, and
      // iterating on would not single out PEFT's (arbitrary) one anyway.
      std::vector<double> top = w;
      std::sort(top.begin(), top.end(), std::greater<double>());
      double energy = 0;
      for (int j = 0; j < r; ++j) energy += top[static_cast<size_t>(j)];
      const bool done = !prev.empty() && energy - prev[0] <= 1e-9 * energy;
      if (done) break;
      prev.assign(1, energy);
      // q's columns are g's Ritz vectors; the next product continues from them.
      orthonormalize(q, k, p);
    }
    e = q;
  }
  std::vector<int64_t> order(static_cast<size_t>(p));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return w[a] > w[b]; });
  u->assign(static_cast<size_t>(m * r), 0.0);
  s->assign(static_cast<size_t>(r), 0.0);
  vt->assign(static_cast<size_t>(r * n), 0.0);
  for (int j = 0; j < r; ++j) {
    const int64_t c = order[static_cast<size_t>(j)];
    const double sv = std::sqrt(std::max(w[c], 0.0));
    (*s)[j] = sv;
    // The short side's vector is e's column; the long side's is x (or x^T) times it over sv.
    std::vector<double> other(static_cast<size_t>(len), 0.0);
    if (sv > 0)
      for (int64_t a = 0; a < k; ++a) {
        const double ev = e[a * p + c];
        const double* pa = &xd[static_cast<size_t>(a * len)];
        for (int64_t t = 0; t < len; ++t) other[t] += ev * pa[t];
      }
    for (int64_t a = 0; a < k; ++a) {
      const double ev = e[a * p + c];
      if (rows)
        (*u)[a * r + j] = ev;
      else
        (*vt)[j * n + a] = ev;
    }
    if (sv == 0) continue;  // its other vector stays 0 (s times it is 0 anyway)
    for (int64_t t = 0; t < len; ++t) {
      if (rows)
        (*vt)[j * n + t] = other[t] / sv;
      else
        (*u)[t * r + j] = other[t] / sv;
    }
  }
}

void loftq_factors(const float* w, const float* wq, int64_t out, int64_t in, int r, float scale,
                   float* A, float* B) {
  std::vector<float> res(static_cast<size_t>(out * in));
  for (int64_t i = 0; i < out * in; ++i) res[i] = w[i] - wq[i];
  std::vector<double> u, s, vt;
  const int k = static_cast<int>(std::min<int64_t>(r, std::min(out, in)));
  truncated_svd(res.data(), out, in, k, &u, &s, &vt);
  // PEFT: lora_B = U sqrt(S), lora_A = sqrt(S) Vh; here each also over sqrt(scale). A rank above
  // min(out, in) leaves the extra rows of A and columns of B zero.
  const double inv = 1.0 / std::sqrt(static_cast<double>(scale));
  for (int64_t i = 0; i < out; ++i)
    for (int j = 0; j < r; ++j)
      B[i * r + j] = j < k ? static_cast<float>(u[i * k + j] * std::sqrt(s[j]) * inv) : 0.f;
  for (int j = 0; j < r; ++j)
    for (int64_t c = 0; c < in; ++c)
      A[j * in + c] = j < k ? static_cast<float>(std::sqrt(s[j]) * vt[j * in + c] * inv) : 0.f;
}

void loftq_init(LoraAdapter& a, const Model& m, MemoryTracker* tracker) {
  m.require_resident("lora.init=loftq");
  if (m.load_options.quant_type == QuantType::Keep)
    throw_error(QLFT_ERR_INVALID_ARGUMENT,
                "lora.init=loftq cancels the quantization error of the base weights, but %s was "
                "loaded with quant.type=keep (not quantized): use quant.type=nf4 or int8",
                m.path.c_str());
  const float scale = a.config().scale();
  std::vector<float> wq;
  for_each_source_projection(tracker, m, [&](int l, Proj p, const float* w) {
    if (!a.active(l, p)) return;
    QLFT_CHECK_ARG(a.module(p).parts.size() == 1,
                   "lora.init=loftq on %s's fused %s is not supported (its parts share one A)",
                   m.cfg.arch.c_str(), a.module(p).peft);
    const QWeight& q = m.layers[static_cast<size_t>(l)].proj[static_cast<int>(p)];
    wq.resize(static_cast<size_t>(q.numel()));
    q.dequantize_rows(0, q.rows, wq.data());
    LoraSlot& s = a.slot(l, p);
    if (s.A.empty() || s.B.empty())
      throw_error(QLFT_ERR_UNSUPPORTED,
                  "lora.init=loftq: the LoRA tensors of layer %d %s are on another rank "
                  "(dist.zero3_shard_adapter)",
                  l, proj_peft_name(p));
    loftq_factors(w, wq.data(), q.rows, q.cols, s.r, scale, s.A.as<float>(), s.B.as<float>());
  });
}

}  // namespace qlft
