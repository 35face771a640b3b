// safetensors writer: an 8-byte header length, a JSON header ({name: {dtype, shape,
// data_offsets}}, plus string-to-string __metadata__) padded with spaces to a multiple of 8, then
// the tensor bytes. Tensors are laid out by decreasing element size, then name, so every tensor
// starts aligned to its element size (as the reference implementation does). Written atomically.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "formats/tensor_bytes.h"

namespace qlft {

class SafetensorsWriter {
 public:
  void set_metadata(const std::string& key, const std::string& value);
  // shape is outermost first (PyTorch order); data holds nbytes = numel * dtype_size(dtype).
  // copy=false keeps only the pointer, which must stay valid until write().
  void add(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
           const void* data, uint64_t nbytes, bool copy = true);
  // A tensor whose bytes are asked for while write() runs (TensorFetch), in data order: they
  // need not all be in memory at once (a checkpoint gathered from several ranks).
  void add_deferred(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                    uint64_t nbytes);
  // Stores float values as F32, F16 or BF16 (round to nearest even).
  void add_f32(const std::string& name, const std::vector<int64_t>& shape, const float* values,
               DType store = DType::F32);

  size_t tensor_count() const { return tensors_.size(); }
  // Sum of the tensor bytes (what an index's metadata.total_size counts).
  uint64_t data_bytes() const;
  std::vector<std::string> names() const;
  // Writes the file atomically; throws QLFT_ERR_IO naming path on failure. Deferred tensors are
  // fetched in data order (safetensors_data_before), each once.
  void write(const std::string& path, const TensorFetch& fetch = nullptr) const;

 private:
  struct Tensor {
    DType dtype;
    std::vector<int64_t> shape;
    HeldBytes bytes;  // add_deferred: fetched while writing
  };
  void check_new(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                 uint64_t nbytes) const;

  std::map<std::string, Tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The order of the tensors' data in the file: wider dtypes first (so every tensor is aligned to
// its element size), then by name.
bool safetensors_data_before(DType a, const std::string& a_name, DType b,
                             const std::string& b_name);

// Writes a model.safetensors.index.json: {"metadata": {"total_size": N}, "weight_map":
// {tensor: shard file name}}.
void write_safetensors_index(const std::string& path, uint64_t total_size,
                             const std::map<std::string, std::string>& weight_map);

}  // namespace qlft
