// Token embedding lookup and the fused linear + cross-entropy head.
//
// The loss never materializes [rows, vocab]: rows whose target counts are gathered into chunks,
// and for each chunk the head (or a slice of it: cross_entropy_stats / _grad) is walked in
// panels of vocab rows. Pass 1 keeps an online log-sum-exp per row; pass 2 (only when dh is
// wanted) recomputes each logits panel, turns it into (softmax - onehot) * grad_scale and
// accumulates its product with the panel into dh.
// With dh the head is walked once instead (ce_row_one_pass, cross_entropy_walk): the recomputed
// logits GEMM was a third of the head's GEMM work and the head a fifth of a small model's step.
// Precision bf16 rounds both GEMMs' operands (h, head panels, dlogits) to bf16; in the one walk
// the dlogits operand is exp(logit - shift ln 2), rounded, and the row's ce_acc_factor and the
// target row (rounded as the panels are) are applied in fp32 at the end, so only the
// exponentials are rounded (torch rounds softmax - onehot: within one bf16 step of each other).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/op_checks.h"
#include "backend/cpu/vec_kernels.h"
#include "backend/cpu/vec_math.h"
#include "backend/softmax_math.h"
#include "core/error.h"
#include "core/profile.h"
#include "core/threads.h"

namespace qlft::cpu {

void CpuBackend::embedding_fwd(const QWeight& emb, const int32_t* tokens, MatF out) {
  QLFT_PROFILE_SCOPE("embedding_fwd");
  op_checks::embedding(emb, out.as_const());
  op_checks::token_ids(tokens, out.rows, emb.rows);
  TaskErrors errs;
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
  for (int64_t i = 0; i < out.rows; ++i)
    errs.run([&] { emb.dequantize_rows(tokens[i], 1, out.row(i)); });
  errs.rethrow();
}

namespace {

void scale_row(float* x, int64_t n, float s) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) x[j] *= s;
}

// One logits row l (n entries of the panel starting at vocab row p0) of the one-pass walk: the
// same statistics as pass 1 (so the loss is the one without dh, bit for bit), and l replaced by
// E = exp(l - row.shift ln 2), the shift the row's dh accumulator (acc, H floats) shares
// (ce_acc_shift of the running max): when this panel raises it, acc is rescaled by the power of
// two between the shifts (unless still unset: the row's first finite panel).
void ce_row_one_pass(float* l, int64_t n, int64_t p0, int64_t target, CrossEntropyRow& row,
                     float* acc, int64_t H) {
  OnlineSoftmax<double>& st = row.sm;
  if (target >= p0 && target < p0 + n) row.target_logit = l[target - p0];
  const float m = vec_kernels().max_of(l, n);
  if (m == -INFINITY) {  // nothing to add (exp would give NaN): as online_softmax_merge skips it
    std::fill(l, l + n, 0.f);
    return;
  }
  online_softmax_merge(st, m, vec_kernels().exp_sum_shifted(l, n, m));
  const int32_t k = ce_acc_shift(st.m);
  if (row.shift == INT32_MIN) {
    row.shift = k;
  } else if (k > row.shift) {
    scale_row(acc, H, std::ldexp(1.f, row.shift - k));
    row.shift = k;
  }
  scale_row(l, n, float(std::exp(double(m) - ce_shift_value(row.shift))));
}

// Row r of the head into w (head.cols floats), rounded to bf16 where the panels are (lp).
void target_row(const QWeight& head, int64_t r, bool lp, float* w) {
  head.dequantize_rows(r, 1, w);
  if (lp) round_through_n(DType::BF16, w, w, size_t(head.cols));
}

// dh row += grad_scale (acc / sum - head[target]) for each of the chunk's rc rows, acc being the
// row's sum of E panel over the whole head (ce_row_one_pass), so acc / sum = softmax head.
void ce_dh_one_pass(const QWeight& head, bool lp, const int64_t* rows, int64_t rc,
                    const int32_t* targets, const CrossEntropyRow* st, const float* acc,
                    float grad_scale, MatF dh) {
  const int64_t H = head.cols;
  TaskErrors errs;
#pragma omp parallel num_threads(qlft::num_threads())
  {
    std::vector<float> wt(static_cast<size_t>(H));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rc; ++i)
      errs.run([&] {
        target_row(head, targets[rows[i]], lp, wt.data());
        const float a = ce_acc_factor(st[rows[i]], grad_scale);
        float* d = dh.row(rows[i]);
        const float* g = acc + i * H;
#pragma omp simd
        for (int64_t c = 0; c < H; ++c) d[c] += a * g[c] - grad_scale * wt[size_t(c)];
      });
  }
  errs.rethrow();
}

// Which dh accumulators a walk uses: none (the loss only), the caller's, or the tiles' own chunk.
enum class DhAcc { None, Caller, Own };

// What both passes over one slice of the head share: the rows whose target counts, the chunk of
// them the logits tile holds, the head in panels of P rows, and the GEMM of one logits tile.
// Precision bf16: h rows, head panels and dlogits rounded to bf16 (lp operands, eb bytes each);
// logits, softmax statistics and dh stay fp32.
class CeTiles {
 public:
  CeTiles(CpuBackend& be, const QWeight& slice, CMatF h, const int32_t* targets,
          int32_t ignore_index, DhAcc dh_acc)
      : be_(be), head_(slice), h_(h) {
    const int64_t M = h.rows, H = slice.cols;
    for (int64_t i = 0; i < M; ++i)
      if (targets[i] != ignore_index) valid.push_back(i);
    lp = be.precision() == DType::BF16;
    eb = lp ? int64_t(lp_bytes(be)) : 4;
    lp16 = lp && eb == 2;  // lp operands are bf16 bit patterns (oneDNN)
    P = lp ? panel_rows_lp(be, slice) : panel_rows(be, slice);
    // Rows per chunk: bounded by the logits tile and the gathered hidden rows.
    Rc = std::min(be.tune.ce_logits_bytes / (P * 4),
                  be.tune.ce_hidden_bytes / std::max<int64_t>(1, H * 4));
    Rc = std::clamp<int64_t>(Rc, 1, std::max<int64_t>(1, int64_t(valid.size())));
    if (valid.empty() || slice.rows == 0) return;
    panel_ = be.scratch(Scratch::Panel, size_t(P * H * eb), "cross-entropy head panel");
    logit_ = be.workspace(size_t(Rc * P) * 4, "cross-entropy logits chunk");
    hc_ = be.workspace(size_t(Rc * H * eb), "cross-entropy hidden rows");
    if (dh_acc != DhAcc::None && lp16)
      logit16_ = be.workspace(size_t(Rc * P) * 2, "cross-entropy bf16 dlogits");
    if (dh_acc == DhAcc::Own) dhc_ = be.workspace(size_t(Rc * H) * 4, "cross-entropy hidden grads");
  }

  std::vector<int64_t> valid;  // rows of h whose target counts
  bool lp = false, lp16 = false;
  int64_t eb = 4, P = 1, Rc = 1;

  float* L() { return logit_.as<float>(); }
  // Precision bf16: the dlogits row l (row i of the tile) rounded as the dh GEMM's operand.
  void round_dlogits(float* l, int64_t i, int64_t n) {
    if (lp16)
      f32_to_bf16_n(l, L16() + i * n, size_t(n));
    else if (lp)
      round_through_n(DType::BF16, l, l, size_t(n));
  }
  float* dhc() { return dhc_.as<float>(); }
  uint16_t* L16() { return logit16_.as<uint16_t>(); }

  // Gathers rows valid[c0 .. c0 + rc) of h into the chunk (rounded for lp).
  void load_rows(int64_t c0, int64_t rc) {
    const int64_t H = head_.cols;
    const int64_t* rows = valid.data() + c0;
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
    for (int64_t i = 0; i < rc; ++i) {
      if (!lp)
        std::copy(h_.row(rows[i]), h_.row(rows[i]) + H, hc_.as<float>() + i * H);
      else if (lp16)
        f32_to_bf16_n(h_.row(rows[i]), hc_.as<uint16_t>() + i * H, size_t(H));
      else
        round_through_n(DType::BF16, h_.row(rows[i]), hc_.as<float>() + i * H, size_t(H));
    }
  }
  // L = chunk rows x panel rows [p0, p0 + n) of the slice, transposed (rc x n).
  void logits(int64_t rc, int64_t p0, int64_t n) {
    const int64_t H = head_.cols;
    if (lp) {
      dequant_panel_lp(be_, head_, p0, n, panel_.data());
      gemm_lp(be_, false, true, rc, n, H, 1.f, hc_.data(), H, panel_.data(), H, 0.f, L(), n);
    } else {
      dequant_panel(be_, head_, p0, n, panel_.as<float>());
      gemm_f32(be_, false, true, rc, n, H, 1.f, hc_.as<float>(), H, panel_.as<float>(), H, 0.f, L(),
               n);
    }
  }
  // out (+)= dlogits (rc x n) x panel (n x H), out dhc unless given; beta 0 for the slice's
  // first panel.
  void accumulate_dh(int64_t rc, int64_t n, float beta, float* out = nullptr) {
    const int64_t H = head_.cols;
    if (!out) out = dhc();
    if (lp)
      gemm_lp(be_, false, false, rc, H, n, 1.f, lp16 ? logit16_.data() : logit_.data(), n,
              panel_.data(), H, beta, out, H);
    else
      sgemm(be_, false, false, rc, H, n, 1.f, L(), n, panel_.as<float>(), H, beta, out, H);
  }
  // The walk both passes make: for each chunk of the counted rows (c0, rc of them: rows), its
  // hidden rows loaded, then for each panel [p0, p0 + n) of the slice its logits tile computed
  // and panel(c0, rc, rows, p0, n, L) called; after the chunk's last panel, done(c0, rc, rows).
  template <class Panel, class Done>
  void walk(const Panel& panel, const Done& done) {
    const int64_t n_valid = int64_t(valid.size()), V = head_.rows;
    if (V == 0) return;
    for (int64_t c0 = 0; c0 < n_valid; c0 += Rc) {
      const int64_t rc = std::min(Rc, n_valid - c0);
      const int64_t* rows = valid.data() + c0;
      load_rows(c0, rc);
      for (int64_t p0 = 0; p0 < V; p0 += P) {
        const int64_t n = std::min(P, V - p0);
        logits(rc, p0, n);
        panel(c0, rc, rows, p0, n, L());
      }
      done(c0, rc, rows);
    }
  }

 private:
  CpuBackend& be_;
  const QWeight& head_;
  CMatF h_;
  ScratchLease panel_;
  Buffer logit_, hc_, logit16_, dhc_;
};
}  // namespace

void CpuBackend::cross_entropy_stats(const QWeight& slice, int64_t row0, int64_t vocab, CMatF h,
                                     const int32_t* targets, int32_t ignore_index,
                                     CrossEntropyRow* st) {
  QLFT_PROFILE_SCOPE("cross_entropy_stats");
  op_checks::cross_entropy(slice, h, CMatF());
  op_checks::targets(targets, h.rows, vocab, ignore_index);
  CeTiles t(*this, slice, h, targets, ignore_index, DhAcc::None);
  t.walk(
      [&](int64_t, int64_t rc, const int64_t* rows, int64_t p0, int64_t n, float* L) {
        const float cap = ce_softcap_;
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
        for (int64_t i = 0; i < rc; ++i) {
          float* l = L + i * n;
          if (cap > 0)  // Gemma 2's final soft-cap, in place: the loss is over capped logits
            for (int64_t j = 0; j < n; ++j) l[j] = cap * std::tanh(l[j] / cap);
          const float m = vec_kernels().max_of(l, n);
          const double sum = vec_kernels().sum_exp_shifted(l, n, m);
          CrossEntropyRow& s = st[rows[i]];
          online_softmax_merge(s.sm, m, sum);
          const int64_t tg = targets[rows[i]] - row0;
          if (tg >= p0 && tg < p0 + n) s.target_logit = l[tg - p0];
        }
      },
      [](int64_t, int64_t, const int64_t*) {});
}

void CpuBackend::cross_entropy_grad(const QWeight& slice, int64_t row0, int64_t vocab, CMatF h,
                                    const int32_t* targets, int32_t ignore_index, const float* lse,
                                    float grad_scale, MatF dh) {
  QLFT_PROFILE_SCOPE("cross_entropy_grad");
  op_checks::cross_entropy(slice, h, dh.as_const());
  op_checks::targets(targets, h.rows, vocab, ignore_index);
  CeTiles t(*this, slice, h, targets, ignore_index, DhAcc::Own);
  const int64_t H = slice.cols;
  const float cap = ce_softcap_;
  // dh_chunk = sum over panels of ((softmax - onehot) * grad_scale) panel.
  t.walk(
      [&](int64_t, int64_t rc, const int64_t* rows, int64_t p0, int64_t n, float* L) {
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
        for (int64_t i = 0; i < rc; ++i) {
          float* l = L + i * n;
          const int64_t tg = targets[rows[i]] - row0;
          if (cap > 0) {  // d/dz of cap tanh(z / cap) is 1 - tanh^2
            const float m = lse[rows[i]];
            for (int64_t j = 0; j < n; ++j) {
              const float th = std::tanh(l[j] / cap);
              float d = std::exp(cap * th - m) * grad_scale;
              if (j == tg - p0) d -= grad_scale;
              l[j] = d * (1.f - th * th);
            }
          } else {
            vec_kernels().exp_shifted(l, n, lse[rows[i]], grad_scale);
            if (tg >= p0 && tg < p0 + n) l[tg - p0] -= grad_scale;
          }
          t.round_dlogits(l, i, n);
        }
        t.accumulate_dh(rc, n, p0 == 0 ? 0.f : 1.f);
      },
      [&](int64_t, int64_t rc, const int64_t* rows) {
        const float* g = t.dhc();
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
        for (int64_t i = 0; i < rc; ++i) {
          float* d = dh.row(rows[i]);
          for (int64_t c = 0; c < H; ++c) d[c] += g[i * H + c];
        }
      });
}

void CpuBackend::cross_entropy_one_walk(const QWeight& head, CMatF h, const int32_t* targets,
                                        int32_t ignore_index, float grad_scale, MatF dh,
                                        CrossEntropyRow* st) {
  CeTiles t(*this, head, h, targets, ignore_index, DhAcc::Own);
  const int64_t H = head.cols;
  // dh_chunk = grad_scale (sum over panels of E panel) / sum - grad_scale head[target].
  t.walk(
      [&](int64_t, int64_t rc, const int64_t* rows, int64_t p0, int64_t n, float* L) {
        float* acc = t.dhc();
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
        for (int64_t i = 0; i < rc; ++i) {
          ce_row_one_pass(L + i * n, n, p0, targets[rows[i]], st[rows[i]], acc + i * H, H);
          t.round_dlogits(L + i * n, i, n);
        }
        t.accumulate_dh(rc, n, p0 == 0 ? 0.f : 1.f);
      },
      [&](int64_t, int64_t rc, const int64_t* rows) {
        ce_dh_one_pass(head, t.lp, rows, rc, targets, st, t.dhc(), grad_scale, dh);
      });
}

void CpuBackend::cross_entropy_walk(const QWeight& slice, int64_t row0, int64_t vocab, CMatF h,
                                    const int32_t* targets, int32_t ignore_index, float grad_scale,
                                    CrossEntropyRow* st, float* acc, MatF dh) {
  QLFT_PROFILE_SCOPE("cross_entropy_walk");
  op_checks::cross_entropy(slice, h, dh.as_const());
  op_checks::targets(targets, h.rows, vocab, ignore_index);
  CeTiles t(*this, slice, h, targets, ignore_index, DhAcc::Caller);
  const int64_t n_valid = int64_t(t.valid.size()), V = slice.rows, H = slice.cols;
  if (n_valid == 0 || V == 0) return;
  t.walk(
      [&](int64_t c0, int64_t rc, const int64_t* rows, int64_t p0, int64_t n, float* L) {
        float* a = acc + c0 * H;  // the chunk's rows, in counted-row order
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
        for (int64_t i = 0; i < rc; ++i) {
          ce_row_one_pass(L + i * n, n, row0 + p0, targets[rows[i]], st[rows[i]], a + i * H, H);
          t.round_dlogits(L + i * n, i, n);
        }
        t.accumulate_dh(rc, n, 1.f, a);
      },
      [](int64_t, int64_t, const int64_t*) {});
  // - grad_scale head[target] for the targets in this slice.
  TaskErrors errs;
#pragma omp parallel num_threads(qlft::num_threads())
  {
    std::vector<float> wt(static_cast<size_t>(H));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n_valid; ++i) {
      const int64_t r = t.valid[size_t(i)], tg = targets[r] - row0;
      if (tg < 0 || tg >= V) continue;
      errs.run([&] {
        target_row(slice, tg, t.lp, wt.data());
        float* d = dh.row(r);
        for (int64_t c = 0; c < H; ++c) d[c] -= grad_scale * wt[size_t(c)];
      });
    }
  }
  errs.rethrow();
}

double CpuBackend::linear_cross_entropy(const QWeight& head, CMatF h, const int32_t* targets,
                                        int32_t ignore_index, float grad_scale, MatF dh,
                                        int64_t* count) {
  QLFT_PROFILE_SCOPE("linear_cross_entropy");
  return cross_entropy_loss(head, h, targets, ignore_index, grad_scale, dh, count, true);
}

double CpuBackend::cross_entropy_loss(const QWeight& head, CMatF h, const int32_t* targets,
                                      int32_t ignore_index, float grad_scale, MatF dh,
                                      int64_t* count, bool one_walk) {
  const int64_t M = h.rows, V = head.rows;
  op_checks::cross_entropy(head, h, dh.as_const());
  op_checks::targets(targets, M, V, ignore_index);
  // Per row: the pass-1 state and the log-sum-exp pass 2 reads.
  Buffer rows = workspace(size_t(M) * sizeof(CrossEntropyRow), "cross-entropy row stats");
  Buffer lse = workspace(size_t(M) * 4, "cross-entropy row lse");
  auto* st = rows.as<CrossEntropyRow>();
  std::fill(st, st + M, CrossEntropyRow{});
  if (dh.data && one_walk) {
    cross_entropy_one_walk(head, h, targets, ignore_index, grad_scale, dh, st);
    return cross_entropy_finish(st, targets, M, ignore_index, lse.as<float>(), count);
  }
  cross_entropy_stats(head, 0, V, h, targets, ignore_index, st);
  const double loss = cross_entropy_finish(st, targets, M, ignore_index, lse.as<float>(), count);
  if (dh.data && V > 0)
    cross_entropy_grad(head, 0, V, h, targets, ignore_index, lse.as<float>(), grad_scale, dh);
  return loss;
}

}  // namespace qlft::cpu
