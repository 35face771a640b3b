// What the file writers (gguf_writer.h, safetensors_writer.h) share about the tensors they are
// given: the element count of a shape, each dimension checked, and the bytes held until write().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace qlft {

// fetch(name): the bytes of a deferred tensor, valid until the next call.
using TensorFetch = std::function<const void*(const std::string& name)>;

// A tensor's bytes until its file is written: the caller's pointer (which must then stay valid
// until write()), a copy, or none yet (deferred: fetched while the file is written).
struct HeldBytes {
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
  std::shared_ptr<std::vector<uint8_t>> owned;
  bool deferred = false;

  // data (nbytes of it; NULL only when nbytes is 0), copied where `copy`. `writer` and `name`
  // name the tensor in the error (QLFT_ERR_INVALID_ARGUMENT).
  static HeldBytes given(const char* writer, const std::string& name, const void* data,
                         uint64_t nbytes, bool copy);
  static HeldBytes later(uint64_t nbytes) { return HeldBytes{nullptr, nbytes, nullptr, true}; }

  // Before a file is begun: a deferred tensor needs a fetch (QLFT_ERR_INVALID_ARGUMENT).
  void check_writable(const char* writer, const std::string& name, const TensorFetch& fetch) const;
  // The bytes to write, fetched for a deferred tensor.
  const void* get(const std::string& name, const TensorFetch& fetch) const {
    return deferred ? fetch(name) : data;
  }
};

// The element count of shape, each dimension checked to [min_dim, 2^40]
// (QLFT_ERR_INVALID_ARGUMENT "<writer>: tensor '<name>' dimension <d>").
uint64_t checked_elements(const char* writer, const std::string& name,
                          const std::vector<int64_t>& shape, int64_t min_dim);

// The element count of shape with negative dimensions as 0 (what the float conversions size
// before the writer checks the shape).
uint64_t shape_elements(const std::vector<int64_t>& shape);

}  // namespace qlft
