#include "optim/state_dict.h"

#include <cstring>

#include "core/error.h"

namespace qlft {

namespace {
std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

uint64_t numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    QLFT_CHECK_ARG(d >= 0, "state tensor shape %s has a negative dimension",
                   shape_text(shape).c_str());
    n *= static_cast<uint64_t>(d);
  }
  return n;
}
}  // namespace

void StateDict::put(const std::string& name, DType dtype, std::vector<int64_t> shape,
                    const void* data, size_t nbytes) {
  uint64_t expect = numel(shape) * dtype_size(dtype);
  QLFT_CHECK_ARG(expect == nbytes, "state tensor %s: %zu bytes given for shape %s of %s",
                 name.c_str(), nbytes, shape_text(shape).c_str(), dtype_name(dtype));
  StateTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes.resize(nbytes);
  if (nbytes) std::memcpy(t.bytes.data(), data, nbytes);
  tensors_[name] = std::move(t);
}

void StateDict::put_f32(const std::string& name, const float* values, size_t n) {
  put(name, DType::F32, {static_cast<int64_t>(n)}, values, n * sizeof(float));
}

void StateDict::put_u8(const std::string& name, const uint8_t* values, size_t n) {
  put(name, DType::U8, {static_cast<int64_t>(n)}, values, n);
}

void StateDict::put_i64(const std::string& name, int64_t value) {
  put(name, DType::I64, {1}, &value, sizeof(value));
}

void StateDict::put_f64(const std::string& name, double value) {
  put(name, DType::F64, {1}, &value, sizeof(value));
}

void StateDict::put_string(const std::string& name, const std::string& value) {
  put(name, DType::U8, {static_cast<int64_t>(value.size())}, value.data(), value.size());
}

const StateTensor& StateDict::require(const std::string& name, DType dtype,
                                      const std::vector<int64_t>& shape) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end())
    throw_error(QLFT_ERR_FORMAT, "checkpoint state: tensor '%s' is missing", name.c_str());
  const StateTensor& t = it->second;
  if (t.dtype != dtype)
    throw_error(QLFT_ERR_FORMAT, "checkpoint state: tensor '%s' has dtype %s, expected %s",
                name.c_str(), dtype_name(t.dtype), dtype_name(dtype));
  if (t.shape != shape)
    throw_error(QLFT_ERR_FORMAT, "checkpoint state: tensor '%s' has shape %s, expected %s",
                name.c_str(), shape_text(t.shape).c_str(), shape_text(shape).c_str());
  if (t.bytes.size() != numel(shape) * dtype_size(dtype))
    throw_error(QLFT_ERR_FORMAT, "checkpoint state: tensor '%s' holds %zu bytes, expected %llu",
                name.c_str(), t.bytes.size(),
                static_cast<unsigned long long>(numel(shape) * dtype_size(dtype)));
  return t;
}

int64_t StateDict::get_i64(const std::string& name) const {
  int64_t v;
  std::memcpy(&v, require(name, DType::I64, {1}).bytes.data(), sizeof(v));
  return v;
}

double StateDict::get_f64(const std::string& name) const {
  double v;
  std::memcpy(&v, require(name, DType::F64, {1}).bytes.data(), sizeof(v));
  return v;
}

std::string StateDict::get_string(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end())
    throw_error(QLFT_ERR_FORMAT, "checkpoint state: tensor '%s' is missing", name.c_str());
  const StateTensor& t = it->second;
  if (t.dtype != DType::U8 || t.shape.size() != 1)
    throw_error(QLFT_ERR_FORMAT, "checkpoint state: tensor '%s' is not a U8 string", name.c_str());
  return std::string(t.bytes.begin(), t.bytes.end());
}

uint64_t StateDict::total_bytes() const {
  uint64_t n = 0;
  for (const auto& kv : tensors_) n += kv.second.bytes.size();
  return n;
}

}  // namespace qlft
