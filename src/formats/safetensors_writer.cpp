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

void SafetensorsWriter::check_new(const std::string& name, DType dtype,
                                  const std::vector<int64_t>& shape, uint64_t nbytes) const {
  QLFT_CHECK_ARG(!name.empty() && name != "__metadata__",
                 "safetensors writer: invalid tensor name '%s'", name.c_str());
  QLFT_CHECK_ARG(!tensors_.count(name), "safetensors writer: tensor '%s' added twice",
                 name.c_str());
  const uint64_t n = checked_elements("safetensors writer", name, shape, 0);
  QLFT_CHECK_ARG(nbytes == n * dtype_size(dtype),
                 "safetensors writer: tensor '%s' has %llu bytes, shape and %s need %llu",
                 name.c_str(), static_cast<unsigned long long>(nbytes), dtype_name(dtype),
                 static_cast<unsigned long long>(n * dtype_size(dtype)));
}

void SafetensorsWriter::add(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                            const void* data, uint64_t nbytes, bool copy) {
  check_new(name, dtype, shape, nbytes);
  tensors_.emplace(
      name, Tensor{dtype, shape, HeldBytes::given("safetensors writer", name, data, nbytes, copy)});
}

void SafetensorsWriter::add_deferred(const std::string& name, DType dtype,
                                     const std::vector<int64_t>& shape, uint64_t nbytes) {
  check_new(name, dtype, shape, nbytes);
  tensors_.emplace(name, Tensor{dtype, shape, HeldBytes::later(nbytes)});
}

void SafetensorsWriter::add_f32(const std::string& name, const std::vector<int64_t>& shape,
                                const float* values, DType store) {
  const uint64_t n = shape_elements(shape);
  std::vector<uint16_t> h;
  const void* bytes =
      f32_as_stored(store, values, n, &h, "safetensors writer: tensor '" + name + "': add_f32");
  add(name, store, shape, bytes, n * dtype_size(store));
}

uint64_t SafetensorsWriter::data_bytes() const {
  uint64_t n = 0;
  for (const auto& [name, t] : tensors_) n += t.bytes.nbytes;
  return n;
}

std::vector<std::string> SafetensorsWriter::names() const {
  std::vector<std::string> v;
  for (const auto& [name, t] : tensors_) v.push_back(name);
  return v;
}

bool safetensors_data_before(DType a, const std::string& a_name, DType b,
                             const std::string& b_name) {
  if (dtype_size(a) != dtype_size(b)) return dtype_size(a) > dtype_size(b);
  return a_name < b_name;
}

void SafetensorsWriter::write(const std::string& path, const TensorFetch& fetch) const {
  std::vector<std::pair<const std::string*, const Tensor*>> order;
  for (const auto& [name, t] : tensors_) {
    t.bytes.check_writable("safetensors writer", name, fetch);
    order.emplace_back(&name, &t);
  }
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return safetensors_data_before(a.second->dtype, *a.first, b.second->dtype, *b.first);
  });
  nlohmann::json h = nlohmann::json::object();
  if (!metadata_.empty()) h["__metadata__"] = metadata_;
  uint64_t off = 0;
  for (const auto& [name, t] : order) {
    h[*name] = {{"dtype", safetensors_dtype_name(t->dtype)},
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
  for (const auto& [name, t] : order) f.write(t->bytes.get(*name, fetch), t->bytes.nbytes);
  f.commit();
}

void write_safetensors_index(const std::string& path, uint64_t total_size,
                             const std::map<std::string, std::string>& weight_map) {
  nlohmann::json j = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
  write_file_atomic(path, j.dump(2) + "\n");
}

}  // namespace qlft
