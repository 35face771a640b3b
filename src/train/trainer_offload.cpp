// The trainer's offload settings (offload.optimizer, offload.params = none | cpu | nvme).
//
// On a device backend (backend=cuda), cpu means host memory: offload.params=cpu streams each
// unit of base weights to the device while it is used (offload/device_weight_stream.h), and
// offload.optimizer=cpu keeps the optimizer state and step on the host.
//
// offload.optimizer=nvme needs nothing here: the trainer hands the optimizer an NVMe state store
// (src/parallel/nvme_state_store.h; state_stores in trainer.cpp).
// offload.params=nvme writes the base weights into a file (src/parallel/nvme_weight_stream.h)
// before the first step, read back into the trainer's own model (train/weight_placement.h).
#include <memory>

#include "core/error.h"
#include "core/log.h"
#include "parallel/data_parallel.h"
#include "parallel/device_weight_stream.h"
#include "parallel/nvme_weight_stream.h"
#include "train/trainer.h"

namespace qlft {

void Trainer::init_offload(const RunSpec& spec) {
  const OffloadSpec& os = spec.offload;
  const bool device = backend_->device_memory() != nullptr;
  for (const auto& [key, value] :
       {std::pair<const char*, OffloadTarget>{"offload.optimizer", os.optimizer},
        {"offload.params", os.params}}) {
    if (value == OffloadTarget::Cpu && !device)
      log_message(QLFT_LOG_WARN,
                  "%s=cpu means nothing on the cpu backend (the state already lives in host "
                  "memory): treated as none",
                  key);
  }
  // offload.optimizer=cpu on a device backend: the trainer keeps the host step (optimizer state
  // in host memory, gradients copied out per pass; see the constructor).
  if (os.params == OffloadTarget::Cpu && device) {
    // The stream installs device Buffers in the trainer's own model (train/weight_placement.h)
    // from the host bytes: the shared model's, read in place (the own model is a skeleton), or
    // a deferred own model's, loaded and moved into the stream. Its device memory is this
    // trainer's backend's.
    const Model& host = placement_->make_resident();
    device_stream_ =
        DeviceWeightStream::offload(placement_->own(), host, backend_->device_memory());
    log_message(QLFT_LOG_INFO, "%s", device_stream_->describe().c_str());
    return;
  }
  if (os.params != OffloadTarget::Nvme) return;
  // The host bytes (the shared model's, or a deferred own model's loaded first) go to the file;
  // the stream lives in the trainer's own model and ends with the trainer.
  const Model& host = placement_->make_resident();
  NvmeWeightStream::offload(placement_->own(), host, tracker_, os.dir, os.buffers);
}

void Trainer::end_offload() noexcept {
  // offload.params=cpu: the stream's device units are this trainer's backend's; they go before
  // the backend does.
  if (!device_stream_) return;
  device_stream_->restore();
  placement_->own().stream.reset();
  device_stream_.reset();
}

}  // namespace qlft
