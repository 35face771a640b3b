#include "backend/autocast_backend.h"

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/log.h"

namespace qlft {

namespace {

class AutocastBackend final : public Backend {
 public:
  AutocastBackend(std::unique_ptr<Backend> inner, DType t, bool native)
      : Backend(inner->tracker()), inner_(std::move(inner)), t_(t) {
    // The rounding below runs on the host: a device backend rounds its own operands.
    QLFT_CHECK_ARG(!inner_->device_memory(),
                   "autocast: backend %s keeps its tensors on a device and rounds them itself",
                   inner_->name());
    name_ = std::string(inner_->name()) + (t == DType::BF16 ? "+bf16" : "+fp16");
    auto* cpu = dynamic_cast<cpu::CpuBackend*>(inner_.get());
    if (native && t == DType::BF16 && cpu) {
      cpu->set_precision(DType::BF16);
      native_linear_ = true;
      QLFT_LOG_D("autocast bf16: linear layers and head run bf16 GEMMs on %s",
                 cpu->bf16_onednn() ? "oneDNN (native bf16)"
                                    : "OpenBLAS sgemm of bf16-rounded operands (no AVX512-BF16)");
    }
  }
  const char* name() const override { return name_.c_str(); }
  TransferCounts transfers() const override { return inner_->transfers(); }
  void add(float* y, const float* x, int64_t n) override { inner_->add(y, x, n); }
  void copy(float* dst, const float* src, int64_t n) override { inner_->copy(dst, src, n); }
  void to_16(DType t, const float* src, uint16_t* dst, int64_t n) override {
    inner_->to_16(t, src, dst, n);
  }
  void from_16(DType t, const uint16_t* src, float* dst, int64_t n) override {
    inner_->from_16(t, src, dst, n);
  }
  void round_16(DType t, float* x, int64_t n) override { inner_->round_16(t, x, n); }
  double sum_squares(const float* x, int64_t n) override { return inner_->sum_squares(x, n); }
  void scale(float* x, int64_t n, float s) override { inner_->scale(x, n, s); }
  int64_t count_nonfinite(const float* x, int64_t n) override {
    return inner_->count_nonfinite(x, n);
  }
  void adamw_torch(float* p, float* m, float* v, const float* g, int64_t n,
                   const AdamWTorchCoeffs& c) override {
    inner_->adamw_torch(p, m, v, g, n, c);
  }

  void linear_fwd(const QWeight& W, const float* bias, const LoraRef* lora, CMatF x, MatF y,
                  float* xa) override {
    if (native_linear_) return inner_->linear_fwd(W, bias, lora, x, y, xa);
    Buffer xr = rounded(x, "autocast x");
    inner_->linear_fwd(W, bias, lora, view(xr, x), y, xa);
  }
  void linear_bwd(const QWeight& W, const LoraRef* lora, CMatF x, const float* xa, CMatF dy,
                  MatF dx, float* dA, float* dB) override {
    if (native_linear_) return inner_->linear_bwd(W, lora, x, xa, dy, dx, dA, dB);
    Buffer xr = rounded(x, "autocast x");
    Buffer dyr = rounded(dy, "autocast dy");
    inner_->linear_bwd(W, lora, view(xr, x), xa, view(dyr, dy), dx, dA, dB);
  }
  void begin_shared_input(CMatF x) override { inner_->begin_shared_input(x); }
  // The inner backend's bf16 GEMMs take the stored bf16 copy only when it runs them itself.
  void begin_shared_input_16(CMatF x, DType t, const uint16_t* x16) override {
    if (native_linear_)
      inner_->begin_shared_input_16(x, t, x16);
    else
      inner_->begin_shared_input(x);
  }
  void attention_inputs_16(DType t, const uint16_t* q16, const uint16_t* k16,
                           const uint16_t* v16) override {
    if (native_linear_) inner_->attention_inputs_16(t, q16, k16, v16);
  }
  bool takes_input_16(DType t) const override {
    return native_linear_ && inner_->takes_input_16(t);
  }
  void rmsnorm_fwd_16(CMatF x, const float* w, float eps, MatF y, float* rstd, DType t,
                      uint16_t* y16) override {
    inner_->rmsnorm_fwd_16(x, w, eps, y, rstd, t, y16);
  }
  void add_rmsnorm_fwd_16(MatF x, const float* r, const float* w, float eps, float* rstd, DType t,
                          uint16_t* y16) override {
    inner_->add_rmsnorm_fwd_16(x, r, w, eps, rstd, t, y16);
  }
  void rmsnorm_bwd_16(CMatF x, const float* w, const float* rstd, CMatF dy, MatF dx, DType t,
                      uint16_t* dx16) override {
    inner_->rmsnorm_bwd_16(x, w, rstd, dy, dx, t, dx16);
  }
  void swiglu_fwd_16(MatF gate, MatF up, MatF out, DType t, uint16_t* g16, uint16_t* u16,
                     uint16_t* o16, bool keep_rounded) override {
    inner_->swiglu_fwd_16(gate, up, out, t, g16, u16, o16, keep_rounded);
  }
  // The inner backend writes the rounded output itself only when it runs the GEMMs itself.
  void linear_fwd_to_16(const QWeight& W, const float* bias, const LoraRef* lora, CMatF x, MatF y,
                        float* xa, DType t, uint16_t* y16) override {
    if (native_linear_) return inner_->linear_fwd_to_16(W, bias, lora, x, y, xa, t, y16);
    Backend::linear_fwd_to_16(W, bias, lora, x, y, xa, t, y16);
  }
  void swiglu_fwd_from_16(DType t, const uint16_t* g16, const uint16_t* u16, uint16_t* o16,
                          int64_t rows, int64_t cols) override {
    inner_->swiglu_fwd_from_16(t, g16, u16, o16, rows, cols);
  }
  void swiglu_bwd_16(MatF gate, MatF up, DType t, const uint16_t* g16, const uint16_t* u16,
                     CMatF dout, MatF dgate, MatF dup) override {
    inner_->swiglu_bwd_16(gate, up, t, g16, u16, dout, dgate, dup);
  }
  int64_t grad_16_stride(const QWeight& W, const LoraRef* lora) const override {
    return native_linear_ ? inner_->grad_16_stride(W, lora) : W.rows;
  }
  void next_dy_16(DType t, View2<uint16_t> dy16) override {
    if (native_linear_) inner_->next_dy_16(t, dy16);
  }
  void swiglu_bwd_to_16(DType t, const uint16_t* g16, const uint16_t* u16, CMatF dout,
                        View2<uint16_t> dg16, View2<uint16_t> du16) override {
    inner_->swiglu_bwd_to_16(t, g16, u16, dout, dg16, du16);
  }
  void attention_fwd_to_16(const AttnShape& s, CMatF q, CMatF k, CMatF v, MatF out, float* lse,
                           DType t, uint16_t* out16) override {
    if (native_linear_) return inner_->attention_fwd_to_16(s, q, k, v, out, lse, t, out16);
    Backend::attention_fwd_to_16(s, q, k, v, out, lse, t, out16);
  }
  void attention_out_16(DType t, const uint16_t* out16, const uint16_t* dout16) override {
    if (native_linear_) inner_->attention_out_16(t, out16, dout16);
  }
  bool next_dx_16(DType t, uint16_t* dx16, const QWeight& W, const LoraRef* lora) override {
    return native_linear_ && inner_->next_dx_16(t, dx16, W, lora);
  }
  void attention_bwd_16(const AttnShape& s, CMatF q, CMatF k, CMatF v, CMatF out, const float* lse,
                        CMatF dout, const RopeArgs& rope, DType t, View2<uint16_t> dq16,
                        View2<uint16_t> dk16, View2<uint16_t> dv16) override {
    if (native_linear_)
      return inner_->attention_bwd_16(s, q, k, v, out, lse, dout, rope, t, dq16, dk16, dv16);
    Backend::attention_bwd_16(s, q, k, v, out, lse, dout, rope, t, dq16, dk16, dv16);
  }
  void end_shared_input() override { inner_->end_shared_input(); }
  bool defer_zero(float* dx, int64_t n) override { return inner_->defer_zero(dx, n); }
  void rmsnorm_fwd(CMatF x, const float* w, float eps, MatF y, float* rstd) override {
    inner_->rmsnorm_fwd(x, w, eps, y, rstd);
  }
  void rmsnorm_bwd(CMatF x, const float* w, const float* rstd, CMatF dy, MatF dx) override {
    inner_->rmsnorm_bwd(x, w, rstd, dy, dx);
  }
  void rope(MatF x, const int32_t* pos, int n_heads, int head_dim, const RopeFreqs& freqs,
            bool adjacent, bool inverse) override {
    inner_->rope(x, pos, n_heads, head_dim, freqs, adjacent, inverse);
  }
  void rope_to_16(MatF x, const int32_t* pos, int n_heads, int head_dim, const RopeFreqs& freqs,
                  bool adjacent, DType t, uint16_t* x16) override {
    inner_->rope_to_16(x, pos, n_heads, head_dim, freqs, adjacent, t, x16);
  }
  void swiglu_fwd(CMatF gate, CMatF up, MatF out) override { inner_->swiglu_fwd(gate, up, out); }
  void swiglu_bwd(CMatF gate, CMatF up, CMatF dout, MatF dgate, MatF dup) override {
    inner_->swiglu_bwd(gate, up, dout, dgate, dup);
  }
  // Gemma's ops: the inner backend's (the cross-entropy's head input rounded as below).
  bool gemma_ops() const override { return inner_->gemma_ops(); }
  void geglu_fwd(CMatF gate, CMatF up, MatF out) override { inner_->geglu_fwd(gate, up, out); }
  void geglu_bwd(CMatF gate, CMatF up, CMatF dout, MatF dgate, MatF dup) override {
    inner_->geglu_bwd(gate, up, dout, dgate, dup);
  }
  void softcap(MatF x, float cap) override { inner_->softcap(x, cap); }
  void attention_decode_capped(const HeadGeometry& g, int window, float scale, float softcap,
                               int past, CMatF q, const float* k_cache, const float* v_cache,
                               MatF out) override {
    inner_->attention_decode_capped(g, window, scale, softcap, past, q, k_cache, v_cache, out);
  }
  double linear_cross_entropy_capped(const QWeight& head, CMatF h, const int32_t* targets,
                                     int32_t ignore_index, float grad_scale, float cap, MatF dh,
                                     int64_t* count) override {
    if (native_linear_)
      return inner_->linear_cross_entropy_capped(head, h, targets, ignore_index, grad_scale, cap,
                                                 dh, count);
    Buffer hr = rounded(h, "autocast h");
    return inner_->linear_cross_entropy_capped(head, view(hr, h), targets, ignore_index, grad_scale,
                                               cap, dh, count);
  }
  void attention_fwd(const AttnShape& s, CMatF q, CMatF k, CMatF v, MatF out, float* lse) override {
    if (native_linear_) return inner_->attention_fwd(s, q, k, v, out, lse);
    Buffer qr = rounded(q, "autocast q"), kr = rounded(k, "autocast k"),
           vr = rounded(v, "autocast v");
    inner_->attention_fwd(s, view(qr, q), view(kr, k), view(vr, v), out, lse);
  }
  void attention_bwd(const AttnShape& s, CMatF q, CMatF k, CMatF v, CMatF out, const float* lse,
                     CMatF dout, MatF dq, MatF dk, MatF dv) override {
    if (native_linear_) return inner_->attention_bwd(s, q, k, v, out, lse, dout, dq, dk, dv);
    Buffer qr = rounded(q, "autocast q"), kr = rounded(k, "autocast k"),
           vr = rounded(v, "autocast v");
    Buffer dr = rounded(dout, "autocast dout");
    inner_->attention_bwd(s, view(qr, q), view(kr, k), view(vr, v), out, lse, view(dr, dout), dq,
                          dk, dv);
  }
  void embedding_fwd(const QWeight& emb, const int32_t* tokens, MatF out) override {
    inner_->embedding_fwd(emb, tokens, out);
  }
  // Generation's ops, passed through unrounded (generation runs in fp32: api_generate.cpp).
  void positions(int32_t* pos, int n, int32_t start) override { inner_->positions(pos, n, start); }
  int32_t argmax(const float* x, int64_t n) override { return inner_->argmax(x, n); }
  void attention_decode(const HeadGeometry& g, int window, int past, CMatF q, const float* k_cache,
                        const float* v_cache, MatF out) override {
    inner_->attention_decode(g, window, past, q, k_cache, v_cache, out);
  }
  void head_logits(const QWeight& head, CMatF h, MatF logits) override {
    if (native_linear_) return inner_->head_logits(head, h, logits);
    Buffer hr = rounded(h, "autocast h");
    inner_->head_logits(head, view(hr, h), logits);
  }
  double linear_cross_entropy(const QWeight& head, CMatF h, const int32_t* targets,
                              int32_t ignore_index, float grad_scale, MatF dh,
                              int64_t* count) override {
    // The head matmul's input is low precision; the softmax and the loss stay fp32.
    if (native_linear_)
      return inner_->linear_cross_entropy(head, h, targets, ignore_index, grad_scale, dh, count);
    Buffer hr = rounded(h, "autocast h");
    return inner_->linear_cross_entropy(head, view(hr, h), targets, ignore_index, grad_scale, dh,
                                        count);
  }
  void cross_entropy_stats(const QWeight& slice, int64_t row0, int64_t vocab, CMatF h,
                           const int32_t* targets, int32_t ignore_index,
                           CrossEntropyRow* st) override {
    if (native_linear_)
      return inner_->cross_entropy_stats(slice, row0, vocab, h, targets, ignore_index, st);
    Buffer hr = rounded(h, "autocast h");
    inner_->cross_entropy_stats(slice, row0, vocab, view(hr, h), targets, ignore_index, st);
  }
  int cross_entropy_walks() const override { return inner_->cross_entropy_walks(); }
  void cross_entropy_walk(const QWeight& slice, int64_t row0, int64_t vocab, CMatF h,
                          const int32_t* targets, int32_t ignore_index, float grad_scale,
                          CrossEntropyRow* st, float* acc, MatF dh) override {
    if (native_linear_)
      return inner_->cross_entropy_walk(slice, row0, vocab, h, targets, ignore_index, grad_scale,
                                        st, acc, dh);
    Buffer hr = rounded(h, "autocast h");
    inner_->cross_entropy_walk(slice, row0, vocab, view(hr, h), targets, ignore_index, grad_scale,
                               st, acc, dh);
  }
  void cross_entropy_grad(const QWeight& slice, int64_t row0, int64_t vocab, CMatF h,
                          const int32_t* targets, int32_t ignore_index, const float* lse,
                          float grad_scale, MatF dh) override {
    if (native_linear_)
      return inner_->cross_entropy_grad(slice, row0, vocab, h, targets, ignore_index, lse,
                                        grad_scale, dh);
    Buffer hr = rounded(h, "autocast h");
    inner_->cross_entropy_grad(slice, row0, vocab, view(hr, h), targets, ignore_index, lse,
                               grad_scale, dh);
  }

 private:
  // A dense rounded copy of m (rows x cols), counted as workspace.
  Buffer rounded(CMatF m, const char* what) {
    Buffer b(tracker_, MemCategory::Workspace, static_cast<size_t>(m.rows * m.cols) * sizeof(float),
             what);
    float* d = b.as<float>();
    for (int64_t r = 0; r < m.rows; ++r) round_through_n(t_, m.row(r), d + r * m.cols, m.cols);
    return b;
  }
  static CMatF view(const Buffer& b, CMatF like) {
    return CMatF(b.as<float>(), like.rows, like.cols);
  }

  std::unique_ptr<Backend> inner_;
  DType t_;
  bool native_linear_ = false;  // the inner CPU backend rounds its own matmul inputs
  std::string name_;
};

}  // namespace

std::unique_ptr<Backend> make_autocast_backend(std::unique_ptr<Backend> inner, DType dtype,
                                               bool native) {
  QLFT_CHECK_ARG(dtype == DType::BF16 || dtype == DType::F16,
                 "autocast: precision must be bf16 or fp16");
  return std::make_unique<AutocastBackend>(std::move(inner), dtype, native);
}

}  // namespace qlft
