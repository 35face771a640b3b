// What DoRA and a frozen PiSSA / OLoRA start add around the kernels' LoRA (Backend::linear_fwd
// and linear_bwd compute y = x W^T + bias + s drop(x) A^T B^T and its gradients; these slots
// need a little more, done here on host memory so every backend's kernels stay as they are).
//
// DoRA (PEFT's DoraLinearLayer, use_dora): with z = x W^T + s drop(x) A^T B^T (no bias), the
// output is y = c * z + bias, c[o] = M[o] / n[o] and n[o] = ||W_o + s (B A)_o|| taken as a
// constant (PEFT detaches the norm). So backward is: dM[o] += sum_t dy[t, o] z[t, o] / n[o] and
// the kernels' backward with c * dy. z is computed again in backward (one more forward GEMM of
// the projection) rather than stored. n comes without forming W + s B A:
//   n[o]^2 = ||W_o||^2 + 2 s sum_k B[o, k] (W A^T)[o, k] + s^2 B_o (A A^T) B_o^T,
// with ||W_o||^2 of the dequantized base rows computed once, and W A^T one forward GEMM of A's r
// rows per layer forward.
//
// A frozen start (A0, B0): y -= s x A0^T B0^T after the kernels' forward, dx -= s dy B0 A0 after
// their backward (the start acts on x, not on the dropped-out x: in PEFT it is part of the base).
// Both GEMMs run through the backend on two small fp32 weights made once per slot.
//
// Host memory only (a backend without device memory): the trainer refuses these variants on a
// device backend.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/lora.h"
#include "model/model.h"

namespace qlft {

class LoraExtras {
 public:
  // The model's layers must stay resident (no streamed weights) while this is used.
  LoraExtras(Backend& be, const Model& model, const LoraAdapter& lora);
  // Whether any slot of the adapter has a magnitude or a start (else every call is a no-op).
  bool any() const { return any_; }

  // Before layer l's forward: DoRA's row scales from the adapter's current A, B and M.
  void prepare_layer(int l);
  // After linear_fwd of (l, p) wrote y (bias included; bias may be nullptr).
  void after_fwd(int l, Proj p, CMatF x, MatF y, const float* bias);
  // Before linear_bwd of (l, p) (prepare_layer(l) done for these A, B, M): the output gradient
  // to hand it (DoRA: c * dy, in a buffer of this object's; else dy itself), with DoRA's dM
  // accumulated into dM ([out]). ref: the kernels' LoRA of (l, p) as the forward used it.
  CMatF before_bwd(int l, Proj p, const LoraRef* ref, CMatF x, CMatF dy, float* dM);
  // After linear_bwd of (l, p) added its dx: the start's term (dy as given to before_bwd).
  void after_bwd(int l, Proj p, CMatF dy, MatF dx);

 private:
  struct Slot {
    bool dora = false, start = false;
    std::vector<double> w_norm2;  // ||W_o||^2 (DoRA), once
    std::vector<float> c, inv_n;  // DoRA's scale and 1 / n per row (prepare_layer)
    QWeight a0, b0;               // A0 [r, in] and -s B0 [out, r] as fp32 weights (start)
  };
  Slot& slot(int l, Proj p) { return slots_[static_cast<size_t>(l) * kProjCount + int(p)]; }
  float* scratch(size_t i, int64_t n);

  Backend& be_;
  const Model& model_;
  const LoraAdapter& lora_;
  bool any_ = false;
  std::vector<Slot> slots_;
  Buffer scratch_[2];
};

// DoRA's magnitude at the start: M[o] = ||W_o + s (B A)_o|| of every slot (PEFT's dora_init;
// with B = 0 the base rows' norms), W the model's dequantized projection.
void dora_init_magnitude(LoraAdapter& lora, const Model& model);

// PiSSA / OLoRA: each targeted projection's A and B (and the frozen start A0 = A, B0 = B) from
// the model's dequantized weight in Hugging Face row order, as PEFT's pissa_init / olora_init
// make them (model/lora_init_factors.h).
void start_from_base(LoraAdapter& lora, const Model& model, LoraInit init);

}  // namespace qlft
