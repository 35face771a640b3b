// The trainer's offload settings (offload.optimizer, offload.params = none | cpu | nvme).
//
// On a device backend (backend=cuda), cpu means host memory: offload.params=cpu streams each
// unit of base weights to the device while it is used (offload/device_weight_stream.h), and
// offload.optimizer=cpu keeps the optimizer state and step on the host.
//
// offload.optimizer=nvme needs nothing here: OptimSettings::from_config reads it and the
// optimizer puts its state in an NVMe store (src/parallel/nvme_state_store.h).
// offload.params=nvme moves the model's base weights into a file (src/parallel/
// nvme_weight_stream.h) before the first step.
#include <memory>

#include "config/config.h"
#include "core/error.h"
#include "core/log.h"
#include "parallel/data_parallel.h"
#include "parallel/device_weight_stream.h"
#include "parallel/nvme_weight_stream.h"
#include "train/trainer.h"

namespace qlft {

void Trainer::init_offload(const Config& cfg) {
  dist::DistSettings ds = dist::DistSettings::from_config(cfg);
  const bool device = backend_->device_memory() != nullptr;
  for (const auto& [key, value] :
       {std::pair<const char*, std::string>{"offload.optimizer", ds.offload_optimizer},
        {"offload.params", ds.offload_params}}) {
    if (value == "cpu" && !device)
      log_message(QLFT_LOG_WARN,
                  "%s=cpu means nothing on the cpu backend (the state already lives in host "
                  "memory): treated as none",
                  key);
  }
  // offload.optimizer=cpu on a device backend: the trainer keeps the host step (optimizer state
  // in host memory, gradients copied out per pass; see the constructor).
  Model& model = const_cast<Model&>(model_);  // storage moves, values do not (below)
  if (ds.offload_params == "cpu" && device) {
    // The stream's device memory is its trainer's backend's: a model streamed by a live trainer
    // cannot serve another (a trainer gives the weights back when it ends).
    if (model.stream)
      throw_error(QLFT_ERR_UNSUPPORTED,
                  "offload.params=cpu: the base weights of %s are already streamed (%s); end "
                  "the other trainer first or load the model again",
                  model.path.c_str(), model.stream->describe().c_str());
    device_stream_ = DeviceWeightStream::offload(model, backend_->device_memory());
    log_message(QLFT_LOG_INFO, "%s", device_stream_->describe().c_str());
    return;
  }
  if (ds.offload_params != "nvme") return;
  // The trainer holds the model const because training never changes the base weights; moving
  // their storage to a file changes where the bytes live, not their values, so the model is
  // converted in place here, once. It stays converted after the trainer: model.stream owns the
  // file, and generation / merged export refuse the model (Model::require_resident).
  const int read_ahead = static_cast<int>(cfg.get_int("offload.buffers"));
  if (model.stream) {
    // A second trainer on a model an earlier one offloaded: the weights are already in the file.
    if (dynamic_cast<NvmeWeightStream*>(model.stream.get())) return;
    throw_error(QLFT_ERR_UNSUPPORTED,
                "offload.params=nvme: the base weights of %s are already streamed (%s); NVMe "
                "offload of ZeRO-3 shards is not supported",
                model.path.c_str(), model.stream->describe().c_str());
  }
  NvmeWeightStream::offload(model, tracker_, ds.offload_dir, read_ahead);
}

void Trainer::end_offload() noexcept {
  // offload.params=cpu: the model gets its host weights back (the device memory they were
  // streamed into is this trainer's backend's).
  if (!device_stream_) return;
  device_stream_->restore();
  Model& model = const_cast<Model&>(model_);
  if (model.stream == device_stream_) model.stream.reset();
  device_stream_.reset();
}

}  // namespace qlft
