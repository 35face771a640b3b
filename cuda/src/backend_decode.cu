// CudaBackend's decoding ops (Backend's "decoding with a KV cache"): generation keeps its
// activations and KV cache in this backend's memory, so these run in place and a greedy step
// copies back only the chosen id. Host arrays are staged as everywhere else.
// (CudaBackend is declared in cuda_backend.h, which lists where each operation family lives.)
#include "backend/op_checks.h"
#include "cuda_backend.h"

namespace qlft::cu {

void CudaBackend::positions(int32_t* pos, int n, int32_t start) {
  if (n <= 0) return;
  if (!mine(pos, int64_t(n) * 4)) return Backend::positions(pos, n, start);
  cu::positions(pos, n, start, stream_);
}

int32_t CudaBackend::argmax(const float* x, int64_t n) {
  QLFT_CHECK_ARG(n > 0, "argmax: no values");
  if (!mine(x, n * 4)) return Backend::argmax(x, n);
  DeviceMemory id = dev(4, MemCategory::Workspace, "argmax id");
  cu::argmax(x, n, id.as<int32_t>(), stream_);
  int32_t out = 0;
  copy_down(&out, id.data(), 4);  // the one int32 a greedy step moves back
  return out;
}

void CudaBackend::attention_decode(const HeadGeometry& g, int window, int past, CMatF q,
                                   const float* k_cache, const float* v_cache, MatF out_) {
  attention_decode_capped(g, window, 0.f, 0.f, past, q, k_cache, v_cache, out_);
}

void CudaBackend::attention_decode_capped(const HeadGeometry& g, int window, float scale,
                                          float softcap, int past, CMatF q, const float* k_cache,
                                          const float* v_cache, MatF out_) {
  op_checks::attention_decode(g, window, past, q, k_cache, v_cache, out_.as_const());
  const int64_t n = q.rows, qd = g.q_dim(), kvd = g.kv_dim();
  if (n == 0) return;
  const int64_t cache_bytes = (past + n) * kvd * 4;
  Dev Q = in(q, qd, MemCategory::Activations, "decode q");
  Dev K = in_raw(k_cache, cache_bytes, "decode k cache");
  Dev V = in_raw(v_cache, cache_bytes, "decode v cache");
  Dev O = out(out_, qd, MemCategory::Activations, "decode attention out");
  cu::DecodeArgs a{g.n_heads, g.n_kv_heads, g.head_dim, past,  window, n,
                   kvd,       qd,           qd,         scale, softcap};
  cu::attention_decode(a, Q.as<float>(), K.as<float>(), V.as<float>(), O.as<float>(), stream_);
  finish(O, qd, out_);
}

}  // namespace qlft::cu
