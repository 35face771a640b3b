#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cstdlib>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/f32_blas.h"
#include "backend/op_checks.h"
#include "backend/cpu/gemm_bf16.h"
#include "core/error.h"
#include "core/profile.h"
#include "core/threads.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace qlft {

std::unique_ptr<Backend> make_cpu_backend(MemoryTracker* tracker, const BackendSpec& spec) {
  auto be = std::make_unique<cpu::CpuBackend>(tracker, spec);
  be->tune = cpu::tuning_from_env();
  return be;
}

namespace cpu {

CpuTuning tuning_from_env() {
  CpuTuning t;
  if (const char* spec = std::getenv("QLFT_CPU_TUNE"); spec && *spec) apply_tuning_env(t, spec);
  return t;
}

int64_t panel_rows(const CpuBackend& be, const QWeight& W) {
  int64_t p = be.tune.panel_bytes / std::max<int64_t>(1, W.cols * 4);
  p = std::clamp<int64_t>(p, std::max<int64_t>(1, be.tune.panel_min_rows),
                          std::max<int64_t>(1, be.tune.panel_max_rows));
  return std::min<int64_t>(p, std::max<int64_t>(W.rows, 1));
}

namespace {

// Runs f(a, b) over [0, n) split into one contiguous piece per thread (at least 8 rows each, so
// per-call overhead stays small); the first exception is carried out of the parallel region.
template <class F>
void split_rows(int64_t n, F&& f) {
  const int nt = qlft::num_threads();
  int64_t pieces = std::min<int64_t>(nt, std::max<int64_t>(1, n / 8));
  if (pieces <= 1) {
    f(int64_t(0), n);
    return;
  }
  int64_t per = (n + pieces - 1) / pieces;
  TaskErrors errs;
#pragma omp parallel for num_threads(pieces) schedule(static, 1)
  for (int64_t i = 0; i < pieces; ++i) {
    int64_t a = i * per, b = std::min(n, a + per);
    if (a < b) errs.run([&] { f(a, b); });
  }
  errs.rethrow();
}

}  // namespace

void dequant_panel(const CpuBackend& be, const QWeight& W, int64_t r0, int64_t n, float* out,
                   const LoraRef* merged) {
  QLFT_PROFILE_SCOPE("dequant");
  const int64_t K = W.cols;
  split_rows(n, [&](int64_t a, int64_t b) {
    float* o = out + a * K;
    W.dequantize_rows(r0 + a, b - a, o);
    if (!merged) return;
    const int r = merged->r;  // (inside the region's task sgemm runs on this thread alone)
    sgemm(be, false, false, b - a, K, r, merged->scale, merged->B + (r0 + a) * r, r, merged->A, K,
          1.f, o, K);
  });
}

// ---- scratch -----------------------------------------------------------------------------------

ScratchLease& ScratchLease::operator=(ScratchLease&& o) noexcept {
  if (this != &o) {
    release();
    own_ = std::move(o.own_);
    p_ = o.p_;
    busy_ = o.busy_;
    o.p_ = nullptr;
    o.busy_ = nullptr;
  }
  return *this;
}

void ScratchLease::release() {
  if (busy_) busy_->store(false, std::memory_order_release);
  busy_ = nullptr;
  own_.reset();
  p_ = nullptr;
}

ScratchLease CpuBackend::scratch(Scratch s, size_t bytes, const char* what) const {
  ScratchLease l;
  const size_t i = size_t(s);
  if (bytes == 0) return l;
  // Scratch::Count, a slot already leased (a nested or concurrent use) or reuse off: a Buffer of
  // its own.
  if (s == Scratch::Count || !tune.reuse_scratch ||
      busy_[i].exchange(true, std::memory_order_acquire)) {
    l.own_ = scratch_buffer(bytes, what);
    l.p_ = l.own_.data();
    return l;
  }
  l.busy_ = &busy_[i];  // released by l, also if the allocation below throws
  if (slots_[i].size() < bytes) {
    slots_[i].reset();  // the old one is not counted twice
    slots_[i] = scratch_buffer(bytes, what);
  }
  l.p_ = slots_[i].data();
  return l;
}

void CpuBackend::release_scratch() {
  for (size_t i = 0; i < slots_.size(); ++i)
    if (!busy_[i].load(std::memory_order_acquire)) slots_[i].reset();
}

// ---- precision bf16 -------------------------------------------------------------------------

void CpuBackend::set_precision(DType t) {
  QLFT_CHECK_ARG(t == DType::F32 || t == DType::BF16,
                 "cpu backend: compute precision must be F32 or BF16, got %s", dtype_name(t));
  precision_ = t;
}

bool CpuBackend::bf16_onednn() const {
  return tune.bf16_gemm == CpuTuning::Bf16Gemm::OneDnn ||
         (tune.bf16_gemm == CpuTuning::Bf16Gemm::Auto && gemm_bf16_native());
}

size_t lp_bytes(const CpuBackend& be) {
  return be.bf16_onednn() ? 2 : 4;
}

namespace {

// Elements from which a conversion into an lp matrix runs on every thread: below it (the LoRA
// A and B, r-column intermediates) waking a passive OpenMP worker costs more than it saves.
constexpr int64_t kParallelConvert = int64_t(1) << 16;

// x rounded to bf16 into m.buf (m's shape, row stride and element kind already set), columns
// past x's zeroed; rows split across threads.
void fill_lp(CMatF x, LpMat& m) {
  QLFT_PROFILE_SCOPE("round_bf16");
  const int64_t C = x.cols, ld = m.ld;
  const int nt = x.rows * C >= kParallelConvert ? qlft::num_threads() : 1;
  if (m.bf16) {
    uint16_t* d = m.buf.as<uint16_t>();
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < x.rows; ++i) {
      f32_to_bf16_n(x.row(i), d + i * ld, size_t(C));
      std::fill(d + i * ld + C, d + (i + 1) * ld, uint16_t(0));
    }
  } else {
    float* d = m.buf.as<float>();
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < x.rows; ++i) {
      round_through_n(DType::BF16, x.row(i), d + i * ld, size_t(C));
      std::fill(d + i * ld + C, d + (i + 1) * ld, 0.f);
    }
  }
}

}  // namespace

LpMat to_lp(const CpuBackend& be, CMatF x, Scratch slot, const char* what, int64_t extra) {
  LpMat m;
  m.rows = x.rows;
  m.cols = x.cols;
  m.ld = x.cols + extra;
  m.bf16 = be.bf16_onednn();
  m.buf = be.scratch(slot, size_t(x.rows * m.ld) * lp_bytes(be), what);
  fill_lp(x, m);
  return m;
}

int64_t panel_rows_lp(const CpuBackend& be, const QWeight& W) {
  const int64_t eb = int64_t(lp_bytes(be));
  int64_t p = be.tune.panel_bytes / std::max<int64_t>(1, W.cols * eb);
  // The row bounds scale with the element size too: a bf16 panel of 2x the rows is the same
  // number of bytes as the fp32 one.
  const int64_t lo = std::max<int64_t>(1, be.tune.panel_min_rows);
  const int64_t hi = std::max<int64_t>(1, be.tune.panel_max_rows * (4 / eb));
  p = std::clamp<int64_t>(p, lo, std::max(lo, hi));
  return std::min<int64_t>(p, std::max<int64_t>(W.rows, 1));
}

void dequant_panel_lp(const CpuBackend& be, const QWeight& W, int64_t r0, int64_t n, void* out,
                      int64_t ld) {
  QLFT_PROFILE_SCOPE("dequant");
  const int64_t K = W.cols;
  if (ld == 0) ld = K;
  // Dense rows: a chunk of rows per call; a wider stride: a row per call.
  const int64_t per = ld == K ? 0 : 1;
  auto rows = [&](int64_t a, int64_t b, auto&& one) {
    if (per == 0) return one(a, b - a);
    for (int64_t i = a; i < b; ++i) one(i, 1);
  };
  if (be.bf16_onednn()) {
    uint16_t* o = static_cast<uint16_t*>(out);
    split_rows(n, [&](int64_t a, int64_t b) {
      rows(a, b, [&](int64_t i, int64_t k) { W.dequantize_rows_bf16(r0 + i, k, o + i * ld); });
    });
  } else {
    float* o = static_cast<float*>(out);
    split_rows(n, [&](int64_t a, int64_t b) {
      rows(a, b, [&](int64_t i, int64_t k) {
        float* p = o + i * ld;
        W.dequantize_rows(r0 + i, k, p);
        round_through_n(DType::BF16, p, p, size_t(k * K));
      });
    });
  }
}

void CpuBackend::begin_shared_input(CMatF x) {
  shared_ = SharedInput();
  shared_.x = x;
  shared_.held = true;
}

void CpuBackend::begin_shared_input_16(CMatF x, DType t, const uint16_t* x16) {
  begin_shared_input(x);
  if (takes_input_16(t)) shared_.x16 = x16;
}

void CpuBackend::end_shared_input() {
  shared_ = SharedInput();
}

LpMat CpuBackend::lp_from_16(const uint16_t* x16, int64_t rows, int64_t cols, Scratch slot,
                             const char* what, int64_t extra, int64_t src_ld) const {
  QLFT_PROFILE_SCOPE("lp_from_16");
  LpMat m;
  m.rows = rows;
  m.cols = cols;
  m.ld = cols + extra;
  m.bf16 = bf16_onednn();
  const int64_t sld = src_ld ? src_ld : cols;
  if (m.bf16 && extra == 0) {  // the values as they are
    m.view = x16;
    m.ld = sld;
    return m;
  }
  m.buf = scratch(slot, size_t(rows * m.ld) * lp_bytes(*this), what);
  const int64_t ld = m.ld;
  const int nt = rows * cols >= kParallelConvert ? qlft::num_threads() : 1;
  if (m.bf16) {
    uint16_t* d = m.buf.as<uint16_t>();
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      std::copy_n(x16 + i * sld, cols, d + i * ld);
      std::fill(d + i * ld + cols, d + (i + 1) * ld, uint16_t(0));
    }
  } else {  // sgemm's operands: the bf16 values widened (exact)
    float* d = m.buf.as<float>();
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      bf16_to_f32_n(x16 + i * sld, d + i * ld, size_t(cols));
      std::fill(d + i * ld + cols, d + (i + 1) * ld, 0.f);
    }
  }
  return m;
}

const LpMat& CpuBackend::input_lp(CMatF x, Scratch slot, const char* what, LpMat& own,
                                  int64_t extra) const {
  const CMatF& s = shared_.x;
  const bool same = shared_.held && x.data == s.data && x.rows == s.rows && x.cols == s.cols &&
                    x.stride == s.stride;
  const bool made = shared_.lp.data() != nullptr;
  if (!same || (made && shared_.lp.ld != x.cols + extra)) {
    // x's fp32 values may be unwritten where the scope has its bf16 copy.
    own = same && shared_.x16 ? lp_from_16(shared_.x16, x.rows, x.cols, slot, what, extra)
                              : to_lp(*this, x, slot, what, extra);
    return own;
  }
  if (!made)
    shared_.lp = shared_.x16 ? lp_from_16(shared_.x16, x.rows, x.cols, Scratch::Count,
                                          "bf16 shared linear input", extra)
                             : to_lp(*this, x, Scratch::Count, "bf16 shared linear input", extra);
  return shared_.lp;
}

Operand OpGemm::operand(CMatF m, Scratch slot, const char* what) const {
  Operand o;
  if (!lp) {
    o.p = m.data;
    o.ld = m.stride;
    return o;
  }
  LpMat l = to_lp(be, m, slot, what);
  o.buf = std::move(l.buf);
  o.p = o.buf.data();
  o.ld = m.cols;
  return o;
}

Operand OpGemm::borrow(const LpMat& l) const {
  Operand o;
  o.p = l.data();
  o.ld = l.ld;
  return o;
}

void OpGemm::convert(const float* src, void* dst, size_t n) const {
  if (!lp)
    std::copy(src, src + n, static_cast<float*>(dst));
  else if (be.bf16_onednn())
    f32_to_bf16_n(src, static_cast<uint16_t*>(dst), n);
  else
    round_through_n(DType::BF16, src, static_cast<float*>(dst), n);
}

void OpGemm::gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
                  int64_t lda, const void* B, int64_t ldb, float beta, float* C,
                  int64_t ldc) const {
  if (lp)
    gemm_lp(be, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    sgemm(be, ta, tb, M, N, K, alpha, static_cast<const float*>(A), lda,
          static_cast<const float*>(B), ldb, beta, C, ldc);
}

void OpGemm::gemm_an(bool onednn, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                     const void* A, int64_t lda, const void* B, int64_t ldb, float beta, float* C,
                     int64_t ldc) const {
  if (!onednn || M <= 0 || N <= 0 || K <= 0) {
    gemm(false, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  gemm_f32_onednn(false, tb, M, N, K, alpha, static_cast<const float*>(A), lda,
                  static_cast<const float*>(B), ldb, beta, C, ldc, be.tracker());
}

void OpGemm::gemm_thin(bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
                       int64_t lda, const void* B, int64_t ldb, float beta, float* C,
                       int64_t ldc) const {
  gemm_an(thin_onednn(), tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void OpGemm::gemm_tile(bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
                       int64_t lda, const void* B, int64_t ldb, float beta, float* C,
                       int64_t ldc) const {
  gemm_an(tile_onednn(), tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void OpGemm::gemm_grad(int64_t M, int64_t N, int64_t K, float alpha, const void* A, int64_t lda,
                       const void* B, int64_t ldb, float beta, float* C, int64_t ldc) const {
  if (!thin_onednn() || M <= 0 || N <= 0 || K <= 0) {
    gemm(true, false, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  gemm_f32_onednn(true, false, M, N, K, alpha, static_cast<const float*>(A), lda,
                  static_cast<const float*>(B), ldb, beta, C, ldc, be.tracker());
}

void gemm_lp(const CpuBackend& be, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
             float alpha, const void* A, int64_t lda, const void* B, int64_t ldb, float beta,
             float* C, int64_t ldc) {
  if (be.bf16_onednn()) {
    const size_t pad =
        gemm_bf16_scratchpad_size(trans_a, trans_b, M, N, K, lda, ldb, ldc, alpha, beta);
    ScratchLease sp = be.scratch(Scratch::GemmPad, pad, "oneDNN matmul scratchpad");
    gemm_bf16(trans_a, trans_b, M, N, K, alpha, static_cast<const uint16_t*>(A), lda,
              static_cast<const uint16_t*>(B), ldb, beta, C, ldc, be.tracker(), sp.data());
  } else
    gemm_f32(be, trans_a, trans_b, M, N, K, alpha, static_cast<const float*>(A), lda,
             static_cast<const float*>(B), ldb, beta, C, ldc);
}

void gemm_lp_out16(const CpuBackend& be, bool trans_a, bool trans_b, int64_t M, int64_t N,
                   int64_t K, float alpha, const void* A, int64_t lda, const void* B, int64_t ldb,
                   uint16_t* C, int64_t ldc) {
  QLFT_CHECK_ARG(be.bf16_onednn(), "gemm_lp_out16: bf16 GEMMs on oneDNN only");
  const size_t pad =
      gemm_bf16_out16_scratchpad_size(trans_a, trans_b, M, N, K, lda, ldb, ldc, alpha);
  ScratchLease sp = be.scratch(Scratch::GemmPad, pad, "oneDNN matmul scratchpad");
  gemm_bf16_out16(trans_a, trans_b, M, N, K, alpha, static_cast<const uint16_t*>(A), lda,
                  static_cast<const uint16_t*>(B), ldb, C, ldc, be.tracker(), sp.data());
}

void gemm_f32(const CpuBackend& be, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
              float alpha, const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
              float* C, int64_t ldc) {
  if (!be.tune.f32_xwt_onednn || trans_a || !trans_b || M <= 0 || N <= 0 || K <= 0) {
    sgemm(be, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const size_t pad =
      gemm_f32_onednn_scratchpad_size(trans_a, trans_b, M, N, K, lda, ldb, ldc, alpha, beta);
  ScratchLease sp = be.scratch(Scratch::GemmPad, pad, "oneDNN matmul scratchpad");
  gemm_f32_onednn(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, be.tracker(),
                  sp.data());
}

void sgemm(const CpuBackend& be, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
           float alpha, const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
           float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  QLFT_PROFILE_SCOPE("gemm.sgemm");
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
  const bool onednn = be.tune.f32_blas == CpuTuning::F32Blas::OneDnn ||
                      (be.tune.f32_blas == CpuTuning::F32Blas::Auto && f32_blas_onednn_auto());
  // One sequential GEMM of C's block [m, n) from op(A)'s rows / op(B)'s columns at A, B.
  auto block = [&](int64_t m, int64_t n, const float* a, const float* b, float* c) {
    if (onednn)
      sgemm_onednn(trans_a, trans_b, m, n, K, alpha, a, lda, b, ldb, beta, c, ldc);
    else
      cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                  trans_b ? CblasTrans : CblasNoTrans, int(m), int(n), int(K), alpha, a, int(lda),
                  b, int(ldb), beta, c, int(ldc));
  };
  // Threads: the runtime's count, per call, without touching OpenBLAS's process-wide count. The
  // OpenMP build of OpenBLAS (Debian's libopenblas0-openmp) takes its team size from the caller's
  // omp_get_max_threads() and, when that differs from its global blas_cpu_number, rewrites the
  // global (goto_set_num_threads): racy between runtimes and visible to the host program. It runs
  // on one thread, touching nothing, when the caller's ICV is 1 or when called inside an active
  // OpenMP region (common_thread.h num_cpu_avail). So one thread: ICV 1 for the call; several: our
  // own team, each thread one contiguous block of C's rows or columns as its own sequential sgemm.
  // dnnl_sgemm runs the same way (its team is the caller's ICV, one thread inside a region).
  const int nt = call_threads();
  const int64_t D = N >= M ? N : M;  // the dimension split between threads
  constexpr int64_t kAlign = 16;     // a block is a multiple of the kernels' register tile
  const int64_t pieces = std::min<int64_t>(nt, D / kAlign);
  if (pieces <= 1 || M * N * K < (int64_t(1) << 18)) {  // small: threads would cost more
    OmpIcvScope one(1);
    block(M, N, A, B, C);
    return;
  }
  const bool by_n = N >= M;
  const int64_t per = ((D + pieces - 1) / pieces + kAlign - 1) / kAlign * kAlign;
  TaskErrors errs;
#pragma omp parallel for num_threads(int(pieces)) schedule(static, 1)
  for (int64_t p = 0; p < pieces; ++p) {
    const int64_t a = p * per, b = std::min(D, a + per);
    if (a >= b) continue;
    errs.run([&] {
      OmpIcvScope one(1);  // sequential also if the team came out smaller than asked
      if (by_n)            // columns [a, b) of op(B) and C
        block(M, b - a, A, trans_b ? B + a * ldb : B + a, C + a);
      else  // rows [a, b) of op(A) and C
        block(b - a, N, trans_a ? A + a : A + a * lda, B, C + a * ldc);
    });
  }
  errs.rethrow();
}

void matmul_xwt(const CpuBackend& be, const QWeight& W, CMatF x, MatF y, const char* what,
                const LoraRef* merged) {
  op_checks::linear(W, x, y.as_const(), what);
  if (x.rows == 0 || W.rows == 0) return;
  if (be.precision() == DType::BF16) {
    QLFT_CHECK_ARG(!merged, "matmul_xwt: a merged LoRA is for fp32 only");
    matmul_xwt_lp(be, W, to_lp(be, x, Scratch::In, "bf16 activations"), y);
    return;
  }
  const int64_t P = panel_rows(be, W), K = W.cols;
  ScratchLease panel = be.scratch(Scratch::Panel, size_t(P * K) * 4, "weight panel");
  float* pw = panel.as<float>();
  for (int64_t p0 = 0; p0 < W.rows; p0 += P) {
    int64_t n = std::min(P, W.rows - p0);
    dequant_panel(be, W, p0, n, pw, merged);
    gemm_f32(be, false, true, x.rows, n, K, 1.f, x.data, x.stride, pw, K, 0.f, y.data + p0,
             y.stride);
  }
}

void matmul_xwt_lp(const CpuBackend& be, const QWeight& W, const LpMat& xl, MatF y) {
  if (xl.rows == 0 || W.rows == 0) return;
  const int64_t P = panel_rows_lp(be, W), K = W.cols;
  ScratchLease panel =
      be.scratch(Scratch::Panel, size_t(P * K) * lp_bytes(be), "bf16 weight panel");
  for (int64_t p0 = 0; p0 < W.rows; p0 += P) {
    int64_t n = std::min(P, W.rows - p0);
    dequant_panel_lp(be, W, p0, n, panel.data());
    gemm_lp(be, false, true, xl.rows, n, K, 1.f, xl.data(), xl.ld, panel.data(), K, 0.f,
            y.data + p0, y.stride);
  }
}

}  // namespace cpu
}  // namespace qlft
