// safetensors reader (single file, or shards listed by model.safetensors.index.json), by mmap.
// Header, dtypes, shapes and offsets are validated before any tensor byte is touched.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "formats/mapped_file.h"

namespace qlft {

struct SafeTensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // outermost first, as PyTorch
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
  const std::string* file = nullptr;  // path of the shard holding it
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// Parses the dtype names of the safetensors spec; throws QLFT_ERR_FORMAT for unsupported ones.
DType safetensors_dtype(const std::string& name, const std::string& where);
const char* safetensors_dtype_name(DType t);

class SafetensorsFile : public MappedReader {
 public:
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  const std::vector<SafeTensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  explicit SafetensorsFile(const std::string& file);  // maps and parses
  std::vector<SafeTensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a model: one file, or every shard of an index.
class SafetensorsSet {
 public:
  // path: a .safetensors file, a model.safetensors.index.json, or a directory holding either
  // model.safetensors or model.safetensors.index.json.
  static std::unique_ptr<SafetensorsSet> open(const std::string& path);

  const SafeTensorInfo* find(const std::string& name) const;
  const std::vector<const SafeTensorInfo*>& tensors() const { return all_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  void add(std::unique_ptr<SafetensorsFile> f);
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<const SafeTensorInfo*> all_;
  std::unordered_map<std::string, const SafeTensorInfo*> index_;
};

}  // namespace qlft
