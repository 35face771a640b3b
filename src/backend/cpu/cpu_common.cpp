#include <cblas.h>

#include <algorithm>
#include <climits>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace qlft {

std::unique_ptr<Backend> make_cpu_backend(MemoryTracker* tracker) {
  return std::make_unique<cpu::CpuBackend>(tracker);
}

namespace cpu {

int64_t panel_rows(const CpuBackend& be, const QWeight& W) {
  int64_t p = be.tune.panel_bytes / std::max<int64_t>(1, W.cols * 4);
  p = std::clamp<int64_t>(p, std::max<int64_t>(1, be.tune.panel_min_rows),
                          std::max<int64_t>(1, be.tune.panel_max_rows));
  return std::min<int64_t>(p, std::max<int64_t>(W.rows, 1));
}

void dequant_panel(const QWeight& W, int64_t r0, int64_t n, float* out) {
  int nt = 1;
#ifdef _OPENMP
  nt = omp_get_max_threads();
#endif
  // At least 8 rows per piece so per-call overhead stays small.
  int64_t pieces = std::min<int64_t>(nt, std::max<int64_t>(1, n / 8));
  if (pieces <= 1) {
    W.dequantize_rows(r0, n, out);
    return;
  }
  int64_t per = (n + pieces - 1) / pieces;
  // dequantize_rows may throw (an unsupported kind); carry the first error out of the region.
  std::exception_ptr err;
#pragma omp parallel for num_threads(pieces) schedule(static, 1)
  for (int64_t i = 0; i < pieces; ++i) {
    int64_t a = i * per, b = std::min(n, a + per);
    if (a >= b) continue;
    try {
      W.dequantize_rows(r0 + a, b - a, out + a * W.cols);
    } catch (...) {
#pragma omp critical(qlft_dequant_err)
      if (!err) err = std::current_exception();
    }
  }
  if (err) std::rethrow_exception(err);
}

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    // op(A) op(B) is empty: C = beta * C.
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.f ? 0.f : beta * C[i * ldc + j];
    return;
  }
  if (M > INT_MAX || N > INT_MAX || K > INT_MAX || lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX)
    throw_error(QLFT_ERR_INVALID_ARGUMENT,
                "sgemm: dimension too large for BLAS (%lld x %lld x %lld)", (long long)M,
                (long long)N, (long long)K);
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, int(M), int(N), int(K), alpha, A, int(lda), B,
              int(ldb), beta, C, int(ldc));
}

void matmul_xwt(const CpuBackend& be, const QWeight& W, CMatF x, MatF y, const char* what) {
  QLFT_CHECK_ARG(x.cols == W.cols && y.cols == W.rows && y.rows == x.rows,
                 "%s: shape mismatch: x [%lld, %lld], weight [%lld, %lld], y [%lld, %lld]", what,
                 (long long)x.rows, (long long)x.cols, (long long)W.rows, (long long)W.cols,
                 (long long)y.rows, (long long)y.cols);
  if (x.rows == 0 || W.rows == 0) return;
  const int64_t P = panel_rows(be, W), K = W.cols;
  Buffer panel = be.workspace(size_t(P * K) * 4, "weight panel");
  float* pw = panel.as<float>();
  for (int64_t p0 = 0; p0 < W.rows; p0 += P) {
    int64_t n = std::min(P, W.rows - p0);
    dequant_panel(W, p0, n, pw);
    sgemm(false, true, x.rows, n, K, 1.f, x.data, x.stride, pw, K, 0.f, y.data + p0, y.stride);
  }
}

}  // namespace cpu
}  // namespace qlft
