#include "model/lora_init_factors.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "model/lora_loftq.h"  // truncated_svd

namespace qlft {

void pissa_factors(const float* w, int64_t out, int64_t in, int r, float scale, float* A,
                   float* B) {
  QLFT_CHECK_ARG(r >= 1 && scale > 0, "pissa_factors: rank %d, scale %g", r,
                 static_cast<double>(scale));
  const int k = static_cast<int>(std::min<int64_t>(r, std::min(out, in)));
  std::vector<double> u, s, vt;
  truncated_svd(w, out, in, k, &u, &s, &vt);
  for (int j = 0; j < k; ++j) {
    // The sign convention: column j of U has its largest-magnitude entry (the first on ties)
    // positive; flipping U's column and Vh's row together leaves U S Vh unchanged.
    int64_t arg = 0;
    for (int64_t i = 1; i < out; ++i)
      if (std::fabs(u[i * k + j]) > std::fabs(u[arg * k + j])) arg = i;
    if (u[arg * k + j] >= 0) continue;
    for (int64_t i = 0; i < out; ++i) u[i * k + j] = -u[i * k + j];
    for (int64_t c = 0; c < in; ++c) vt[j * in + c] = -vt[j * in + c];
  }
  for (int j = 0; j < r; ++j) {
    const double g = j < k ? std::sqrt(s[j] / scale) : 0.0;
    for (int64_t i = 0; i < out; ++i)
      B[i * r + j] = j < k ? static_cast<float>(u[i * k + j] * g) : 0.f;
    for (int64_t c = 0; c < in; ++c)
      A[j * in + c] = j < k ? static_cast<float>(g * vt[j * in + c]) : 0.f;
  }
}

void olora_factors(const float* w, int64_t out, int64_t in, int r, float* A, float* B) {
  QLFT_CHECK_ARG(r >= 1, "olora_factors: rank %d", r);
  const int64_t k = std::min<int64_t>(r, std::min(out, in));
  // Only the first k reflections matter: R's first k rows are final once they are applied, and
  // H_j (j >= k) leaves Q's first k columns alone (it acts on rows j.., where e_c, c < k <= j, is
  // zero). a: w in double, overwritten by R above the diagonal and the reflectors below it.
  std::vector<double> a(static_cast<size_t>(out * in));
  for (int64_t i = 0; i < out * in; ++i) a[static_cast<size_t>(i)] = w[i];
  std::vector<double> tau(static_cast<size_t>(k), 0.0);
  for (int64_t j = 0; j < k; ++j) {
    // dlarfg: H = I - tau v v^T with v = (1, x / (alpha - beta)) maps (alpha, x) to (beta, 0),
    // beta = -sign(alpha) |(alpha, x)|; x = 0 gives tau = 0 (no reflection, R_jj = alpha).
    const double alpha = a[j * in + j];
    double xnorm = 0;
    for (int64_t i = j + 1; i < out; ++i) xnorm += a[i * in + j] * a[i * in + j];
    xnorm = std::sqrt(xnorm);
    if (xnorm == 0) continue;
    const double beta = -std::copysign(std::hypot(alpha, xnorm), alpha);
    const double t = (beta - alpha) / beta, inv = 1 / (alpha - beta);
    tau[static_cast<size_t>(j)] = t;
    for (int64_t i = j + 1; i < out; ++i) a[i * in + j] *= inv;
    a[j * in + j] = beta;
    for (int64_t c = j + 1; c < in; ++c) {  // the columns to the right: a <- H a
      double d = a[j * in + c];
      for (int64_t i = j + 1; i < out; ++i) d += a[i * in + j] * a[i * in + c];
      d *= t;
      a[j * in + c] -= d;
      for (int64_t i = j + 1; i < out; ++i) a[i * in + c] -= d * a[i * in + j];
    }
  }
  // Q's first k columns: H_0 H_1 ... H_{k-1} applied to the identity's (dorg2r), last first.
  std::vector<double> q(static_cast<size_t>(out * k), 0.0);
  for (int64_t c = 0; c < k; ++c) q[c * k + c] = 1.0;
  for (int64_t j = k - 1; j >= 0; --j) {
    const double t = tau[static_cast<size_t>(j)];
    if (t == 0) continue;
    for (int64_t c = j; c < k; ++c) {
      double d = q[j * k + c];
      for (int64_t i = j + 1; i < out; ++i) d += a[i * in + j] * q[i * k + c];
      d *= t;
      q[j * k + c] -= d;
      for (int64_t i = j + 1; i < out; ++i) q[i * k + c] -= d * a[i * in + j];
    }
  }
  for (int64_t i = 0; i < out; ++i)
    for (int j = 0; j < r; ++j) B[i * r + j] = j < k ? static_cast<float>(q[i * k + j]) : 0.f;
  for (int j = 0; j < r; ++j)
    for (int64_t c = 0; c < in; ++c)
      A[j * in + c] = j < k && c >= j ? static_cast<float>(a[j * in + c]) : 0.f;
}

}  // namespace qlft
