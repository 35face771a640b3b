// Open-addressing hash map from a token-id pair to a small payload: the inner loop of BPE and
// SPM merging looks up every adjacent pair, so this avoids std::unordered_map's node chasing.
#pragma once

#include <cstdint>
#include <vector>

namespace qlft::tok {

struct PairValue {
  int32_t rank = 0;    // BPE: merge rank (lower merges first); SPM: unused
  int32_t merged = 0;  // id of the merged token
};

class PairMap {
 public:
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  // Keeps the first value inserted for a key (the lowest rank when inserted in rank order).
  void insert(int32_t a, int32_t b, PairValue v) {
    if (key(a, b) == kEmpty) return;  // (-1, -1): not token ids
    if ((size_ + 1) * 2 > slots_.size()) grow();
    if (place(key(a, b), v)) ++size_;
  }

  const PairValue* find(int32_t a, int32_t b) const {
    if (slots_.empty()) return nullptr;
    uint64_t k = key(a, b);
    size_t mask = slots_.size() - 1;
    for (size_t i = hash(k) & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.k == kEmpty) return nullptr;
      if (s.k == k) return &s.v;
    }
  }

  size_t size() const { return size_; }

 private:
  // 16 bytes a slot (a SmolLM2 merge table: 2 MiB, not 3): an empty slot's key is that of the
  // pair (-1, -1), which no token ids make.
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  struct Slot {
    uint64_t k = kEmpty;
    PairValue v;
  };
  static uint64_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
  }
  bool place(uint64_t k, PairValue v) {
    size_t mask = slots_.size() - 1;
    for (size_t i = hash(k) & mask;; i = (i + 1) & mask) {
      Slot& s = slots_[i];
      if (s.k == kEmpty) {
        s = Slot{k, v};
        return true;
      }
      if (s.k == k) return false;
    }
  }
  void grow() {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(old.empty() ? 1024 : old.size() * 2, Slot{});
    for (const Slot& s : old)
      if (s.k != kEmpty) place(s.k, s.v);
  }

  std::vector<Slot> slots_;
  size_t size_ = 0;
};

}  // namespace qlft::tok
