// Row-wise and element-wise ops: RMSNorm, RoPE, SwiGLU. One row per task, so the results do
// not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/activation_math.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/vec_kernels.h"
#include "backend/cpu/vec_math.h"
#include "backend/norm_math.h"
#include "backend/rope_math.h"
#include "core/error.h"
#include "core/threads.h"

namespace qlft::cpu {

namespace {
void check_same(CMatF a, CMatF b, const char* op, const char* an, const char* bn) {
  QLFT_CHECK_ARG(a.rows == b.rows && a.cols == b.cols,
                 "%s: %s is [%lld, %lld] but %s is [%lld, %lld]", op, an, (long long)a.rows,
                 (long long)a.cols, bn, (long long)b.rows, (long long)b.cols);
}
}  // namespace

void CpuBackend::rmsnorm_fwd(CMatF x, const float* w, float eps, MatF y, float* rstd) {
  check_same(x, y.as_const(), "rmsnorm_fwd", "x", "y");
  const int64_t C = x.cols;
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
  for (int64_t i = 0; i < x.rows; ++i) {
    vec_kernels().rmsnorm_fwd_row(x.row(i), w, eps, y.row(i), rstd ? &rstd[i] : nullptr, C);
  }
}

void CpuBackend::rmsnorm_bwd(CMatF x, const float* w, const float* rstd, CMatF dy, MatF dx) {
  check_same(x, dy, "rmsnorm_bwd", "x", "dy");
  check_same(x, dx.as_const(), "rmsnorm_bwd", "x", "dx");
  QLFT_CHECK_ARG(rstd != nullptr, "rmsnorm_bwd: the forward pass's rstd is required");
  const int64_t C = x.cols;
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
  for (int64_t i = 0; i < x.rows; ++i) {
    vec_kernels().rmsnorm_bwd_row(x.row(i), w, rstd[i], dy.row(i), dx.row(i), C);
  }
}

void CpuBackend::rope(MatF x, const int32_t* pos, int n_heads, int head_dim, float theta,
                      bool adjacent, bool inverse) {
  QLFT_CHECK_ARG(head_dim > 0 && head_dim % 2 == 0, "rope: head_dim must be even, got %d",
                 head_dim);
  QLFT_CHECK_ARG(n_heads > 0 && int64_t(n_heads) * head_dim <= x.cols,
                 "rope: %d heads of %d do not fit rows of %lld", n_heads, head_dim,
                 (long long)x.cols);
  const int half = head_dim / 2;
  std::vector<float> inv_freq(half);
  for (int i = 0; i < half; ++i) inv_freq[i] = rope_inv_freq(theta, i, head_dim);
  if (x.rows == 0) return;
  // cos/sin per distinct position, not per row: rows repeat positions across the batch (and
  // across packed documents), and sincos dominates this op otherwise. Same formulas, so the
  // values are bit-identical to computing them per row.
  int32_t max_pos = 0;
  for (int64_t row = 0; row < x.rows; ++row) {
    QLFT_CHECK_ARG(pos[row] >= 0, "rope: negative position %d at row %lld", pos[row],
                   (long long)row);
    max_pos = std::max(max_pos, pos[row]);
  }
  const int64_t n_pos = int64_t(max_pos) + 1;
  // Generation passes one row at a large position: there a table would cost more than it saves.
  const bool use_table = n_pos <= x.rows;
  const int64_t n_tab = use_table ? n_pos : x.rows;
  Buffer table = workspace(size_t(n_tab) * half * 2 * sizeof(float), "rope cos/sin table");
  float* cs = table.as<float>();  // [n_tab][half] cos, then [n_tab][half] sin
  float* sn = cs + n_tab * half;
  const float* fr = inv_freq.data();
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
  for (int64_t t = 0; t < n_tab; ++t) {
    const int p = use_table ? int(t) : pos[t];
    for (int i = 0; i < half; ++i) {
      float ang = rope_angle(p, fr[i]);
      cs[t * half + i] = cosf(ang);
      sn[t * half + i] = inverse ? -sinf(ang) : sinf(ang);
    }
  }
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
  for (int64_t row = 0; row < x.rows; ++row) {
    const int64_t t = use_table ? pos[row] : row;
    vec_kernels().rope_row(x.row(row), cs + t * half, sn + t * half, n_heads, head_dim, adjacent);
  }
}

void CpuBackend::swiglu_fwd(CMatF gate, CMatF up, MatF out) {
  check_same(gate, up, "swiglu_fwd", "gate", "up");
  check_same(gate, out.as_const(), "swiglu_fwd", "gate", "out");
  const int64_t C = gate.cols;
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
  for (int64_t i = 0; i < gate.rows; ++i) {
    const float* g = gate.row(i);
    const float* u = up.row(i);
    float* o = out.row(i);
    vec_kernels().swiglu_fwd_row(g, u, o, C);
  }
}

void CpuBackend::swiglu_bwd(CMatF gate, CMatF up, CMatF dout, MatF dgate, MatF dup) {
  check_same(gate, up, "swiglu_bwd", "gate", "up");
  check_same(gate, dout, "swiglu_bwd", "gate", "dout");
  check_same(gate, dgate.as_const(), "swiglu_bwd", "gate", "dgate");
  check_same(gate, dup.as_const(), "swiglu_bwd", "gate", "dup");
  const int64_t C = gate.cols;
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
  for (int64_t i = 0; i < gate.rows; ++i) {
    const float* g = gate.row(i);
    const float* u = up.row(i);
    const float* d = dout.row(i);
    float* dg = dgate.row(i);
    float* du = dup.row(i);
    vec_kernels().swiglu_bwd_row(g, u, d, dg, du, C);
  }
}

}  // namespace qlft::cpu
