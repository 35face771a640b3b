// Named tensors that carry optimizer, scheduler and loss-scaler state into and out of a
// checkpoint. The trainer writes each entry as one tensor of its checkpoint file (dtype and
// shape map directly onto safetensors) and hands the same entries back on resume.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace qlft {

struct StateTensor {
  DType dtype = DType::U8;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

class StateDict {
 public:
  // Copies nbytes (= numel(shape) * dtype_size(dtype)) from data; replaces an existing entry.
  void put(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data,
           size_t nbytes);
  void put_f32(const std::string& name, const float* values, size_t n);
  void put_u8(const std::string& name, const uint8_t* values, size_t n);
  void put_i64(const std::string& name, int64_t value);                // shape [1]
  void put_f64(const std::string& name, double value);                 // shape [1]
  void put_string(const std::string& name, const std::string& value);  // U8 bytes

  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // The entry, checked: throws QLFT_ERR_FORMAT naming the tensor when it is missing or its
  // dtype or shape differs from what is expected.
  const StateTensor& require(const std::string& name, DType dtype,
                             const std::vector<int64_t>& shape) const;
  int64_t get_i64(const std::string& name) const;
  double get_f64(const std::string& name) const;
  std::string get_string(const std::string& name) const;

  const std::map<std::string, StateTensor>& tensors() const { return tensors_; }
  size_t size() const { return tensors_.size(); }
  uint64_t total_bytes() const;

 private:
  std::map<std::string, StateTensor> tensors_;
};

// A training part whose state a checkpoint carries (the optimizer, the LR schedule, the loss
// scaler): its entries, named "<prefix><field>", go into a StateDict and come back from one.
class CheckpointState {
 public:
  virtual ~CheckpointState() = default;
  virtual void save_state(StateDict& out, const std::string& prefix) const = 0;
  // Restores what save_state wrote. Everything is validated before anything changes: a missing
  // entry or a value that does not fit throws QLFT_ERR_FORMAT naming it, and the part is left as
  // it was.
  virtual void load_state(const StateDict& in, const std::string& prefix) = 0;
};

}  // namespace qlft
