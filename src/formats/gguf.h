// GGUF v2/v3 reader over a memory map. Everything is validated while parsing: a hostile file
// gets QLFT_ERR_FORMAT naming the file and the key or tensor, never an out-of-bounds read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "formats/mapped_file.h"

namespace qlft {

enum class GgufType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};
const char* gguf_type_name(GgufType t);
// Bytes of one scalar of type t; 0 for STRING and ARRAY.
size_t gguf_scalar_size(GgufType t);

// The elements of a STRING ARRAY, read from the map on access (valid while the GgufFile lives):
// 4 bytes an element where a list of views took 16 (a tokenizer's 100k tokens and merges stay in
// memory through a whole run).
class GgufStrings {
 public:
  size_t size() const { return offsets_.size(); }
  std::string_view operator[](size_t i) const {
    uint64_t len;
    std::memcpy(&len, base_ + offsets_[i], sizeof len);  // GGUF is little-endian, as qlft's hosts
    return std::string_view(base_ + offsets_[i] + sizeof len, len);
  }
  class const_iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = std::string_view;
    using difference_type = std::ptrdiff_t;
    using pointer = void;
    using reference = std::string_view;
    const_iterator(const GgufStrings* s, size_t i) : s_(s), i_(i) {}
    std::string_view operator*() const { return (*s_)[i_]; }
    const_iterator& operator++() {
      ++i_;
      return *this;
    }
    const_iterator operator++(int) { return const_iterator(s_, i_++); }
    bool operator==(const const_iterator& o) const { return i_ == o.i_; }
    bool operator!=(const const_iterator& o) const { return i_ != o.i_; }

   private:
    const GgufStrings* s_;
    size_t i_;
  };
  const_iterator begin() const { return const_iterator(this, 0); }
  const_iterator end() const { return const_iterator(this, size()); }

 private:
  friend class GgufFile;
  const char* base_ = nullptr;     // the first element's length field in the map
  std::vector<uint32_t> offsets_;  // of each element's length field from base_
};

// One metadata value. Scalars are decoded; arrays keep a pointer into the map (numbers) or read
// their strings from it (GgufStrings), both valid while the GgufFile lives.
struct GgufValue {
  GgufType type = GgufType::U8;
  GgufType elem_type = GgufType::U8;    // for ARRAY (ARRAY: nested arrays, validated but not kept)
  uint64_t u = 0;                       // unsigned integers and BOOL
  int64_t i = 0;                        // signed integers
  double f = 0;                         // floats
  std::string_view str;                 // STRING
  uint64_t count = 0;                   // ARRAY length
  const uint8_t* array_data = nullptr;  // numeric ARRAY elements, packed little-endian
  GgufStrings strings;                  // STRING ARRAY elements

  bool is_integer() const;
  bool is_number() const;
  // Element i of a numeric array as double / int64.
  double array_f(uint64_t idx) const;
  int64_t array_i(uint64_t idx) const;

 private:
  void check_index(uint64_t idx) const;  // throws unless a numeric array holds element idx
};

struct GgufTensorInfo {
  std::string name;
  uint32_t n_dims = 0;           // 0..4
  int64_t ne[4] = {1, 1, 1, 1};  // ne[0] is the innermost (contiguous) dimension
  uint32_t type = 0;             // GgmlType id
  uint64_t offset = 0;           // relative to the data section
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // into the map
  int64_t numel() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

class GgufFile : public MappedReader {
 public:
  // Maps and parses path; throws QLFT_ERR_IO / QLFT_ERR_FORMAT.
  static std::unique_ptr<GgufFile> open(const std::string& path);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }

  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  const GgufValue* find(const std::string& key) const;
  // Typed getters: throw QLFT_ERR_FORMAT naming the key when missing (no default) or mistyped.
  std::string get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& def) const;
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t def) const;
  // get_int that also requires lo <= value <= hi (QLFT_ERR_FORMAT naming the key otherwise).
  int64_t get_int_in(const std::string& key, int64_t lo, int64_t hi) const;
  int64_t get_int_in(const std::string& key, int64_t lo, int64_t hi, int64_t def) const;
  double get_float(const std::string& key, double def) const;
  bool get_bool(const std::string& key, bool def) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  // Takes the tensor data's pages out of the resident set (MappedFile::drop_pages): after the
  // loader copied the weights out, the map only serves metadata. Never throws.
  void drop_tensor_pages() const noexcept { file_->drop_pages(data_start_, file_->size()); }
  // The same for the metadata: once the tokenizer is built from it, the rest of a run reads a
  // few keys at most (which page back in from the file). Never throws.
  void drop_metadata_pages() const noexcept { file_->drop_pages(0, data_start_); }
  const GgufTensorInfo* find_tensor(const std::string& name) const;

 private:
  explicit GgufFile(const std::string& file);  // maps and parses

  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_start_ = 0;  // of the tensor data section
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::unordered_map<std::string, size_t> kv_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace qlft
