// Token embedding lookup and the fused linear + cross-entropy head.
//
// The loss never materializes [rows, vocab]: rows whose target counts are gathered into chunks,
// and for each chunk the head is walked in panels of vocab rows. Pass 1 keeps an online
// log-sum-exp per row; pass 2 (only when dh is wanted) recomputes each logits panel, turns it
// into (softmax - onehot) * grad_scale and accumulates its product with the panel into dh.
// Precision bf16 rounds both GEMMs' operands (h, head panels, dlogits) to bf16.
// fp32 with dh walks the head once instead (ce_row_one_pass): the recomputed logits GEMM was a
// third of the head's GEMM work and the head a fifth of a small model's step.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/op_checks.h"
#include "backend/cpu/vec_kernels.h"
#include "backend/cpu/vec_math.h"
#include "backend/softmax_math.h"
#include "core/error.h"
#include "core/threads.h"

namespace qlft::cpu {

namespace {

void scale_row(float* x, int64_t n, float s) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) x[j] *= s;
}

// One logits row l (n entries of the panel starting at vocab row p0) of the one-pass walk: the
// same statistics as pass 1 (so the loss is the one without dh, bit for bit), and l replaced by
// E = exp(l - st.m), the shift the row's dh accumulator (acc, H floats) shares: when this panel
// raises the row's max, acc is rescaled to it (it is unset at p0 = 0); otherwise E is.
void ce_row_one_pass(float* l, int64_t n, int64_t p0, int64_t target, OnlineSoftmax<double>& st,
                     float& target_logit, float* acc, int64_t H) {
  if (target >= p0 && target < p0 + n) target_logit = l[target - p0];
  const float m = vec_kernels().max_of(l, n);
  if (m == -INFINITY) {  // nothing to add (exp would give NaN): as online_softmax_merge skips it
    std::fill(l, l + n, 0.f);
    return;
  }
  const float old = st.m;
  online_softmax_merge(st, m, vec_kernels().exp_sum_shifted(l, n, m));
  if (st.m > old) {
    if (p0 > 0) scale_row(acc, H, std::exp(old - st.m));
  } else if (m < st.m) {
    scale_row(l, n, std::exp(m - st.m));
  }
}

// dh row += grad_scale (acc / sum - head[target]) for each of the chunk's rc rows, acc being the
// row's sum of E panel over the whole head (ce_row_one_pass), so acc / sum = softmax head.
void ce_dh_one_pass(const QWeight& head, const int64_t* rows, int64_t rc, const int32_t* targets,
                    const OnlineSoftmax<double>* st, const float* acc, float grad_scale, MatF dh) {
  const int64_t H = head.cols;
  TaskErrors errs;
#pragma omp parallel num_threads(qlft::num_threads())
  {
    std::vector<float> wt(static_cast<size_t>(H));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rc; ++i)
      errs.run([&] {
        head.dequantize_rows(targets[rows[i]], 1, wt.data());
        const float a = float(double(grad_scale) / st[i].s);
        float* d = dh.row(rows[i]);
        const float* g = acc + i * H;
#pragma omp simd
        for (int64_t c = 0; c < H; ++c) d[c] += a * g[c] - grad_scale * wt[size_t(c)];
      });
  }
  errs.rethrow();
}

}  // namespace

void CpuBackend::embedding_fwd(const QWeight& emb, const int32_t* tokens, MatF out) {
  op_checks::embedding(emb, out.as_const());
  op_checks::token_ids(tokens, out.rows, emb.rows);
  TaskErrors errs;
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
  for (int64_t i = 0; i < out.rows; ++i)
    errs.run([&] { emb.dequantize_rows(tokens[i], 1, out.row(i)); });
  errs.rethrow();
}

double CpuBackend::linear_cross_entropy(const QWeight& head, CMatF h, const int32_t* targets,
                                        int32_t ignore_index, float grad_scale, MatF dh,
                                        int64_t* count) {
  const int64_t M = h.rows, V = head.rows, H = head.cols;
  op_checks::cross_entropy(head, h, dh.as_const());
  op_checks::targets(targets, M, V, ignore_index);
  const bool want_dh = dh.data != nullptr;
  std::vector<int64_t> valid;
  valid.reserve(size_t(M));
  for (int64_t i = 0; i < M; ++i) {
    if (targets[i] == ignore_index) continue;
    valid.push_back(i);
  }
  if (count) *count = int64_t(valid.size());
  if (valid.empty() || V == 0) return 0.0;

  // Precision bf16: h rows, head panels and dlogits rounded to bf16 (lp operands, eb bytes each);
  // logits, softmax statistics and dh stay fp32.
  const bool lp = precision_ == DType::BF16;
  const int64_t eb = lp ? int64_t(lp_bytes(*this)) : 4;
  const bool lp16 = lp && eb == 2;  // lp operands are bf16 bit patterns (oneDNN)
  // bf16 keeps two passes: its dlogits are rounded as torch rounds (softmax - onehot), which
  // needs the row's final log-sum-exp before the dh GEMM.
  const bool one_pass = !lp && want_dh;
  const int64_t P = lp ? panel_rows_lp(*this, head) : panel_rows(*this, head);
  // Rows per chunk: bounded by the logits tile and the gathered hidden rows.
  const int64_t n_valid = int64_t(valid.size());
  int64_t Rc =
      std::min(tune.ce_logits_bytes / (P * 4), tune.ce_hidden_bytes / std::max<int64_t>(1, H * 4));
  Rc = std::clamp<int64_t>(Rc, 1, n_valid);

  ScratchLease panel_buf = scratch(Scratch::Panel, size_t(P * H * eb), "cross-entropy head panel");
  Buffer logit_buf = workspace(size_t(Rc * P) * 4, "cross-entropy logits chunk");
  Buffer hc_buf = workspace(size_t(Rc * H * eb), "cross-entropy hidden rows");
  Buffer logit16_buf;  // bf16 dlogits for oneDNN (the sgemm path rounds L in place)
  if (want_dh && lp16) logit16_buf = workspace(size_t(Rc * P) * 2, "cross-entropy bf16 dlogits");
  Buffer dhc_buf;
  if (want_dh) dhc_buf = workspace(size_t(Rc * H) * 4, "cross-entropy hidden grads");
  Buffer stat_buf =
      workspace(size_t(Rc) * (sizeof(OnlineSoftmax<double>) + 8), "cross-entropy row stats");
  float* pw = panel_buf.as<float>();
  void* pl = panel_buf.data();
  float* L = logit_buf.as<float>();
  float* hc = hc_buf.as<float>();
  void* hl = hc_buf.data();
  float* dhc = dhc_buf.as<float>();
  auto* st = stat_buf.as<OnlineSoftmax<double>>();
  float* tl = reinterpret_cast<float*>(st + Rc);  // target logit per row
  float* lse = tl + Rc;

  double loss = 0;
  // The chunk's rows' log-sum-exps (lse) and their losses added in row order (the sum does not
  // depend on threads).
  auto add_chunk_loss = [&](int64_t rc) {
    for (int64_t i = 0; i < rc; ++i) {
      const double lse_d = double(st[i].m) + std::log(st[i].s);
      lse[i] = float(lse_d);
      loss += lse_d - double(tl[i]);
    }
  };
  for (int64_t c0 = 0; c0 < n_valid; c0 += Rc) {
    const int64_t rc = std::min(Rc, n_valid - c0);
    const int64_t* rows = valid.data() + c0;
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
    for (int64_t i = 0; i < rc; ++i) {
      if (!lp)
        std::copy(h.row(rows[i]), h.row(rows[i]) + H, hc + i * H);
      else if (lp16)
        f32_to_bf16_n(h.row(rows[i]), hc_buf.as<uint16_t>() + i * H, size_t(H));
      else
        round_through_n(DType::BF16, h.row(rows[i]), hc + i * H, size_t(H));
      st[i] = OnlineSoftmax<double>{};
    }
    // logits tile L = hc panel^T
    auto logits = [&](int64_t p0, int64_t n) {
      if (lp) {
        dequant_panel_lp(*this, head, p0, n, pl);
        gemm_lp(*this, false, true, rc, n, H, 1.f, hl, H, pl, H, 0.f, L, n);
      } else {
        dequant_panel(head, p0, n, pw);
        gemm_f32(*this, false, true, rc, n, H, 1.f, hc, H, pw, H, 0.f, L, n);
      }
    };
    if (one_pass) {
      // dh_chunk = grad_scale (sum over panels of E panel) / sum - grad_scale head[target].
      for (int64_t p0 = 0; p0 < V; p0 += P) {
        const int64_t n = std::min(P, V - p0);
        logits(p0, n);
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
        for (int64_t i = 0; i < rc; ++i)
          ce_row_one_pass(L + i * n, n, p0, targets[rows[i]], st[i], tl[i], dhc + i * H, H);
        sgemm(false, false, rc, H, n, 1.f, L, n, pw, H, p0 == 0 ? 0.f : 1.f, dhc, H);
      }
      add_chunk_loss(rc);
      ce_dh_one_pass(head, rows, rc, targets, st, dhc, grad_scale, dh);
      continue;
    }
    // Pass 1: online log-sum-exp and the target logit.
    for (int64_t p0 = 0; p0 < V; p0 += P) {
      const int64_t n = std::min(P, V - p0);
      logits(p0, n);
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
      for (int64_t i = 0; i < rc; ++i) {
        const float* l = L + i * n;
        const float m = vec_kernels().max_of(l, n);
        const double sum = vec_kernels().sum_exp_shifted(l, n, m);
        online_softmax_merge(st[i], m, sum);
        const int64_t t = targets[rows[i]];
        if (t >= p0 && t < p0 + n) tl[i] = l[t - p0];
      }
    }
    add_chunk_loss(rc);
    if (!want_dh) continue;
    // Pass 2: dh_chunk = sum over panels of ((softmax - onehot) * grad_scale) panel.
    for (int64_t p0 = 0; p0 < V; p0 += P) {
      const int64_t n = std::min(P, V - p0);
      logits(p0, n);
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
      for (int64_t i = 0; i < rc; ++i) {
        float* l = L + i * n;
        const float li = lse[i];
        vec_kernels().exp_shifted(l, n, li, grad_scale);
        const int64_t t = targets[rows[i]];
        if (t >= p0 && t < p0 + n) l[t - p0] -= grad_scale;
        if (lp16)
          f32_to_bf16_n(l, logit16_buf.as<uint16_t>() + i * n, size_t(n));
        else if (lp)
          round_through_n(DType::BF16, l, l, size_t(n));
      }
      const float beta = p0 == 0 ? 0.f : 1.f;
      if (lp)
        gemm_lp(*this, false, false, rc, H, n, 1.f, lp16 ? logit16_buf.data() : L, n, pl, H, beta,
                dhc, H);
      else
        sgemm(false, false, rc, H, n, 1.f, L, n, pw, H, beta, dhc, H);
    }
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
    for (int64_t i = 0; i < rc; ++i) {
      float* d = dh.row(rows[i]);
      const float* g = dhc + i * H;
      for (int64_t c = 0; c < H; ++c) d[c] += g[c];
    }
  }
  return loss;
}

}  // namespace qlft::cpu
