#include "formats/safetensors_writer.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/atomic_file.h"
#include "formats/safetensors.h"

namespace qlft {

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

uint64_t SafetensorsWriter::tensor_bytes(const std::string& name, DType dtype,
                                         const std::vector<int64_t>& shape) const {
  QLFT_CHECK_ARG(name != "__metadata__", "safetensors writer: invalid tensor name '%s'",
                 name.c_str());
  return checked_elements("safetensors writer", name, shape, 0) * dtype_size(dtype);
}

uint64_t SafetensorsWriter::data_bytes() const {
  uint64_t n = 0;
  for (const Tensor& t : tensors()) n += t.bytes.nbytes;
  return n;
}

std::vector<std::string> SafetensorsWriter::names() const {
  std::vector<std::string> v;
  for (const Tensor& t : tensors()) v.push_back(t.name);
  std::sort(v.begin(), v.end());
  return v;
}

bool safetensors_data_before(DType a, const std::string& a_name, DType b,
                             const std::string& b_name) {
  if (dtype_size(a) != dtype_size(b)) return dtype_size(a) > dtype_size(b);
  return a_name < b_name;
}

void SafetensorsWriter::write_file(const std::string& path, const TensorFetch& fetch) const {
  std::vector<const Tensor*> order;
  for (const Tensor& t : tensors()) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const Tensor* a, const Tensor* b) {
    return safetensors_data_before(a->type, a->name, b->type, b->name);
  });
  nlohmann::json h = nlohmann::json::object();
  if (!metadata_.empty()) h["__metadata__"] = metadata_;
  uint64_t off = 0;
  for (const Tensor* t : order) {
    h[t->name] = {{"dtype", safetensors_dtype_name(t->type)},
                  {"shape", t->shape},
                  {"data_offsets", {off, off + t->bytes.nbytes}}};
    off += t->bytes.nbytes;
  }
  std::string header = h.dump();
  // The spec allows trailing spaces in the header; padding to 8 keeps the data 8-byte aligned.
  header.append((8 - header.size() % 8) % 8, ' ');
  AtomicFile f(path);
  uint64_t hlen = header.size();
  f.write(&hlen, 8);
  f.write(header);
  for (const Tensor* t : order) f.write(t->bytes.get(t->name, fetch), t->bytes.nbytes);
  f.commit();
}

void write_safetensors_index(const std::string& path, uint64_t total_size,
                             const std::map<std::string, std::string>& weight_map) {
  nlohmann::json j = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
  write_file_atomic(path, j.dump(2) + "\n");
}

}  // namespace qlft
