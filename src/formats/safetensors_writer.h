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
#include "formats/tensor_writer.h"

namespace qlft {

class SafetensorsWriter : public TensorWriter<DType> {
 public:
  // Tensors (TensorWriter: add_tensor, add_tensor_deferred, add_tensor_f32, write): the shape
  // outermost first (PyTorch order), any number of dims (none: a scalar), numel * dtype_size
  // bytes; written, and deferred ones fetched, in data order (safetensors_data_before).
  SafetensorsWriter() : TensorWriter("safetensors writer") {}

  void set_metadata(const std::string& key, const std::string& value);
  // Sum of the tensor bytes (what an index's metadata.total_size counts).
  uint64_t data_bytes() const;
  std::vector<std::string> names() const;  // sorted

 private:
  uint64_t tensor_bytes(const std::string& name, DType dtype,
                        const std::vector<int64_t>& shape) const override;
  const char* type_name(DType dtype) const override { return dtype_name(dtype); }
  DType float_dtype(DType store) const override { return store; }
  void write_file(const std::string& path, const TensorFetch& fetch) const override;

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
