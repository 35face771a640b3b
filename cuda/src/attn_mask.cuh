// The attention mask both CUDA attention paths apply (k_attention.cu, k_attention_tc.cu):
// query qi of batch element `base / seq` sees key kj iff kj <= qi, both inside the sequence,
// and, with packed documents, both in one document (AttnShape::doc_ids), and with a sliding
// window kj > qi - window (AttnShape::window).
#pragma once

#include "kernels.h"

namespace qlft::cu {

__device__ __forceinline__ bool attends(const AttnArgs& a, int64_t base, int qi, int kj) {
  if (kj > qi || qi >= a.seq || kj >= a.seq) return false;
  if (a.window > 0 && kj <= qi - a.window) return false;  // sliding window (AttnShape::window)
  return !a.doc || a.doc[base + kj] == a.doc[base + qi];
}

}  // namespace qlft::cu
