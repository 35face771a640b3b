// The Backend's host implementations of the elementwise glue (the CPU backend uses them as they
// are; a device backend overrides them with kernels).
#include "backend/backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "backend/op_checks.h"
#include "core/error.h"
#include "core/half.h"
#include "core/profile.h"
#include "core/state_store.h"
#include "core/threads.h"

namespace qlft {

namespace {
// Parallel over chunks of kChunk elements: f(offset, count). Up to two chunks run on the calling
// thread: waking a passive OpenMP worker costs about what converting a chunk does.
constexpr int64_t kChunk = 1 << 15;
template <class F>
void for_chunks(int64_t n, const F& f) {
  if (n <= 2 * kChunk) {
    for (int64_t i = 0; i < n; i += kChunk) f(i, static_cast<size_t>(std::min(kChunk, n - i)));
    return;
  }
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
  for (int64_t i = 0; i < n; i += kChunk) f(i, static_cast<size_t>(std::min(kChunk, n - i)));
}
}  // namespace

void Backend::add(float* y, const float* x, int64_t n) {
  QLFT_PROFILE_SCOPE("add");
  for_chunks(n, [&](int64_t i, size_t m) {
#pragma omp simd
    for (size_t j = 0; j < m; ++j) y[i + int64_t(j)] += x[i + int64_t(j)];
  });
}

void Backend::copy(float* dst, const float* src, int64_t n) {
  QLFT_PROFILE_SCOPE("copy");
  if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

Buffer Backend::alloc_pinned(MemCategory c, size_t bytes, const char* what) {
  return Buffer(tracker_, c, bytes, what, BufferInit::Uninit);
}

uint64_t Backend::copy_async(void* dst, const void* src, size_t bytes) {
  QLFT_PROFILE_SCOPE("copy_async");
  if (bytes) std::memcpy(dst, src, bytes);
  return 0;
}

void Backend::to_16(DType t, const float* src, uint16_t* dst, int64_t n) {
  QLFT_PROFILE_SCOPE("to_16");
  for_chunks(n, [&](int64_t i, size_t m) { f32_to_16_n(t, src + i, dst + i, m); });
}

void Backend::from_16(DType t, const uint16_t* src, float* dst, int64_t n) {
  QLFT_PROFILE_SCOPE("from_16");
  for_chunks(n, [&](int64_t i, size_t m) {
    if (t == DType::BF16)
      bf16_to_f32_n(src + i, dst + i, m);
    else
      f16_to_f32_n(src + i, dst + i, m);
  });
}

void Backend::round_16(DType t, float* x, int64_t n) {
  QLFT_PROFILE_SCOPE("round_16");
  for_chunks(n, [&](int64_t i, size_t m) { round_through_n(t, x + i, x + i, m); });
}

void Backend::rmsnorm_fwd_16(CMatF x, const float* w, float eps, MatF y, float* rstd, DType t,
                             uint16_t* y16) {
  Buffer tmp;
  if (!y.data) {
    tmp = alloc(MemCategory::Workspace, size_t(y.rows * y.cols) * 4, "rmsnorm output",
                BufferInit::Uninit);
    y = MatF(tmp.as<float>(), y.rows, y.cols);
  }
  rmsnorm_fwd(x, w, eps, y, rstd);
  QLFT_CHECK_ARG(y.stride == y.cols, "rmsnorm_fwd_16: y must be dense");
  to_16(t, y.data, y16, y.rows * y.cols);
}

void Backend::add_rmsnorm_fwd_16(MatF x, const float* r, const float* w, float eps, float* rstd,
                                 DType t, uint16_t* y16) {
  QLFT_CHECK_ARG(x.stride == x.cols, "add_rmsnorm_fwd_16: x must be dense");
  add(x.data, r, x.rows * x.cols);
  rmsnorm_fwd_16(x.as_const(), w, eps, MatF(nullptr, x.rows, x.cols), rstd, t, y16);
}

void Backend::swiglu_fwd_16(MatF gate, MatF up, MatF out, DType t, uint16_t* g16, uint16_t* u16,
                            uint16_t* o16, bool keep_rounded) {
  (void)keep_rounded;
  Buffer tmp;
  if (!out.data) {
    tmp = alloc(MemCategory::Workspace, size_t(out.rows * out.cols) * 4, "swiglu output",
                BufferInit::Uninit);
    out = MatF(tmp.as<float>(), out.rows, out.cols);
  }
  QLFT_CHECK_ARG(gate.stride == gate.cols && up.stride == up.cols && out.stride == out.cols,
                 "swiglu_fwd_16: gate, up and out must be dense");
  const int64_t n = gate.rows * gate.cols;
  to_16(t, gate.data, g16, n);
  from_16(t, g16, gate.data, n);
  to_16(t, up.data, u16, n);
  from_16(t, u16, up.data, n);
  swiglu_fwd(gate.as_const(), up.as_const(), out);
  to_16(t, out.data, o16, n);
}

void Backend::linear_fwd_to_16(const QWeight& W, const float* bias, const LoraRef* lora, CMatF x,
                               MatF y, float* xa, DType t, uint16_t* y16) {
  QLFT_CHECK_ARG(y.stride == y.cols, "linear_fwd_to_16: y must be dense");
  linear_fwd(W, bias, lora, x, y, xa);
  to_16(t, y.data, y16, y.rows * y.cols);
}

void Backend::rmsnorm_bwd_16(CMatF x, const float* w, const float* rstd, CMatF dy, MatF dx, DType t,
                             uint16_t* dx16) {
  QLFT_CHECK_ARG(dx.stride == dx.cols, "rmsnorm_bwd_16: dx must be dense");
  rmsnorm_bwd(x, w, rstd, dy, dx);
  to_16(t, dx.data, dx16, dx.rows * dx.cols);
}

void Backend::attention_fwd_to_16(const AttnShape& s, CMatF q, CMatF k, CMatF v, MatF out,
                                  float* lse, DType t, uint16_t* out16) {
  QLFT_CHECK_ARG(out.stride == out.cols, "attention_fwd_to_16: out must be dense");
  attention_fwd(s, q, k, v, out, lse);
  to_16(t, out.data, out16, out.rows * out.cols);
}

void Backend::swiglu_fwd_from_16(DType t, const uint16_t* g16, const uint16_t* u16, uint16_t* o16,
                                 int64_t rows, int64_t cols) {
  const size_t n = size_t(rows * cols);
  Buffer tmp =
      alloc(MemCategory::Workspace, 3 * n * 4, "swiglu_fwd_from_16 rows", BufferInit::Uninit);
  float* g = tmp.as<float>();
  float* u = g + n;
  float* o = u + n;
  from_16(t, g16, g, int64_t(n));
  from_16(t, u16, u, int64_t(n));
  swiglu_fwd(CMatF(g, rows, cols), CMatF(u, rows, cols), MatF(o, rows, cols));
  to_16(t, o, o16, int64_t(n));
}

void Backend::swiglu_bwd_16(MatF gate, MatF up, DType t, const uint16_t* g16, const uint16_t* u16,
                            CMatF dout, MatF dgate, MatF dup) {
  QLFT_CHECK_ARG(gate.stride == gate.cols && up.stride == up.cols,
                 "swiglu_bwd_16: gate and up must be dense");
  from_16(t, g16, gate.data, gate.rows * gate.cols);
  from_16(t, u16, up.data, up.rows * up.cols);
  swiglu_bwd(gate.as_const(), up.as_const(), dout, dgate, dup);
}

namespace {
// src [rows, cols] dense fp32 -> dst (16-bit, its stride) through to_16.
void to_16_rows(Backend& be, DType t, const float* src, View2<uint16_t> dst) {
  if (dst.stride == dst.cols) {
    be.to_16(t, src, dst.data, dst.rows * dst.cols);
    return;
  }
  for (int64_t i = 0; i < dst.rows; ++i) be.to_16(t, src + i * dst.cols, dst.row(i), dst.cols);
}
}  // namespace

void Backend::rope_to_16(MatF x, const int32_t* pos, int n_heads, int head_dim,
                         const RopeFreqs& freqs, bool adjacent, DType t, uint16_t* x16) {
  rope(x, pos, n_heads, head_dim, freqs, adjacent, false);
  if (x.stride == x.cols)
    to_16(t, x.data, x16, x.rows * x.cols);
  else
    for (int64_t i = 0; i < x.rows; ++i) to_16(t, x.row(i), x16 + i * x.cols, x.cols);
}

void Backend::swiglu_bwd_to_16(DType t, const uint16_t* g16, const uint16_t* u16, CMatF dout,
                               View2<uint16_t> dg16, View2<uint16_t> du16) {
  const int64_t R = dout.rows, C = dout.cols;
  const size_t bytes = size_t(R * C) * 4;
  Buffer g = alloc(MemCategory::Workspace, bytes, "swiglu gate", BufferInit::Uninit);
  Buffer u = alloc(MemCategory::Workspace, bytes, "swiglu up", BufferInit::Uninit);
  Buffer dg = alloc(MemCategory::Workspace, bytes, "swiglu d gate", BufferInit::Uninit);
  Buffer du = alloc(MemCategory::Workspace, bytes, "swiglu d up", BufferInit::Uninit);
  swiglu_bwd_16(MatF(g.as<float>(), R, C), MatF(u.as<float>(), R, C), t, g16, u16, dout,
                MatF(dg.as<float>(), R, C), MatF(du.as<float>(), R, C));
  to_16_rows(*this, t, dg.as<float>(), dg16);
  to_16_rows(*this, t, du.as<float>(), du16);
}

void Backend::attention_bwd_16(const AttnShape& s, CMatF q, CMatF k, CMatF v, CMatF out,
                               const float* lse, CMatF dout, const RopeArgs& rope, DType t,
                               View2<uint16_t> dq16, View2<uint16_t> dk16, View2<uint16_t> dv16) {
  const int64_t R = q.rows;
  Buffer dq = alloc(MemCategory::Workspace, size_t(R * q.cols) * 4, "attention dq");
  Buffer dk = alloc(MemCategory::Workspace, size_t(R * k.cols) * 4, "attention dk");
  Buffer dv = alloc(MemCategory::Workspace, size_t(R * v.cols) * 4, "attention dv");
  const MatF mq(dq.as<float>(), R, q.cols), mk(dk.as<float>(), R, k.cols),
      mv(dv.as<float>(), R, v.cols);
  attention_bwd(s, q, k, v, out, lse, dout, mq, mk, mv);
  QLFT_CHECK_ARG(rope.freqs, "attention_bwd_16: RopeArgs.freqs is required");
  this->rope(mq, rope.pos, s.n_heads, s.head_dim, *rope.freqs, rope.adjacent, true);
  this->rope(mk, rope.pos, s.n_kv_heads, s.head_dim, *rope.freqs, rope.adjacent, true);
  to_16_rows(*this, t, mq.data, dq16);
  to_16_rows(*this, t, mk.data, dk16);
  to_16_rows(*this, t, mv.data, dv16);
}

double Backend::sum_squares(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return s;
}

void Backend::scale(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

int64_t Backend::count_nonfinite(const float* x, int64_t n) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i) c += !std::isfinite(x[i]);
  return c;
}

std::vector<KernelLaunches> launches_since(const std::vector<KernelLaunches>& before,
                                           const std::vector<KernelLaunches>& now) {
  std::map<std::string, uint64_t> was;
  for (const KernelLaunches& k : before) was[k.name] = k.count;
  std::vector<KernelLaunches> out;
  for (const KernelLaunches& k : now) {
    const uint64_t b = was.count(k.name) ? was[k.name] : 0;
    if (k.count > b) out.push_back({k.name, k.count - b});
  }
  return out;
}

void Backend::adamw_torch(float* p, float* m, float* v, const float* g, int64_t n,
                          const AdamWTorchCoeffs& c) {
  for (int64_t i = 0; i < n; ++i) adamw_torch_update(p[i], m[i], v[i], g[i], c);
}

void Backend::adamw_torch_to_16(float* p, float* m, float* v, const float* g, int64_t n,
                                const AdamWTorchCoeffs& c, DType t, uint16_t* p16) {
  adamw_torch(p, m, v, g, n, c);
  to_16(t, p, p16, n);
}

void Backend::adamw_bnb8(float*, uint8_t*, uint8_t*, float*, float*, const float*, int64_t,
                         const AdamBnbCoeffs&) {
  throw_error(QLFT_ERR_UNSUPPORTED, "backend %s has no device 8-bit AdamW step", name());
}

void Backend::adamw_bnb32(float*, float*, float*, const float*, int64_t, const AdamBnbCoeffs&) {
  throw_error(QLFT_ERR_UNSUPPORTED, "backend %s has no device 8-bit AdamW step", name());
}

std::unique_ptr<StateStore> Backend::managed_state_store() {
  return nullptr;
}

void Backend::cross_entropy_stats(const QWeight&, int64_t, int64_t, CMatF, const int32_t*, int32_t,
                                  CrossEntropyRow*) {
  throw_error(QLFT_ERR_UNSUPPORTED, "backend %s has no cross-entropy over a head in slices",
              name());
}

void Backend::cross_entropy_grad(const QWeight&, int64_t, int64_t, CMatF, const int32_t*, int32_t,
                                 const float*, float, MatF) {
  throw_error(QLFT_ERR_UNSUPPORTED, "backend %s has no cross-entropy over a head in slices",
              name());
}

void Backend::cross_entropy_walk(const QWeight&, int64_t, int64_t, CMatF, const int32_t*, int32_t,
                                 float, CrossEntropyRow*, float*, MatF) {
  throw_error(QLFT_ERR_UNSUPPORTED, "backend %s has no one-walk cross-entropy over head slices",
              name());
}

void cross_entropy_walk_end(const CrossEntropyRow* st, const int32_t* targets, int32_t ignore_index,
                            float grad_scale, const float* acc, MatF dh) {
  const int64_t H = dh.cols;
  int64_t k = 0;  // acc's row: the k-th row whose target counts
  for (int64_t i = 0; i < dh.rows; ++i) {
    if (targets[i] == ignore_index) continue;
    const float a = ce_acc_factor(st[i], grad_scale);
    float* d = dh.row(i);
    const float* g = acc + k++ * H;
    for (int64_t c = 0; c < H; ++c) d[c] += a * g[c];
  }
}

void Backend::positions(int32_t* pos, int n, int32_t start) {
  for (int i = 0; i < n; ++i) pos[i] = start + i;
}

int32_t Backend::argmax(const float* x, int64_t n) {
  QLFT_CHECK_ARG(n > 0, "argmax: no values");
  int64_t best = 0;  // the first of the largest: model/sampler.cpp's greedy walk
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return static_cast<int32_t>(best);
}

void Backend::attention_decode(const HeadGeometry&, int, int, CMatF, const float*, const float*,
                               MatF) {
  throw_error(QLFT_ERR_UNSUPPORTED, "backend %s has no decode attention over a KV cache", name());
}

// Gemma's ops: refused where a backend lacks them (the runner checks gemma_ops() first).
void Backend::geglu_fwd(CMatF, CMatF, MatF) {
  throw_error(QLFT_ERR_UNSUPPORTED, "backend %s has no GeGLU (Gemma)", name());
}
void Backend::geglu_bwd(CMatF, CMatF, CMatF, MatF, MatF) {
  throw_error(QLFT_ERR_UNSUPPORTED, "backend %s has no GeGLU (Gemma)", name());
}
void Backend::attention_decode_capped(const HeadGeometry& g, int window, float scale, float softcap,
                                      int past, CMatF q, const float* k_cache, const float* v_cache,
                                      MatF out) {
  if (scale > 0 || softcap > 0)
    throw_error(QLFT_ERR_UNSUPPORTED,
                "backend %s has no decode attention with Gemma's score scale and soft-cap", name());
  attention_decode(g, window, past, q, k_cache, v_cache, out);
}
void Backend::softcap(MatF, float) {
  throw_error(QLFT_ERR_UNSUPPORTED, "backend %s has no logit soft-capping (Gemma 2)", name());
}
double Backend::linear_cross_entropy_capped(const QWeight&, CMatF, const int32_t*, int32_t, float,
                                            float, MatF, int64_t*) {
  throw_error(QLFT_ERR_UNSUPPORTED,
              "backend %s has no cross-entropy of soft-capped logits (Gemma 2)", name());
}

double cross_entropy_finish(const CrossEntropyRow* st, const int32_t* targets, int64_t rows,
                            int32_t ignore_index, float* lse, int64_t* count) {
  double loss = 0;
  int64_t n = 0;
  for (int64_t i = 0; i < rows; ++i) {  // in row order: the sum does not depend on threads
    if (targets[i] == ignore_index) continue;
    const double lse_d = double(st[i].sm.m) + std::log(st[i].sm.s);
    lse[i] = float(lse_d);
    loss += lse_d - double(st[i].target_logit);
    ++n;
  }
  if (count) *count = n;
  return loss;
}

// The mixture-of-experts row ops (model/moe.cpp), over rows in parallel.
void Backend::gather_rows(CMatF x, const int32_t* rows, const float* scale, MatF out) {
  QLFT_PROFILE_SCOPE("gather_rows");
  op_checks::gather_rows(x, out.as_const());
  op_checks::row_indices(rows, out.rows, x.rows, "gather_rows", "rows");
  const int64_t n = out.rows, C = x.cols;
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static) if (n * C > kChunk)
  for (int64_t i = 0; i < n; ++i) {
    const float* a = x.row(rows[i]);
    float* o = out.row(i);
    if (scale) {
      const float s = scale[i];
      for (int64_t c = 0; c < C; ++c) o[c] = s * a[c];
    } else {
      std::memcpy(o, a, size_t(C) * sizeof(float));
    }
  }
}

void Backend::combine_rows(CMatF src, const int32_t* pos, const float* w, int k, MatF out,
                           bool accumulate) {
  QLFT_PROFILE_SCOPE("combine_rows");
  op_checks::combine_rows(src, k, out.as_const());
  op_checks::row_indices(pos, out.rows * k, src.rows, "combine_rows", "pos");
  const int64_t n = out.rows, C = out.cols;
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static) if (n * C > kChunk)
  for (int64_t r = 0; r < n; ++r) {
    float* o = out.row(r);
    for (int64_t c = 0; c < C; ++c) {
      double a = accumulate ? double(o[c]) : 0.0;
      for (int j = 0; j < k; ++j)
        a += double(w ? w[r * k + j] : 1.f) * double(src.row(pos[r * k + j])[c]);
      o[c] = static_cast<float>(a);
    }
  }
}

void Backend::row_dots(CMatF a, const int32_t* rows, CMatF b, float* out) {
  QLFT_PROFILE_SCOPE("row_dots");
  op_checks::row_dots(a, b);
  op_checks::row_indices(rows, b.rows, a.rows, "row_dots", "rows");
  if (!rows)
    QLFT_CHECK_ARG(b.rows <= a.rows, "row_dots: b has %lld rows, a only %lld", (long long)b.rows,
                   (long long)a.rows);
  const int64_t n = b.rows, C = b.cols;
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static) if (n * C > kChunk)
  for (int64_t i = 0; i < n; ++i) {
    const float* x = a.row(rows ? rows[i] : i);
    const float* y = b.row(i);
    double d = 0;
    for (int64_t c = 0; c < C; ++c) d += double(x[c]) * double(y[c]);
    out[i] = static_cast<float>(d);
  }
}

}  // namespace qlft
