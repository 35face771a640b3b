// Row-wise and element-wise ops: RMSNorm, RoPE, SwiGLU. One row per task, so the results do
// not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/activation_math.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_glu.h"
#include "backend/op_checks.h"
#include "backend/cpu/vec_kernels.h"
#include "backend/cpu/vec_math.h"
#include "backend/norm_math.h"
#include "backend/rope_math.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/profile.h"
#include "core/threads.h"

namespace qlft::cpu {

void CpuBackend::rmsnorm_fwd(CMatF x, const float* w, float eps, MatF y, float* rstd) {
  QLFT_PROFILE_SCOPE("rmsnorm_fwd");
  op_checks::same_shape(x, y.as_const(), "rmsnorm_fwd", "x", "y");
  const int64_t C = x.cols;
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
  for (int64_t i = 0; i < x.rows; ++i) {
    vec_kernels().rmsnorm_fwd_row(x.row(i), w, eps, y.row(i), rstd ? &rstd[i] : nullptr, C);
  }
}

namespace {
// fp32 row -> t (BF16 or F16), as Backend::to_16 converts.
void row_to_16(DType t, const float* src, uint16_t* dst, int64_t n) {
  if (t == DType::BF16)
    f32_to_bf16_n(src, dst, size_t(n));
  else
    f32_to_f16_n(src, dst, size_t(n));
}
void row_from_16(DType t, const uint16_t* src, float* dst, int64_t n) {
  if (t == DType::BF16)
    bf16_to_f32_n(src, dst, size_t(n));
  else
    f16_to_f32_n(src, dst, size_t(n));
}
}  // namespace

// One pass per row: the norm and its 16-bit copy (the row still in cache), one parallel region.
// A null y: each row goes through a row buffer of the thread's.
void CpuBackend::rmsnorm_fwd_16(CMatF x, const float* w, float eps, MatF y, float* rstd, DType t,
                                uint16_t* y16) {
  QLFT_PROFILE_SCOPE("rmsnorm_fwd_16");
  op_checks::same_shape(x, y.as_const(), "rmsnorm_fwd_16", "x", "y");
  const int64_t C = x.cols;
#pragma omp parallel num_threads(qlft::num_threads())
  {
    std::vector<float> row(y.data ? 0 : size_t(C));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < x.rows; ++i) {
      float* yr = y.data ? y.row(i) : row.data();
      vec_kernels().rmsnorm_fwd_row(x.row(i), w, eps, yr, rstd ? &rstd[i] : nullptr, C);
      row_to_16(t, yr, y16 + i * C, C);
    }
  }
}

void CpuBackend::add_rmsnorm_fwd_16(MatF x, const float* r, const float* w, float eps, float* rstd,
                                    DType t, uint16_t* y16) {
  QLFT_PROFILE_SCOPE("add_rmsnorm_fwd_16");
  QLFT_CHECK_ARG(x.stride == x.cols, "add_rmsnorm_fwd_16: x must be dense");
  const int64_t C = x.cols;
#pragma omp parallel num_threads(qlft::num_threads())
  {
    std::vector<float> row(static_cast<size_t>(C));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < x.rows; ++i) {
      float* xr = x.row(i);
      const float* rr = r + i * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) xr[c] += rr[c];
      vec_kernels().rmsnorm_fwd_row(xr, w, eps, row.data(), rstd ? &rstd[i] : nullptr, C);
      row_to_16(t, row.data(), y16 + i * C, C);
    }
  }
}

// gate and up rounded (into g16 / u16, and in place with keep_rounded), SwiGLU, its 16-bit copy:
// a row at a time. keep_rounded = false and a null out: the rounded gate / up rows and the
// output row live in row buffers of the thread's, nothing fp32 is written.
void CpuBackend::swiglu_fwd_16(MatF gate, MatF up, MatF out, DType t, uint16_t* g16, uint16_t* u16,
                               uint16_t* o16, bool keep_rounded) {
  QLFT_PROFILE_SCOPE("swiglu_fwd_16");
  op_checks::same_shape(gate.as_const(), up.as_const(), "swiglu_fwd_16", "gate", "up");
  op_checks::same_shape(gate.as_const(), out.as_const(), "swiglu_fwd_16", "gate", "out");
  const int64_t C = gate.cols;
#pragma omp parallel num_threads(qlft::num_threads())
  {
    std::vector<float> rows(size_t(keep_rounded ? 0 : 2 * C) + size_t(out.data ? 0 : C));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < gate.rows; ++i) {
      float* g = keep_rounded ? gate.row(i) : rows.data();
      float* u = keep_rounded ? up.row(i) : rows.data() + C;
      float* o = out.data ? out.row(i) : rows.data() + (keep_rounded ? 0 : 2 * C);
      row_to_16(t, gate.row(i), g16 + i * C, C);
      row_from_16(t, g16 + i * C, g, C);
      row_to_16(t, up.row(i), u16 + i * C, C);
      row_from_16(t, u16 + i * C, u, C);
      vec_kernels().swiglu_fwd_row(g, u, o, C);
      row_to_16(t, o, o16 + i * C, C);
    }
  }
}

void CpuBackend::swiglu_fwd_from_16(DType t, const uint16_t* g16, const uint16_t* u16,
                                    uint16_t* o16, int64_t rows, int64_t cols) {
  QLFT_PROFILE_SCOPE("swiglu_fwd_from_16");
  const int64_t C = cols;
#pragma omp parallel num_threads(qlft::num_threads())
  {
    std::vector<float> buf(size_t(3 * C));
    float* g = buf.data();
    float* u = g + C;
    float* o = u + C;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      row_from_16(t, g16 + i * C, g, C);
      row_from_16(t, u16 + i * C, u, C);
      vec_kernels().swiglu_fwd_row(g, u, o, C);
      row_to_16(t, o, o16 + i * C, C);
    }
  }
}

// gate and up rows widened into row buffers of the thread's (gate and up untouched).
void CpuBackend::swiglu_bwd_16(MatF gate, MatF up, DType t, const uint16_t* g16,
                               const uint16_t* u16, CMatF dout, MatF dgate, MatF dup) {
  QLFT_PROFILE_SCOPE("swiglu_bwd_16");
  op_checks::same_shape(gate.as_const(), dout, "swiglu_bwd_16", "gate", "dout");
  op_checks::same_shape(up.as_const(), dout, "swiglu_bwd_16", "up", "dout");
  op_checks::same_shape(dout, dgate.as_const(), "swiglu_bwd_16", "dout", "dgate");
  op_checks::same_shape(dout, dup.as_const(), "swiglu_bwd_16", "dout", "dup");
  const int64_t C = dout.cols;
#pragma omp parallel num_threads(qlft::num_threads())
  {
    std::vector<float> rows(size_t(2 * C));
    float* g = rows.data();
    float* u = g + C;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < dout.rows; ++i) {
      row_from_16(t, g16 + i * C, g, C);
      row_from_16(t, u16 + i * C, u, C);
      vec_kernels().swiglu_bwd_row(g, u, dout.row(i), dgate.row(i), dup.row(i), C);
    }
  }
}

// swiglu_bwd_16's rows into row buffers, rounded into dg16 / du16 (what to_lp would make of
// swiglu_bwd_16's fp32 outputs).
void CpuBackend::swiglu_bwd_to_16(DType t, const uint16_t* g16, const uint16_t* u16, CMatF dout,
                                  View2<uint16_t> dg16, View2<uint16_t> du16) {
  QLFT_PROFILE_SCOPE("swiglu_bwd_to_16");
  const int64_t C = dout.cols;
  QLFT_CHECK_ARG(dg16.rows == dout.rows && dg16.cols == C && du16.rows == dout.rows &&
                     du16.cols == C && dg16.stride >= C && du16.stride >= C,
                 "swiglu_bwd_to_16: dgate / dup must be [%lld, %lld]", (long long)dout.rows,
                 (long long)C);
#pragma omp parallel num_threads(qlft::num_threads())
  {
    std::vector<float> rows(size_t(4 * C));
    float* g = rows.data();
    float* u = g + C;
    float* dg = u + C;
    float* du = dg + C;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < dout.rows; ++i) {
      row_from_16(t, g16 + i * C, g, C);
      row_from_16(t, u16 + i * C, u, C);
      vec_kernels().swiglu_bwd_row(g, u, dout.row(i), dg, du, C);
      row_to_16(t, dg, dg16.row(i), C);
      row_to_16(t, du, du16.row(i), C);
    }
  }
}

void CpuBackend::rmsnorm_bwd(CMatF x, const float* w, const float* rstd, CMatF dy, MatF dx) {
  QLFT_PROFILE_SCOPE("rmsnorm_bwd");
  op_checks::same_shape(x, dy, "rmsnorm_bwd", "x", "dy");
  op_checks::same_shape(x, dx.as_const(), "rmsnorm_bwd", "x", "dx");
  op_checks::rstd_given(rstd);
  const int64_t C = x.cols;
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
  for (int64_t i = 0; i < x.rows; ++i) {
    vec_kernels().rmsnorm_bwd_row(x.row(i), w, rstd[i], dy.row(i), dx.row(i), C);
  }
}

RopeTable::RopeTable(const CpuBackend& be, const int32_t* pos, int64_t rows, int head_dim,
                     const RopeFreqs& freqs, bool inverse)
    : pos_(pos), half_(head_dim / 2) {
  const int half = half_;
  if (rows == 0) return;
  // cos/sin per distinct position, not per row: rows repeat positions across the batch (and
  // across packed documents), and sincos dominates this op otherwise. Same formulas, so the
  // values are bit-identical to computing them per row.
  int32_t max_pos = 0;
  for (int64_t row = 0; row < rows; ++row) {
    QLFT_CHECK_ARG(pos[row] >= 0, "rope: negative position %d at row %lld", pos[row],
                   (long long)row);
    max_pos = std::max(max_pos, pos[row]);
  }
  const int64_t n_pos = int64_t(max_pos) + 1;
  // Generation passes one row at a large position: there a table would cost more than it saves.
  by_pos_ = n_pos <= rows;
  const int64_t n_tab = by_pos_ ? n_pos : rows;
  buf_ = be.workspace(size_t(n_tab) * half * 2 * sizeof(float), "rope cos/sin table");
  float* cs = buf_.as<float>();  // [n_tab][half] cos, then [n_tab][half] sin
  float* sn = cs + n_tab * half;
  cs_ = cs;
  sn_ = sn;
  const float* fr = freqs.inv_freq.data();
  const float sc = freqs.scale;  // yarn's attention factor (1: the products are exact)
  const bool use_table = by_pos_;
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
  for (int64_t t = 0; t < n_tab; ++t) {
    const int p = use_table ? int(t) : pos[t];
    for (int i = 0; i < half; ++i) {
      float ang = rope_angle(p, fr[i]);
      cs[t * half + i] = cosf(ang) * sc;
      sn[t * half + i] = inverse ? -(sinf(ang) * sc) : sinf(ang) * sc;
    }
  }
}

void CpuBackend::rope(MatF x, const int32_t* pos, int n_heads, int head_dim, const RopeFreqs& freqs,
                      bool adjacent, bool inverse) {
  QLFT_PROFILE_SCOPE("rope");
  op_checks::rope(x.cols, n_heads, head_dim, freqs);
  if (x.rows == 0) return;
  const RopeTable tab(*this, pos, x.rows, head_dim, freqs, inverse);
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
  for (int64_t row = 0; row < x.rows; ++row)
    vec_kernels().rope_row(x.row(row), tab.cos_of(row), tab.sin_of(row), n_heads, head_dim,
                           adjacent);
}

void CpuBackend::rope_to_16(MatF x, const int32_t* pos, int n_heads, int head_dim,
                            const RopeFreqs& freqs, bool adjacent, DType t, uint16_t* x16) {
  QLFT_PROFILE_SCOPE("rope_to_16");
  op_checks::rope(x.cols, n_heads, head_dim, freqs);
  if (x.rows == 0) return;
  const RopeTable tab(*this, pos, x.rows, head_dim, freqs, false);
  const int64_t C = x.cols;
#pragma omp parallel num_threads(qlft::num_threads())
  {
    std::vector<float> row(static_cast<size_t>(C));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < x.rows; ++i) {
      std::copy_n(x.row(i), C, row.data());
      vec_kernels().rope_row(row.data(), tab.cos_of(i), tab.sin_of(i), n_heads, head_dim, adjacent);
      row_to_16(t, row.data(), x16 + i * C, C);
    }
  }
}

void CpuBackend::swiglu_fwd(CMatF gate, CMatF up, MatF out) {
  QLFT_PROFILE_SCOPE("swiglu_fwd");
  glu_fwd_rows("swiglu_fwd", gate, up, out,
               [](const float* g, const float* u, float* o, int64_t C) {
                 vec_kernels().swiglu_fwd_row(g, u, o, C);
               });
}

void CpuBackend::swiglu_bwd(CMatF gate, CMatF up, CMatF dout, MatF dgate, MatF dup) {
  QLFT_PROFILE_SCOPE("swiglu_bwd");
  glu_bwd_rows("swiglu_bwd", gate, up, dout, dgate, dup,
               [](const float* g, const float* u, const float* d, float* dg, float* du, int64_t C) {
                 vec_kernels().swiglu_bwd_row(g, u, d, dg, du, C);
               });
}

}  // namespace qlft::cpu
