// Tokenized documents packed into fixed-length training rows.
//
// A document of n tokens gives n-1 (input, target) slots: input t[i], target t[i+1] (or -100
// when t[i+1] is not trained on). Slots are grouped into pieces of at most seq_len (a longer
// document is split, or truncated to its first piece); each piece is its own attention document:
// positions restart at 0 and its doc id differs from its neighbours', so attention never crosses
// a piece boundary. Rows are filled best-fit-decreasing (packing) or hold one piece (no packing);
// unused slots are padding: pad tokens, targets -100, a doc id of their own, positions 0, 1, ...
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "config/run_spec.h"  // Overflow

namespace qlft::data {

constexpr int32_t kIgnoreIndex = -100;

// All documents' tokens, flat. trained[i]: token i is a loss target.
struct TokenStore {
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;
  std::vector<uint64_t> offsets{0};  // document d is [offsets[d], offsets[d+1])
  size_t docs() const { return offsets.size() - 1; }
  uint64_t doc_len(size_t d) const { return offsets[d + 1] - offsets[d]; }
  void add(const std::vector<int32_t>& doc_ids, const std::vector<uint8_t>& doc_trained);
};

struct Piece {
  uint32_t doc;
  uint32_t begin;  // first slot inside the document
  uint32_t len;    // slots
};

struct PackOptions {
  int seq_len = 512;
  bool pack = true;
  Overflow overflow = Overflow::Split;
  uint64_t seed = 0;  // orders equal-length pieces (packing) or the rows (no packing)
};

struct PackCounts {
  uint64_t split_docs = 0;        // documents cut into several pieces
  uint64_t truncated_tokens = 0;  // slots dropped by Overflow::Truncate
  uint64_t untrained_pieces = 0;  // pieces dropped because none of their targets is trained
};

class PackedSet {
 public:
  PackedSet() = default;
  // docs: indices into store, in a (seeded) order.
  PackedSet(std::shared_ptr<const TokenStore> store, const std::vector<uint32_t>& docs,
            const PackOptions& opt, PackCounts* counts = nullptr);

  int seq_len() const { return seq_len_; }
  uint64_t rows() const { return row_offsets_.size() - 1; }
  uint64_t slots_used() const { return slots_used_; }
  uint64_t trained_slots() const { return trained_slots_; }
  // Fraction of the rows' token slots that hold a document token.
  double fill() const { return rows() ? double(slots_used_) / (double(rows()) * seq_len_) : 0.0; }
  const Piece* row_pieces(uint64_t r, size_t* n) const;
  // Writes row r into seq_len-long arrays.
  void fill_row(uint64_t r, int32_t pad_id, int32_t* tokens, int32_t* targets, int32_t* positions,
                int32_t* doc_ids) const;
  // Changes when the rows' contents change (checked when a saved iterator state is restored).
  uint64_t fingerprint() const { return fingerprint_; }

 private:
  std::shared_ptr<const TokenStore> store_;
  int seq_len_ = 0;
  std::vector<Piece> pieces_;             // in row order
  std::vector<uint64_t> row_offsets_{0};  // row r is pieces_[row_offsets_[r], row_offsets_[r+1])
  uint64_t slots_used_ = 0, trained_slots_ = 0, fingerprint_ = 0;
};

// Deterministic across platforms (std::shuffle's algorithm is not): splitmix64 + Fisher-Yates.
struct SplitMix64 {
  uint64_t s;
  explicit SplitMix64(uint64_t seed) : s(seed) {}
  uint64_t next();
  uint64_t below(uint64_t n) {  // uniform enough in [0, n)
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
  }
};
template <class T>
void seeded_shuffle(std::vector<T>& v, uint64_t seed) {
  SplitMix64 r(seed);
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[r.below(i)]);
}

}  // namespace qlft::data
