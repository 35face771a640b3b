// The structs behind the opaque C handles. Only src/api/ casts between them and the C names.
#pragma once

#include <memory>

#include "config/config.h"
#include "core/memory.h"
#include "model/model.h"

struct qlft_config {
  qlft::Config cfg;
};

struct qlft_runtime {
  std::string backend;  // "cpu"
  int threads = 0;
  qlft::MemoryTracker tracker;
};

struct qlft_model {
  qlft_runtime* runtime = nullptr;
  std::unique_ptr<qlft::Model> model;
};

namespace qlft {
// The settings of cfg, or the defaults when cfg is NULL.
const Config& config_or_default(const qlft_config* cfg);
}  // namespace qlft
