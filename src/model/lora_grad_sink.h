// Where a LlamaRunner's backward puts the LoRA gradients of each projection, when they are not
// simply accumulated into the adapter's full dA / dB: ZeRO-2 (dist/zero2_grads.h) keeps only
// this rank's share of them and sends the rest away as soon as a projection's backward is done.
//
// For each targeted projection of a layer, in kBackwardProjOrder, backward calls begin(layer, p)
// for the two arrays linear_bwd adds dA and dB into, runs the projection's backward, then calls
// end(layer, p): that projection's gradients of this pass are complete. Every rank of a
// distributed run makes the same calls in the same order (they are a function of the model and
// the LoRA targets only), so end() may run a collective.
#pragma once

#include "model/model.h"

namespace qlft {

// The order in which LlamaRunner::layer_bwd runs the projections' backward.
constexpr Proj kBackwardProjOrder[kProjCount] = {Proj::Down, Proj::Gate, Proj::Up, Proj::O,
                                                 Proj::Q,    Proj::K,    Proj::V};

struct LoraGradTarget {
  float* dA = nullptr;  // [r, in]: linear_bwd adds into it
  float* dB = nullptr;  // [out, r]
};

class LoraGradSink {
 public:
  virtual ~LoraGradSink() = default;
  virtual LoraGradTarget begin(int layer, Proj p) = 0;
  virtual void end(int layer, Proj p) = 0;
};

}  // namespace qlft
