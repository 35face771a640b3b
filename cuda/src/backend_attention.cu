// CudaBackend's attention: staging Q/K/V (autocast, document starts) and the flash kernels'
// arguments, forward and backward. Precision bf16 with autocast and a head_dim the tensor-core
// kernels take (cuda_attention_tensor_cores) runs k_attention_tc.cu on bf16 copies of the
// operands; everything else the fp32 kernels of k_attention.cu.
// (CudaBackend is declared in cuda_backend.h, which lists where each operation family lives.)
#include "backend/op_checks.h"
#include "cuda_backend.h"

namespace qlft::cu {

namespace {

bool tensor_cores(const CudaBackendOptions& o, const AttnShape& s) {
  return cuda_attention_tensor_cores(o.spec.precision, o.autocast, s.head_dim);
}

// dst (bf16, compact [rows, cols]) = src (fp32, compact) rounded to nearest even.
void to_bf16(const Dev& src, const Dev& dst, int64_t rows, int64_t cols, cudaStream_t s) {
  convert_tile(src.as<float>(), rows, cols, cols, dst.data(), TileType::BF16, s);
}

}  // namespace

void CudaBackend::attention_fwd(const AttnShape& s, CMatF q, CMatF k, CMatF v, MatF out_,
                                float* lse) {
  attention_fwd_to(s, q, k, v, out_, lse, nullptr);
}

void CudaBackend::attention_fwd_to_16(const AttnShape& s, CMatF q, CMatF k, CMatF v, MatF out_,
                                      float* lse, DType t, uint16_t* out16) {
  if (!takes_input_16(t) || !tensor_cores(opt_, s) || out_.stride != out_.cols)
    return Backend::attention_fwd_to_16(s, q, k, v, out_, lse, t, out16);
  attention_fwd_to(s, q, k, v, out_, lse, out16);
}

void CudaBackend::attention_fwd_to(const AttnShape& s, CMatF q, CMatF k, CMatF v, MatF out_,
                                   float* lse, uint16_t* out16) {
  check_attn(s, q, k, v, "attention_fwd");
  op_checks::attention_fwd_out(s, q, out_.as_const());
  const int64_t rows = q.rows, Wq = s.q_dim(), Wk = s.kv_dim();
  AttnStage st = stage_attn(s, q, k, v);
  Dev O = out(out_, Wq, MemCategory::Activations, "attention out");
  Dev O16 =
      out16 ? out_raw(out16, rows * Wq * 2, MemCategory::Activations, "attention out16") : Dev{};
  const int64_t nl = int64_t(s.n_heads) * rows * 4;
  Dev L = lse ? out_raw(lse, nl, MemCategory::Activations, "attention lse")
              : scratch(nl, "attention lse");
  cu::AttnArgs a = args(s, Wq, Wk, st);
  if (tensor_cores(opt_, s))
    cu::attention_tc_fwd(a, st.Q.as<uint16_t>(), st.K.as<uint16_t>(), st.V.as<uint16_t>(),
                         O.as<float>(), O16.as<uint16_t>(), L.as<float>(), stream_);
  else
    cu::attention_fwd(a, st.Q.as<float>(), st.K.as<float>(), st.V.as<float>(), O.as<float>(),
                      L.as<float>(), stream_);
  finish(O, Wq, out_);
  if (out16) finish_raw(O16, out16, rows * Wq * 2);
  if (lse) finish_raw(L, lse, nl);
}

void CudaBackend::attention_bwd(const AttnShape& s, CMatF q, CMatF k, CMatF v, CMatF out_,
                                const float* lse, CMatF dout, MatF dq, MatF dk, MatF dv) {
  attention_bwd_to(s, q, k, v, out_, lse, dout, dq, dk, dv, nullptr);
}

void CudaBackend::attention_bwd_to(const AttnShape& s, CMatF q, CMatF k, CMatF v, CMatF out_,
                                   const float* lse, CMatF dout, MatF dq, MatF dk, MatF dv,
                                   uint16_t* dv16) {
  check_attn(s, q, k, v, "attention_bwd");
  op_checks::attention_bwd_grads(q, k, v, out_, dout, dq.as_const(), dk.as_const(), dv.as_const(),
                                 lse);
  const int64_t rows = q.rows, Wq = s.q_dim(), Wk = s.kv_dim();
  AttnStage st = stage_attn(s, q, k, v);
  // The runner's bf16 out / dout (attention_out_16) in place of the fp32 ones, for this call.
  const uint16_t *out16 = h16_.out16, *dout16 = h16_.dout16;
  h16_.out16 = h16_.dout16 = nullptr;
  const bool tc = tensor_cores(opt_, s);
  const bool dv_direct = dv16 && tc && out16;  // the kernel writes dv16 (dv untouched)
  Dev L = in_raw(lse, int64_t(s.n_heads) * rows * 4, "attention lse");
  Dev dQ = inout(dq, Wq, MemCategory::Activations, "attention dq");
  Dev dK = inout(dk, Wk, MemCategory::Activations, "attention dk");
  Dev dV = dv_direct ? Dev{} : inout(dv, Wk, MemCategory::Activations, "attention dv");
  DeviceMemory delta =
      dev(int64_t(s.n_heads) * rows * 4, MemCategory::Workspace, "attention delta");
  cu::AttnArgs a = args(s, Wq, Wk, st);
  a.round_bf16 = round_lora_bf16();
  if (tc && out16) {  // all in bf16: out and dout as given (dout converted once where not)
    Dev dO16 = dout16 ? view(dout16) : scratch(rows * Wq * 2, "attention dout bf16");
    if (!dout16)
      to_bf16(in(dout, Wq, MemCategory::Activations, "attention dout"), dO16, rows, Wq, stream_);
    cu::attention_tc_bwd16(a, st.Q.as<uint16_t>(), st.K.as<uint16_t>(), st.V.as<uint16_t>(), out16,
                           dO16.as<uint16_t>(), L.as<float>(), dQ.as<float>(), dK.as<float>(),
                           dV.as<float>(), delta.as<float>(), stream_, dv16);
  } else if (tc) {  // out in fp32; dout read in bf16 only (its autocast copy's values)
    Dev O = in(out_, Wq, MemCategory::Activations, "attention out");
    Dev dO16 = dout16 ? view(dout16) : scratch(rows * Wq * 2, "attention dout bf16");
    if (!dout16)
      to_bf16(in(dout, Wq, MemCategory::Activations, "attention dout"), dO16, rows, Wq, stream_);
    cu::attention_tc_bwd(a, st.Q.as<uint16_t>(), st.K.as<uint16_t>(), st.V.as<uint16_t>(),
                         O.as<float>(), dO16.as<uint16_t>(), L.as<float>(), dQ.as<float>(),
                         dK.as<float>(), dV.as<float>(), delta.as<float>(), stream_);
  } else {
    auto widened = [&](const uint16_t* h, const char* what) {
      Dev r = scratch(rows * Wq * 4, what);
      cu::widen_tile(h, tile_, rows * Wq, r.as<float>(), stream_);
      return r;
    };
    Dev O = out16 ? widened(out16, "attention out")
                  : in(out_, Wq, MemCategory::Activations, "attention out");
    Dev dO = dout16 ? widened(dout16, "attention dout")
                    : autocast(in(dout, Wq, MemCategory::Activations, "attention dout"), rows * Wq);
    cu::attention_bwd(a, st.Q.as<float>(), st.K.as<float>(), st.V.as<float>(), O.as<float>(),
                      L.as<float>(), dO.as<float>(), dQ.as<float>(), dK.as<float>(), dV.as<float>(),
                      delta.as<float>(), stream_);
  }
  finish(dQ, Wq, dq);
  finish(dK, Wk, dk);
  if (dv_direct) return;
  if (dv16) cu::convert_tile(dV.as<float>(), rows, Wk, Wk, dv16, tile_, stream_);
  finish(dV, Wk, dv);
}

void CudaBackend::attention_bwd_16(const AttnShape& s, CMatF q, CMatF k, CMatF v, CMatF out_,
                                   const float* lse, CMatF dout, const RopeArgs& rope, DType t,
                                   View2<uint16_t> dq16, View2<uint16_t> dk16,
                                   View2<uint16_t> dv16) {
  const int64_t R = q.rows;
  if (!takes_input_16(t) || !rope.freqs || R == 0 || dv16.stride != dv16.cols ||
      dq16.cols != q.cols || dk16.cols != k.cols || dv16.cols != v.cols)
    return Backend::attention_bwd_16(s, q, k, v, out_, lse, dout, rope, t, dq16, dk16, dv16);
  // Into zeroed fp32 gradients (alloc's; the kernels accumulate; this backend's memory, so used in
  // place), then dq / dk rotated back by RoPE straight into their bf16 outputs; dv written in
  // bf16 by the tensor-core kernel where it reads the runner's bf16 out (the kernel's fp32 sum
  // rounded once, as 0 + dv then to_16 give; no fp32 dv), else converted after it.
  const bool dv_direct = tensor_cores(opt_, s) && h16_.out16;
  Buffer dq = alloc(MemCategory::Workspace, size_t(R * q.cols) * 4, "attention dq"),
         dk = alloc(MemCategory::Workspace, size_t(R * k.cols) * 4, "attention dk"), dv;
  if (!dv_direct) dv = alloc(MemCategory::Workspace, size_t(R * v.cols) * 4, "attention dv");
  Dev DV16 = out_raw(dv16.data, R * v.cols * 2, MemCategory::Activations, "attention dv (16-bit)");
  attention_bwd_to(s, q, k, v, out_, lse, dout, MatF(dq.as<float>(), R, q.cols),
                   MatF(dk.as<float>(), R, k.cols), MatF(dv.as<float>(), R, v.cols),
                   DV16.as<uint16_t>());
  finish_raw(DV16, dv16.data, R * v.cols * 2);
  Dev P = in_raw(rope.pos, R * 4, "rope positions");
  const float* inv = inv_freq(*rope.freqs);
  auto back = [&](const Buffer& g, View2<uint16_t> g16, int n_heads) {
    const int64_t bytes = ((R - 1) * g16.stride + g16.cols) * 2;
    Dev G16 = out_raw(g16.data, bytes, MemCategory::Activations, "attention grad (16-bit)");
    cu::rope16(g.as<float>(), g16.cols, G16.as<uint16_t>(), g16.stride, P.as<int32_t>(), inv,
               rope.freqs->scale, R, n_heads, s.head_dim, rope.adjacent, true, stream_);
    finish_raw(G16, g16.data, bytes);
  };
  back(dq, dq16, s.n_heads);
  back(dk, dk16, s.n_kv_heads);
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
  // The runner's bf16 q / k / v (attention_inputs_16), for this call only.
  const uint16_t *q16 = h16_.q16, *k16 = h16_.k16, *v16 = h16_.v16;
  h16_.q16 = h16_.k16 = h16_.v16 = nullptr;
  if (q16 && k16 && v16) {
    if (tensor_cores(opt_, s)) {  // read as they are
      st.Q = view(q16);
      st.K = view(k16);
      st.V = view(v16);
    } else {  // the fp32 kernels: widened (the rounded values autocast would give)
      auto widen = [&](const uint16_t* h, int64_t cols, const char* what) {
        Dev r = scratch(rows * cols * 4, what);
        cu::widen_tile(h, tile_, rows * cols, r.as<float>(), stream_);
        return r;
      };
      st.Q = widen(q16, Wq, "attention q");
      st.K = widen(k16, Wk, "attention k");
      st.V = widen(v16, Wk, "attention v");
    }
  } else if (tensor_cores(opt_, s)) {  // Q, K, V are bf16 copies (rounded as autocast rounds)
    auto bf16 = [&](CMatF m, int64_t cols, const char* what, const char* what16) {
      Dev r = scratch(rows * cols * 2, what16);
      to_bf16(in(m, cols, MemCategory::Activations, what), r, rows, cols, stream_);
      return r;
    };
    st.Q = bf16(q, Wq, "attention q", "attention q bf16");
    st.K = bf16(k, Wk, "attention k", "attention k bf16");
    st.V = bf16(v, Wk, "attention v", "attention v bf16");
  } else {
    st.Q = autocast(in(q, Wq, MemCategory::Activations, "attention q"), rows * Wq);
    st.K = autocast(in(k, Wk, MemCategory::Activations, "attention k"), rows * Wk);
    st.V = autocast(in(v, Wk, MemCategory::Activations, "attention v"), rows * Wk);
  }
  if (s.doc_ids) {
    // first[row]: the first position of the same document in this batch element (bounds the
    // key range of a query tile, as on the CPU).
    st.doc = in_raw(s.doc_ids, rows * 4, "attention doc ids");
    st.first = view(doc_starts(s, st.doc));
  }
  return st;
}

const int32_t* CudaBackend::doc_starts(const AttnShape& s, const Dev& doc) {
  DocStarts& c = doc_starts_;
  const uint64_t v = doc.staged() ? 0 : mem_.version(s.doc_ids);
  if (v != 0 && c.doc == s.doc_ids && c.batch == s.batch && c.seq == s.seq && c.version == v)
    return c.first.as<int32_t>();
  const int64_t bytes = int64_t(s.batch) * s.seq * 4;
  if (int64_t(c.first.size()) < bytes)
    c.first = dev(bytes, MemCategory::Workspace, "attention doc starts");
  cu::doc_first(doc.as<int32_t>(), s.batch, s.seq, c.first.as<int32_t>(), stream_);
  c.doc = v ? s.doc_ids : nullptr;
  c.batch = s.batch;
  c.seq = s.seq;
  c.version = v;
  return c.first.as<int32_t>();
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
  a.window = s.window;
  a.scale = s.score_scale();
  a.softcap = s.softcap;
  return a;
}
}  // namespace qlft::cu

bool qlft::cuda_attention_tensor_cores(Precision precision, bool autocast, int head_dim) {
  return precision == Precision::BF16 && autocast && cu::attention_tc_supported(head_dim);
}
