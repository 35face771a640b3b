// Compact storage for a vocabulary's strings and a text -> id index over them. A vocabulary is
// tens of thousands of short strings that live as long as the tokenizer (through a whole training
// run): one std::string each plus a node-based hash map cost ~10 MiB for SmolLM2's 49k tokens;
// one block of bytes with 4-byte ends and an open-addressing table of id pairs cost ~1.5 MiB.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace qlft::tok {

// Strings numbered 0..size()-1, stored back to back.
class TextTable {
 public:
  // False (nothing added) when the table would pass 4 GiB of text.
  bool push(std::string_view s) {
    if (bytes_.size() + s.size() > UINT32_MAX) return false;
    bytes_.append(s);
    ends_.push_back(static_cast<uint32_t>(bytes_.size()));
    return true;
  }
  std::string_view at(size_t i) const {
    uint32_t begin = i ? ends_[i - 1] : 0;
    return std::string_view(bytes_.data() + begin, ends_[i] - begin);
  }
  size_t size() const { return ends_.size(); }
  void clear() {
    std::string().swap(bytes_);
    std::vector<uint32_t>().swap(ends_);
  }
  void shrink_to_fit() {
    bytes_.shrink_to_fit();
    ends_.shrink_to_fit();
  }

 private:
  std::string bytes_;
  std::vector<uint32_t> ends_;
};

// Text -> int32 value, where each key is a string of a TextTable (named by its index there), so
// the index stores no text. Open addressing, load factor at most 1/2.
class TextIndex {
 public:
  // Adds key -> value; an existing equal text keeps its first value, or takes this one when
  // replace is set.
  void insert(const TextTable& keys, int32_t key, int32_t value, bool replace) {
    if ((size_ + 1) * 2 > slots_.size()) grow(keys);
    std::string_view s = keys.at(key);
    for (size_t i = hash(s) & mask();; i = (i + 1) & mask()) {
      Slot& slot = slots_[i];
      if (slot.key < 0) {
        slot = Slot{key, value};
        ++size_;
        return;
      }
      if (keys.at(slot.key) == s) {
        if (replace) slot = Slot{key, value};
        return;
      }
    }
  }
  // The value of text, -1 when it is not a key.
  int32_t find(const TextTable& keys, std::string_view s) const {
    if (slots_.empty()) return -1;
    for (size_t i = hash(s) & mask();; i = (i + 1) & mask()) {
      const Slot& slot = slots_[i];
      if (slot.key < 0) return -1;
      if (keys.at(slot.key) == s) return slot.value;
    }
  }
  // f(key, value) for every entry, in no particular order.
  template <class F>
  void for_each(F&& f) const {
    for (const Slot& s : slots_)
      if (s.key >= 0) f(s.key, s.value);
  }
  size_t size() const { return size_; }
  void clear() {
    std::vector<Slot>().swap(slots_);
    size_ = 0;
  }

 private:
  struct Slot {
    int32_t key = -1;  // index into the TextTable; -1: empty
    int32_t value = -1;
  };
  static size_t hash(std::string_view s) { return std::hash<std::string_view>{}(s); }
  size_t mask() const { return slots_.size() - 1; }
  void grow(const TextTable& keys) {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(old.empty() ? 1024 : old.size() * 2, Slot{});
    for (const Slot& s : old) {
      if (s.key < 0) continue;
      size_t i = hash(keys.at(s.key)) & mask();
      while (slots_[i].key >= 0) i = (i + 1) & mask();
      slots_[i] = s;
    }
  }

  std::vector<Slot> slots_;
  size_t size_ = 0;
};

}  // namespace qlft::tok
