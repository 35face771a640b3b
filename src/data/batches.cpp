#include "data/batches.h"

#include <cinttypes>
#include <cstdio>
#include <numeric>

#include "core/error.h"

namespace qlft::data {

BatchIterator::BatchIterator(const PackedSet& set, int micro_batch, int epochs, uint64_t seed,
                             bool shuffle, int32_t pad_id)
    : set_(&set),
      micro_batch_(micro_batch),
      epochs_(epochs),
      seed_(seed),
      shuffle_(shuffle),
      pad_id_(pad_id) {
  QLFT_CHECK_ARG(micro_batch >= 1, "micro batch must be positive, got %d", micro_batch);
  QLFT_CHECK_ARG(epochs >= 1, "data.epochs must be positive, got %d", epochs);
}

uint64_t BatchIterator::total_batches() const {
  return (total_rows() + micro_batch_ - 1) / micro_batch_;
}

uint64_t BatchIterator::row_at(uint64_t pos) {
  const uint64_t R = set_->rows();
  const int64_t epoch = static_cast<int64_t>(pos / R);
  if (!shuffle_) return pos % R;
  if (epoch != perm_epoch_) {
    perm_.resize(R);
    std::iota(perm_.begin(), perm_.end(), uint64_t(0));
    seeded_shuffle(perm_, seed_ * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(epoch) + 1);
    perm_epoch_ = epoch;
  }
  return perm_[pos % R];
}

bool BatchIterator::next(Batch& b) {
  if (pos_ >= total_rows()) return false;
  const int S = set_->seq_len();
  const size_t n = static_cast<size_t>(micro_batch_) * S;
  b.micro_batch = micro_batch_;
  b.seq_len = S;
  b.tokens.resize(n);
  b.targets.resize(n);
  b.positions.resize(n);
  b.doc_ids.resize(n);
  b.rows = 0;
  b.trained_tokens = 0;
  b.epoch = pos_ / set_->rows();
  for (int i = 0; i < micro_batch_; ++i) {
    const size_t o = static_cast<size_t>(i) * S;
    if (pos_ < total_rows()) {
      set_->fill_row(row_at(pos_), pad_id_, &b.tokens[o], &b.targets[o], &b.positions[o],
                     &b.doc_ids[o]);
      ++pos_;
      ++b.rows;
    } else {
      for (int k = 0; k < S; ++k) {
        b.tokens[o + k] = pad_id_;
        b.targets[o + k] = kIgnoreIndex;
        b.positions[o + k] = k;
        b.doc_ids[o + k] = 0;
      }
    }
  }
  for (int32_t t : b.targets) b.trained_tokens += t != kIgnoreIndex;
  return true;
}

void BatchIterator::seek(uint64_t position) {
  QLFT_CHECK_ARG(position <= total_rows(),
                 "data position %" PRIu64 " is past the end (%" PRIu64 " rows in %d epochs)",
                 position, total_rows(), epochs_);
  pos_ = position;
}

std::string BatchIterator::state() const {
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "qlft-data v1 pos=%" PRIu64 " rows=%" PRIu64 " seed=%" PRIu64 " fp=%016" PRIx64,
                pos_, set_->rows(), seed_, set_->fingerprint());
  return buf;
}

void BatchIterator::restore(const std::string& s) {
  uint64_t pos = 0, rows = 0, seed = 0, fp = 0;
  int used = 0;
  if (std::sscanf(s.c_str(),
                  "qlft-data v1 pos=%" SCNu64 " rows=%" SCNu64 " seed=%" SCNu64 " fp=%" SCNx64 "%n",
                  &pos, &rows, &seed, &fp, &used) != 4 ||
      static_cast<size_t>(used) != s.size())
    throw_error(QLFT_ERR_FORMAT, "data iterator state '%s' is not one this version wrote",
                s.c_str());
  if (rows != set_->rows() || fp != set_->fingerprint() || seed != seed_)
    throw_error(QLFT_ERR_INVALID_ARGUMENT,
                "the checkpoint's data position was saved with different data or data settings "
                "(rows %" PRIu64 " vs %" PRIu64 ", seed %" PRIu64 " vs %" PRIu64 ")",
                rows, set_->rows(), seed, seed_);
  seek(pos);
}

}  // namespace qlft::data
