#include "backend/op_checks.h"

#include "core/error.h"

namespace qlft::op_checks {

void linear(const QWeight& W, CMatF x, CMatF y, const char* op) {
  QLFT_CHECK_ARG(x.cols == W.cols && y.cols == W.rows && y.rows == x.rows,
                 "%s: shape mismatch: x [%lld, %lld], weight [%lld, %lld], y [%lld, %lld]", op,
                 (long long)x.rows, (long long)x.cols, (long long)W.rows, (long long)W.cols,
                 (long long)y.rows, (long long)y.cols);
}

void linear_bwd(const QWeight& W, CMatF x, CMatF dy, CMatF dx) {
  const int64_t M = dy.rows, N = W.rows, K = W.cols;
  QLFT_CHECK_ARG(dy.cols == N && x.cols == K && x.rows == M,
                 "linear_bwd: shape mismatch: x [%lld, %lld], weight [%lld, %lld], dy [%lld, %lld]",
                 (long long)x.rows, (long long)x.cols, (long long)N, (long long)K,
                 (long long)dy.rows, (long long)dy.cols);
  if (dx.data)
    QLFT_CHECK_ARG(dx.rows == M && dx.cols == K,
                   "linear_bwd: dx is [%lld, %lld], want [%lld, %lld]", (long long)dx.rows,
                   (long long)dx.cols, (long long)M, (long long)K);
}

void lora(const LoraRef& l) {
  QLFT_CHECK_ARG(l.r >= 0 && (l.r == 0 || (l.A && l.B)),
                 "linear: LoRA adapter with r = %d but no A/B", l.r);
  QLFT_CHECK_ARG(l.dropout_p >= 0.f && l.dropout_p < 1.f,
                 "linear: LoRA dropout must be in [0, 1), got %g", double(l.dropout_p));
}

void same_shape(CMatF a, CMatF b, const char* op, const char* an, const char* bn) {
  QLFT_CHECK_ARG(a.rows == b.rows && a.cols == b.cols,
                 "%s: %s is [%lld, %lld] but %s is [%lld, %lld]", op, an, (long long)a.rows,
                 (long long)a.cols, bn, (long long)b.rows, (long long)b.cols);
}

void rstd_given(const float* rstd) {
  QLFT_CHECK_ARG(rstd != nullptr, "rmsnorm_bwd: the forward pass's rstd is required");
}

void rope(int64_t cols, int n_heads, int head_dim, const RopeFreqs& freqs) {
  QLFT_CHECK_ARG(head_dim > 0 && head_dim % 2 == 0, "rope: head_dim must be even, got %d",
                 head_dim);
  QLFT_CHECK_ARG(freqs.head_dim() == head_dim,
                 "rope: the frequency table holds %zu pairs, head_dim %d needs %d",
                 freqs.inv_freq.size(), head_dim, head_dim / 2);
  QLFT_CHECK_ARG(n_heads > 0 && int64_t(n_heads) * head_dim <= cols,
                 "rope: %d heads of %d do not fit rows of %lld", n_heads, head_dim,
                 (long long)cols);
}

void attention(const AttnShape& s, CMatF q, CMatF k, CMatF v, const char* op) {
  QLFT_CHECK_ARG(s.batch > 0 && s.seq > 0 && s.n_heads > 0 && s.n_kv_heads > 0 && s.head_dim > 0 &&
                     s.n_heads % s.n_kv_heads == 0,
                 "%s: bad shape (batch %d, seq %d, heads %d, kv heads %d, head_dim %d)", op,
                 s.batch, s.seq, s.n_heads, s.n_kv_heads, s.head_dim);
  QLFT_CHECK_ARG(s.window >= 0, "%s: sliding window %d is negative", op, s.window);
  const int64_t rows = int64_t(s.batch) * s.seq;
  QLFT_CHECK_ARG(q.rows == rows && k.rows == rows && v.rows == rows && q.cols >= s.q_dim() &&
                     k.cols >= s.kv_dim() && v.cols >= s.kv_dim(),
                 "%s: q/k/v shapes do not match batch %d x seq %d with %d/%d heads of %d", op,
                 s.batch, s.seq, s.n_heads, s.n_kv_heads, s.head_dim);
}

void attention_decode(const HeadGeometry& g, int window, int past, CMatF q, const float* k_cache,
                      const float* v_cache, CMatF out) {
  QLFT_CHECK_ARG(
      g.n_heads > 0 && g.n_kv_heads > 0 && g.head_dim > 0 && g.n_heads % g.n_kv_heads == 0,
      "attention_decode: bad shape (heads %d, kv heads %d, head_dim %d)", g.n_heads, g.n_kv_heads,
      g.head_dim);
  QLFT_CHECK_ARG(window >= 0 && past >= 0, "attention_decode: window %d / past %d is negative",
                 window, past);
  QLFT_CHECK_ARG(q.cols >= g.q_dim() && out.rows == q.rows && out.cols >= g.q_dim(),
                 "attention_decode: q / out shapes do not match %d heads of %d", g.n_heads,
                 g.head_dim);
  QLFT_CHECK_ARG(q.rows == 0 || (k_cache && v_cache), "attention_decode: no KV cache given");
}

void attention_fwd_out(const AttnShape& s, CMatF q, CMatF out) {
  QLFT_CHECK_ARG(out.rows == q.rows && out.cols >= s.q_dim(),
                 "attention_fwd: out shape does not match q");
}

void attention_bwd_grads(CMatF q, CMatF k, CMatF v, CMatF out, CMatF dout, CMatF dq, CMatF dk,
                         CMatF dv, const float* lse) {
  QLFT_CHECK_ARG(out.rows == q.rows && dout.rows == q.rows && dq.rows == q.rows &&
                     dk.rows == k.rows && dv.rows == v.rows,
                 "attention_bwd: gradient shapes do not match q/k/v");
  QLFT_CHECK_ARG(lse != nullptr, "attention_bwd: the forward pass's lse is required");
}

void embedding(const QWeight& emb, CMatF out) {
  QLFT_CHECK_ARG(out.cols == emb.cols, "embedding_fwd: output has %lld columns, embedding %lld",
                 (long long)out.cols, (long long)emb.cols);
}

void token_ids(const int32_t* ids, int64_t n, int64_t vocab) {
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      throw_error(QLFT_ERR_INVALID_ARGUMENT,
                  "token id %d at position %lld is outside the vocabulary of %lld tokens", ids[i],
                  (long long)i, (long long)vocab);
}

void targets(const int32_t* t, int64_t n, int64_t vocab, int32_t ignore_index) {
  for (int64_t i = 0; i < n; ++i)
    if (t[i] != ignore_index && (t[i] < 0 || t[i] >= vocab))
      throw_error(QLFT_ERR_INVALID_ARGUMENT,
                  "target id %d at position %lld is outside the vocabulary of %lld tokens", t[i],
                  (long long)i, (long long)vocab);
}

void cross_entropy(const QWeight& head, CMatF h, CMatF dh) {
  QLFT_CHECK_ARG(h.cols == head.cols, "linear_cross_entropy: hidden has %lld columns, head %lld",
                 (long long)h.cols, (long long)head.cols);
  if (dh.data)
    QLFT_CHECK_ARG(dh.rows == h.rows && dh.cols == head.cols,
                   "linear_cross_entropy: dh shape mismatch");
}

void gather_rows(CMatF x, CMatF out) {
  QLFT_CHECK_ARG(out.cols == x.cols && out.rows >= 0,
                 "gather_rows: x is [%lld, %lld] but out is [%lld, %lld]", (long long)x.rows,
                 (long long)x.cols, (long long)out.rows, (long long)out.cols);
}

void combine_rows(CMatF src, int k, CMatF out) {
  QLFT_CHECK_ARG(k >= 1, "combine_rows: k = %d terms per row", k);
  QLFT_CHECK_ARG(out.cols == src.cols, "combine_rows: src is [%lld, %lld] but out is [%lld, %lld]",
                 (long long)src.rows, (long long)src.cols, (long long)out.rows,
                 (long long)out.cols);
}

void row_dots(CMatF a, CMatF b) {
  QLFT_CHECK_ARG(a.cols == b.cols, "row_dots: a is [%lld, %lld] but b is [%lld, %lld]",
                 (long long)a.rows, (long long)a.cols, (long long)b.rows, (long long)b.cols);
}

void row_indices(const int32_t* idx, int64_t n, int64_t limit, const char* op, const char* what) {
  if (!idx) return;
  for (int64_t i = 0; i < n; ++i)
    QLFT_CHECK_ARG(idx[i] >= 0 && idx[i] < limit, "%s: %s[%lld] = %d is outside [0, %lld)", op,
                   what, (long long)i, idx[i], (long long)limit);
}

}  // namespace qlft::op_checks
