// The model's view of a data batch (model/llama.h's TokenBatch over data/batches.h's Batch), used
// by the SFT step and the preference passes alike.
#pragma once

#include "data/batches.h"
#include "model/llama.h"

namespace qlft {

// No copies: the view points into b. Empty positions / doc ids mean plain causal attention.
inline TokenBatch token_batch(const data::Batch& b) {
  TokenBatch t;
  t.batch = b.micro_batch;
  t.seq = b.seq_len;
  t.tokens = b.tokens.data();
  t.targets = b.targets.data();
  t.positions = b.positions.empty() ? nullptr : b.positions.data();
  t.doc_ids = b.doc_ids.empty() ? nullptr : b.doc_ids.data();
  return t;
}

}  // namespace qlft
