#include "model/lora_loftq.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/dropout.h"
#include "core/error.h"

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
  // y: an orthonormal basis [m, p] whose span holds the leading r left singular vectors. A small
  // matrix takes its whole column space (y = I when m <= n, else y = orth(x)), so the result is
  // exact; a large one iterates z <- x^T orth(x z) from deterministic draws until the leading r
  // directions stop moving.
  const bool exact = k <= 256;
  const int64_t p = exact ? k : std::min<int64_t>(k, 2 * r + 16);
  std::vector<double> y(static_cast<size_t>(m * p), 0.0);
  if (exact && m <= n) {
    for (int64_t i = 0; i < m; ++i) y[i * p + i] = 1.0;
  } else {
    std::vector<double> z(static_cast<size_t>(n * p), 0.0);
    for (int64_t i = 0; i < n * p; ++i)
      z[i] = exact ? (i / p == i % p ? 1.0 : 0.0)
                   : static_cast<double>(mix64(0x10f7ull + static_cast<uint64_t>(i)) >> 11) *
                             (2.0 / 9007199254740992.0) -
                         1.0;
    const int iters = exact ? 1 : 24;
    for (int it = 0; it < iters; ++it) {
      orthonormalize(z, n, p);
      std::fill(y.begin(), y.end(), 0.0);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t c = 0; c < n; ++c) {
          const double xv = x[i * n + c];
          for (int64_t j = 0; j < p; ++j) y[i * p + j] += xv * z[c * p + j];
        }
      orthonormalize(y, m, p);
      if (it + 1 == iters) break;
      std::fill(z.begin(), z.end(), 0.0);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t c = 0; c < n; ++c) {
          const double xv = x[i * n + c];
          for (int64_t j = 0; j < p; ++j) z[c * p + j] += xv * y[i * p + j];
        }
    }
  }
  // Rayleigh-Ritz: c = y^T x [p, n]; c c^T = v diag(w) v^T; u = y v, s = sqrt(w), vt = v^T c / s.
  std::vector<double> c(static_cast<size_t>(p * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < p; ++j) {
      const double yv = y[i * p + j];
      if (yv == 0) continue;
      for (int64_t col = 0; col < n; ++col) c[j * n + col] += yv * x[i * n + col];
    }
  std::vector<double> g(static_cast<size_t>(p * p), 0.0), w, v;
  for (int64_t i = 0; i < p; ++i)
    for (int64_t j = i; j < p; ++j) {
      double d = 0;
      for (int64_t col = 0; col < n; ++col) d += c[i * n + col] * c[j * n + col];
      g[i * p + j] = g[j * p + i] = d;
    }
  jacobi_eigen(g, p, w, v);
  std::vector<int64_t> order(static_cast<size_t>(p));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return w[a] > w[b]; });
  u->assign(static_cast<size_t>(m * r), 0.0);
  s->assign(static_cast<size_t>(r), 0.0);
  vt->assign(static_cast<size_t>(r * n), 0.0);
  for (int j = 0; j < r; ++j) {
    const int64_t e = order[static_cast<size_t>(j)];
    const double sv = std::sqrt(std::max(w[e], 0.0));
    (*s)[j] = sv;
    for (int64_t i = 0; i < m; ++i) {
      double d = 0;
      for (int64_t q = 0; q < p; ++q) d += y[i * p + q] * v[q * p + e];
      (*u)[i * r + j] = d;
    }
    if (sv == 0) continue;  // a zero singular value: its vt row stays 0 (s times it is 0 anyway)
    for (int64_t col = 0; col < n; ++col) {
      double d = 0;
      for (int64_t q = 0; q < p; ++q) d += v[q * p + e] * c[q * n + col];
      (*vt)[j * n + col] = d / sv;
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
