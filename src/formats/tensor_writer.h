// The tensor-adding interface both file writers share (GgufWriter: Type = GgmlType, the shape
// innermost first; SafetensorsWriter: Type = DType, the shape outermost first). A tensor is checked
// when it is added (the name once, then the format's type and shape rules, then the byte count),
// its bytes are held until write() (HeldBytes) or asked for while write() runs; write() checks
// every deferred tensor has a fetch, then the format writes its file.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "formats/tensor_bytes.h"

namespace qlft {

template <class Type>
class TensorWriter {
 public:
  virtual ~TensorWriter() = default;

  // `data` holds nbytes of `type` (checked against the shape). copy=false keeps only the pointer,
  // which must then stay valid until write() (large exports).
  void add_tensor(const std::string& name, Type type, const std::vector<int64_t>& shape,
                  const void* data, uint64_t nbytes, bool copy = true) {
    check_new(name, type, shape, nbytes);
    keep(name, type, shape, HeldBytes::given(who_, name, data, nbytes, copy));
  }
  // A tensor whose bytes are asked for while write() runs (TensorFetch), each once: an export or
  // a checkpoint need not hold every tensor in memory at once.
  void add_tensor_deferred(const std::string& name, Type type, const std::vector<int64_t>& shape,
                           uint64_t nbytes) {
    check_new(name, type, shape, nbytes);
    keep(name, type, shape, HeldBytes::later(nbytes));
  }
  // Stores float values as F32, F16 or BF16 (round to nearest even); another type is refused.
  void add_tensor_f32(const std::string& name, const std::vector<int64_t>& shape,
                      const float* values, Type store = Type::F32) {
    const uint64_t n = shape_elements(shape);
    const DType t = float_dtype(store);
    std::vector<uint16_t> h;
    const void* bytes = f32_as_stored(
        t, values, n, &h, std::string(who_) + ": tensor '" + name + "': add_tensor_f32");
    add_tensor(name, store, shape, bytes, n * dtype_size(t));
  }

  size_t tensor_count() const { return tensors_.size(); }
  // Writes the file atomically; throws QLFT_ERR_IO naming path on failure. Deferred tensors are
  // fetched in the format's data order, each once.
  void write(const std::string& path, const TensorFetch& fetch = nullptr) const {
    for (const Tensor& t : tensors_) t.bytes.check_writable(who_, t.name, fetch);
    write_file(path, fetch);
  }

 protected:
  struct Tensor {
    std::string name;
    Type type;
    std::vector<int64_t> shape;
    HeldBytes bytes;  // add_tensor_deferred: fetched while writing
  };

  // who: the writer as errors name it ("GGUF writer").
  explicit TensorWriter(const char* who) : who_(who) {}

  // The format's rules for a new tensor (QLFT_ERR_INVALID_ARGUMENT naming it): the bytes its type
  // and shape need.
  virtual uint64_t tensor_bytes(const std::string& name, Type type,
                                const std::vector<int64_t>& shape) const = 0;
  virtual const char* type_name(Type type) const = 0;
  // The DType of a float store type (F32, F16, BF16; any other: DType::BOOL, which
  // add_tensor_f32 refuses).
  virtual DType float_dtype(Type store) const = 0;
  // The file itself, every tensor writable.
  virtual void write_file(const std::string& path, const TensorFetch& fetch) const = 0;

  const std::vector<Tensor>& tensors() const { return tensors_; }  // in the order added

 private:
  void check_new(const std::string& name, Type type, const std::vector<int64_t>& shape,
                 uint64_t nbytes) const {
    QLFT_CHECK_ARG(!name.empty(), "%s: tensor name is empty", who_);
    QLFT_CHECK_ARG(!names_.count(name), "%s: tensor '%s' added twice", who_, name.c_str());
    const uint64_t want = tensor_bytes(name, type, shape);
    QLFT_CHECK_ARG(nbytes == want, "%s: tensor '%s' has %llu bytes, shape and %s need %llu", who_,
                   name.c_str(), static_cast<unsigned long long>(nbytes), type_name(type),
                   static_cast<unsigned long long>(want));
  }
  void keep(const std::string& name, Type type, const std::vector<int64_t>& shape, HeldBytes b) {
    names_.insert(name);
    tensors_.push_back(Tensor{name, type, shape, std::move(b)});
  }

  const char* who_;
  std::vector<Tensor> tensors_;
  std::unordered_set<std::string> names_;
};

}  // namespace qlft
