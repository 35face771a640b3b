// The argument checks of the Backend operations, in one place for every backend (the CPU's and
// the CUDA one): each throws QLFT_ERR_INVALID_ARGUMENT naming the operation and what does not fit.
#pragma once

#include "backend/backend.h"

namespace qlft::op_checks {

// y = x W^T: x [M, W.cols], y [M, W.rows]. `op` names the caller ("linear_fwd").
void linear(const QWeight& W, CMatF x, CMatF y, const char* op);
// linear_bwd: x [M, K], dy [M, N] for W [N, K]; dx [M, K] unless empty.
void linear_bwd(const QWeight& W, CMatF x, CMatF dy, CMatF dx);
// A LoRA reference the kernels can use (r >= 0 with A and B, dropout in [0, 1)).
void lora(const LoraRef& l);
// a and b (named an and bn in the message) have the same shape.
void same_shape(CMatF a, CMatF b, const char* op, const char* an, const char* bn);
// rmsnorm_bwd needs the forward pass's rstd.
void rstd_given(const float* rstd);
// n_heads heads of an even head_dim fit in rows of x.cols; freqs holds head_dim / 2 pairs.
void rope(int64_t cols, int n_heads, int head_dim, const RopeFreqs& freqs);
// The shape and q/k/v of an attention call; fwd: out matches q; bwd: the gradients match and
// the forward pass's lse is given.
void attention(const AttnShape& s, CMatF q, CMatF k, CMatF v, const char* op);
void attention_fwd_out(const AttnShape& s, CMatF q, CMatF out);
void attention_bwd_grads(CMatF q, CMatF k, CMatF v, CMatF out, CMatF dout, CMatF dq, CMatF dk,
                         CMatF dv, const float* lse);
// attention_decode: the head geometry, window >= 0, past >= 0, q and out [n, >= q_dim()], the
// caches given.
void attention_decode(const HeadGeometry& g, int window, int past, CMatF q, const float* k_cache,
                      const float* v_cache, CMatF out);
// out has the embedding's width.
void embedding(const QWeight& emb, CMatF out);
// Every id in [0, vocab) (embedding_fwd's token ids).
void token_ids(const int32_t* ids, int64_t n, int64_t vocab);
// Every target in [0, vocab) or ignore_index (linear_cross_entropy).
void targets(const int32_t* t, int64_t n, int64_t vocab, int32_t ignore_index);
// h has the head's width; dh (unless empty) is h's shape.
void cross_entropy(const QWeight& head, CMatF h, CMatF dh);

// The mixture-of-experts row ops: gather_rows (out [n, x.cols]), combine_rows (src and out of
// one width, k >= 1), row_dots (a and b of one width).
void gather_rows(CMatF x, CMatF out);
void combine_rows(CMatF src, int k, CMatF out);
void row_dots(CMatF a, CMatF b);
// Every one of n indices in [0, limit) (given: a null array is none), naming op and `what`.
void row_indices(const int32_t* idx, int64_t n, int64_t limit, const char* op, const char* what);

}  // namespace qlft::op_checks
