// CudaBackend's attention: staging Q/K/V (autocast, document starts) and the flash kernels'
// arguments, forward and backward.
// (CudaBackend is declared in cuda_backend.h, which lists where each operation family lives.)
#include "backend/op_checks.h"
#include "cuda_backend.h"

namespace qlft::cu {

void CudaBackend::attention_fwd(const AttnShape& s, CMatF q, CMatF k, CMatF v, MatF out_,
                                float* lse) {
  check_attn(s, q, k, v, "attention_fwd");
  op_checks::attention_fwd_out(s, q, out_.as_const());
  const int64_t rows = q.rows, Wq = s.q_dim(), Wk = s.kv_dim();
  AttnStage st = stage_attn(s, q, k, v);
  Dev O = out(out_, Wq, MemCategory::Activations, "attention out");
  const int64_t nl = int64_t(s.n_heads) * rows * 4;
  Dev L = lse ? out_raw(lse, nl, MemCategory::Activations, "attention lse")
              : scratch(nl, "attention lse");
  cu::AttnArgs a = args(s, Wq, Wk, st);
  cu::attention_fwd(a, st.Q.as<float>(), st.K.as<float>(), st.V.as<float>(), O.as<float>(),
                    L.as<float>(), stream_);
  finish(O, Wq, out_);
  if (lse) finish_raw(L, lse, nl);
}

void CudaBackend::attention_bwd(const AttnShape& s, CMatF q, CMatF k, CMatF v, CMatF out_,
                                const float* lse, CMatF dout, MatF dq, MatF dk, MatF dv) {
  check_attn(s, q, k, v, "attention_bwd");
  op_checks::attention_bwd_grads(q, k, v, out_, dout, dq.as_const(), dk.as_const(), dv.as_const(),
                                 lse);
  const int64_t rows = q.rows, Wq = s.q_dim(), Wk = s.kv_dim();
  AttnStage st = stage_attn(s, q, k, v);
  Dev O = in(out_, Wq, MemCategory::Activations, "attention out");
  Dev dO = autocast(in(dout, Wq, MemCategory::Activations, "attention dout"), rows * Wq);
  Dev L = in_raw(lse, int64_t(s.n_heads) * rows * 4, "attention lse");
  Dev dQ = inout(dq, Wq, MemCategory::Activations, "attention dq");
  Dev dK = inout(dk, Wk, MemCategory::Activations, "attention dk");
  Dev dV = inout(dv, Wk, MemCategory::Activations, "attention dv");
  DeviceMemory delta =
      dev(int64_t(s.n_heads) * rows * 4, MemCategory::Workspace, "attention delta");
  cu::AttnArgs a = args(s, Wq, Wk, st);
  a.round_bf16 = round_lora_bf16();
  cu::attention_bwd(a, st.Q.as<float>(), st.K.as<float>(), st.V.as<float>(), O.as<float>(),
                    L.as<float>(), dO.as<float>(), dQ.as<float>(), dK.as<float>(), dV.as<float>(),
                    delta.as<float>(), stream_);
  finish(dQ, Wq, dq);
  finish(dK, Wk, dk);
  finish(dV, Wk, dv);
}

void CudaBackend::check_attn(const AttnShape& s, CMatF q, CMatF k, CMatF v, const char* op) {
  op_checks::attention(s, q, k, v, op);
  if (s.head_dim > cu::kAttnMaxHeadDim)
    throw_error(QLFT_ERR_UNSUPPORTED, "%s: head_dim %d is above the CUDA kernels' %d", op,
                s.head_dim, cu::kAttnMaxHeadDim);
}

CudaBackend::AttnStage CudaBackend::stage_attn(const AttnShape& s, CMatF q, CMatF k, CMatF v) {
  const int64_t rows = q.rows, Wq = s.q_dim(), Wk = s.kv_dim();
  AttnStage st;
  st.Q = autocast(in(q, Wq, MemCategory::Activations, "attention q"), rows * Wq);
  st.K = autocast(in(k, Wk, MemCategory::Activations, "attention k"), rows * Wk);
  st.V = autocast(in(v, Wk, MemCategory::Activations, "attention v"), rows * Wk);
  if (s.doc_ids) {
    // first[row]: the first position of the same document in this batch element (bounds the
    // key range of a query tile, as on the CPU).
    st.doc = in_raw(s.doc_ids, rows * 4, "attention doc ids");
    st.first = scratch(rows * 4, "attention doc starts");
    cu::doc_first(st.doc.as<int32_t>(), s.batch, s.seq, st.first.as<int32_t>(), stream_);
  }
  return st;
}

AttnArgs CudaBackend::args(const AttnShape& s, int64_t Wq, int64_t Wk, const AttnStage& st) {
  cu::AttnArgs a;
  a.batch = s.batch;
  a.seq = s.seq;
  a.n_heads = s.n_heads;
  a.n_kv_heads = s.n_kv_heads;
  a.head_dim = s.head_dim;
  a.ldq = Wq;
  a.ldo = Wq;
  a.ldk = Wk;
  a.ldv = Wk;
  a.doc = st.doc.as<int32_t>();
  a.first = st.first.as<int32_t>();
  return a;
}
}  // namespace qlft::cu
