// offload.params=cpu on a device backend (backend=cuda): the frozen base weights stay in host
// memory and a unit (model/weight_stream.h: the embedding, one layer, the head) is copied to the
// device only while the runner uses it, the next unit's copy queued behind the current one's.
//
// The host bytes of the storage Buffers (QWeight data/absmax/nested_absmax/code/nested_code/
// scb, norms, biases) are read from `host`: another model of the same shapes whose const
// Buffers stay as they are (the shared model, train/weight_placement.h: no second copy of the
// weights), or the model itself, whose Buffers then move into this stream. acquire(u, next)
// installs u's Buffers in the model as device Buffers (category weights, copied from the host
// ones on the backend's stream, which orders them before the kernels that read them) and
// starts copying `next`; release(u) frees u's. At most the unit in use and the next one are on the
// device. The CUDA backend uses such device weights in place (no resident copy), and the runner
// does the same for norms.
//
// Ownership: the stream lives in model.stream while the trainer that made it lives (its device
// memory is that trainer's backend's); restore() gives the model its host Buffers back (those
// it moved), which the trainer does when it ends. `host`, when another model, must outlive the
// stream unchanged.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/memory.h"
#include "model/weight_stream.h"

namespace qlft {

struct Model;

class DeviceWeightStream final : public WeightStream {
 public:
  // Sets model.stream (which must be empty) to a stream of host's base weights (&host == &model:
  // moved into the stream; otherwise read in place, host having model's shapes and kinds).
  static std::shared_ptr<DeviceWeightStream> offload(Model& model, const Model& host,
                                                     DeviceAllocator* device);
  ~DeviceWeightStream() override;

  void acquire(int u, int next) override;
  void release(int u) noexcept override;
  std::string describe() const override;
  // The model gets back the host Buffers moved from it. Never throws.
  void restore() noexcept;

  uint64_t host_bytes() const { return host_bytes_; }      // the weights kept on the host
  uint64_t copied_bytes() const { return copied_bytes_; }  // host -> device so far

 private:
  struct Slot {
    Buffer* model_buf;   // the Buffer in the model it fills
    Buffer moved;        // the weights, moved out of the model (host is the model)
    const Buffer* read;  // or another model's, read in place
    const Buffer& host() const { return read ? *read : moved; }
  };
  struct Copy {  // a unit on the device, installed in the model or copied ahead
    int unit = kNoUnit;
    std::vector<Buffer> bufs;  // per slot of the unit's groups, in order
  };
  DeviceWeightStream(Model& model, const Model& host, DeviceAllocator* device);
  Copy start(int u);
  void install(Copy& c);
  void uninstall() noexcept;
  template <class F>
  void each_slot(int u, const F& f);

  Model* model_;
  DeviceAllocator* device_;
  std::vector<std::vector<Slot>> groups_;      // 0 embedding, 1..L layers, L+1 final norm + head
  std::vector<std::vector<int>> unit_groups_;  // unit -> groups
  Copy installed_, ahead_;
  int held_ = kNoUnit;
  bool keep_ = false;  // acquire(u, u): u stays installed after its release
  bool restored_ = false;
  uint64_t host_bytes_ = 0, copied_bytes_ = 0;
};

}  // namespace qlft
