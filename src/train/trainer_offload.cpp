// The trainer's offload settings (offload.optimizer, offload.params = none | cpu | nvme).
#include "config/config.h"
#include "core/error.h"
#include "core/log.h"
#include "dist/data_parallel.h"
#include "train/trainer.h"

namespace qlft {

void Trainer::init_offload(const Config& cfg) {
  dist::DistSettings ds = dist::DistSettings::from_config(cfg);
  for (const auto& [key, value] :
       {std::pair<const char*, std::string>{"offload.optimizer", ds.offload_optimizer},
        {"offload.params", ds.offload_params}}) {
    if (value == "cpu")
      log_message(QLFT_LOG_WARN,
                  "%s=cpu means nothing on the cpu backend (the state already lives in host "
                  "memory): treated as none",
                  key);
    else if (value == "nvme")
      throw_error(QLFT_ERR_UNSUPPORTED,
                  "%s=nvme is not implemented yet (optim.name=paged_adamw8bit keeps optimizer "
                  "state in files under offload.dir)",
                  key);
  }
}

}  // namespace qlft
