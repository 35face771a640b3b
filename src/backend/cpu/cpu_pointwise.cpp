// Row-wise and element-wise ops: RMSNorm, RoPE, SwiGLU. One row per task, so the results do
// not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/activation_math.h"
#include "backend/cpu/cpu_backend.h"
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
// sigmoid(g) with the vectorizable exp (about 1 ulp from activation_math.h's expf form). The
// argument is clamped first so a NaN gate cannot reach exp_approx's float-to-int step; the NaN
// still reaches the outputs through the factor g.
inline float sigmoid_vec(float g) {
  float t = std::min(87.f, std::max(-87.f, -g));
  return 1.f / (1.f + exp_approx(t));
}
}  // namespace

void CpuBackend::rmsnorm_fwd(CMatF x, const float* w, float eps, MatF y, float* rstd) {
  check_same(x, y.as_const(), "rmsnorm_fwd", "x", "y");
  const int64_t C = x.cols;
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
  for (int64_t i = 0; i < x.rows; ++i) {
    const float* xr = x.row(i);
    double ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < C; ++c) ss += double(xr[c]) * xr[c];
    float r = rmsnorm_rstd(ss, long(C), eps);
    if (rstd) rstd[i] = r;
    float* yr = y.row(i);
    for (int64_t c = 0; c < C; ++c) yr[c] = rmsnorm_apply(xr[c], w[c], r);
  }
}

void CpuBackend::rmsnorm_bwd(CMatF x, const float* w, const float* rstd, CMatF dy, MatF dx) {
  check_same(x, dy, "rmsnorm_bwd", "x", "dy");
  check_same(x, dx.as_const(), "rmsnorm_bwd", "x", "dx");
  QLFT_CHECK_ARG(rstd != nullptr, "rmsnorm_bwd: the forward pass's rstd is required");
  const int64_t C = x.cols;
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
  for (int64_t i = 0; i < x.rows; ++i) {
    const float* xr = x.row(i);
    const float* dyr = dy.row(i);
    float r = rstd[i];
    double dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t c = 0; c < C; ++c) dot += double(dyr[c]) * w[c] * xr[c];
    float coef = rmsnorm_bwd_coef(dot, long(C), r);
    float* dxr = dx.row(i);
    for (int64_t c = 0; c < C; ++c) dxr[c] += rmsnorm_bwd_elem(xr[c], w[c], dyr[c], r, coef);
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
    float* xr = x.row(row);
    const int64_t t = use_table ? pos[row] : row;
    const float* c = cs + t * half;
    const float* sr = sn + t * half;
    for (int h = 0; h < n_heads; ++h) {
      float* xh = xr + int64_t(h) * head_dim;
      if (adjacent) {
        for (int i = 0; i < half; ++i) rope_rotate_pair(xh[2 * i], xh[2 * i + 1], c[i], sr[i]);
      } else {
#pragma omp simd
        for (int i = 0; i < half; ++i) rope_rotate_pair(xh[i], xh[i + half], c[i], sr[i]);
      }
    }
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
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = swiglu_from_sigmoid(g[c], u[c], sigmoid_vec(g[c]));
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
#pragma omp simd
    for (int64_t c = 0; c < C; ++c)
      swiglu_bwd_from_sigmoid(g[c], u[c], d[c], sigmoid_vec(g[c]), dg[c], du[c]);
  }
}

}  // namespace qlft::cpu
