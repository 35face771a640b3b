// Micro-batches of packed rows: [micro_batch, seq_len] tokens, targets, positions and doc ids
// (the backend's AttnShape::doc_ids), in a seeded order that can be saved and restored.
//
// The row stream is epoch 0's permutation of the rows, then epoch 1's, ... (each epoch has its
// own permutation from (seed, epoch)); batches take consecutive rows from it, so a batch may
// span an epoch boundary and nothing is dropped. The final batch is topped up with padding rows
// (all targets ignored). The position is the number of rows consumed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/packing.h"

namespace qlft::data {

struct Batch {
  int micro_batch = 0, seq_len = 0;
  std::vector<int32_t> tokens, targets, positions, doc_ids;  // [micro_batch * seq_len]
  int rows = 0;                // rows holding data (the rest is padding)
  int64_t trained_tokens = 0;  // targets that are not ignored
  uint64_t epoch = 0;          // epoch of the first row
};

class BatchIterator {
 public:
  // shuffle = false keeps the rows' order every epoch (evaluation).
  BatchIterator(const PackedSet& set, int micro_batch, int epochs, uint64_t seed, bool shuffle,
                int32_t pad_id);

  // Fills b with the next batch; false when every epoch has been consumed.
  bool next(Batch& b);
  // Rows consumed so far, and the total for all epochs.
  uint64_t position() const { return pos_; }
  uint64_t total_rows() const { return set_->rows() * static_cast<uint64_t>(epochs_); }
  uint64_t total_batches() const;
  void seek(uint64_t position);
  // One line for a checkpoint; restore() checks it was made with the same data and settings.
  std::string state() const;
  void restore(const std::string& state);

 private:
  uint64_t row_at(uint64_t pos);  // the set's row index at stream position pos

  const PackedSet* set_;
  int micro_batch_, epochs_;
  uint64_t seed_;
  bool shuffle_;
  int32_t pad_id_;
  uint64_t pos_ = 0;
  int64_t perm_epoch_ = -1;
  std::vector<uint64_t> perm_;
};

}  // namespace qlft::data
