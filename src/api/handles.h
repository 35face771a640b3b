// The structs behind the opaque C handles. Only src/api/ casts between them and the C names.
#pragma once

#include <memory>

#include "config/config.h"
#include "core/memory.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace qlft {
class Trainer;
namespace data {
class Dataset;
class TextEncoder;
}  // namespace data
}  // namespace qlft

struct qlft_config {
  qlft::Config cfg;
};

struct qlft_runtime {
  std::string backend;  // "cpu"
  int threads = 1;      // `threads`, 0 resolved to the cores the process may use
  qlft::MemoryTracker tracker;
};

struct qlft_model {
  qlft_runtime* runtime = nullptr;
  std::unique_ptr<qlft::Model> model;
  // The model's own tokenizer (GGUF metadata or tokenizer.json beside an HF model); null with
  // tokenizer_error saying why when the model has none or it is malformed.
  std::unique_ptr<qlft::Tokenizer> tokenizer;
  std::string tokenizer_error;
  const qlft::Tokenizer& need_tokenizer() const;
};

struct qlft_dataset {
  const qlft_model* model = nullptr;
  std::string path;  // what qlft_dataset_load read (an input no output may replace)
  std::unique_ptr<qlft::data::TextEncoder> encoder;
  std::unique_ptr<qlft::data::Dataset> data;
  ~qlft_dataset();
};

struct qlft_trainer {
  qlft_model* model = nullptr;
  qlft_dataset* data = nullptr;
  qlft::Config cfg;
  std::unique_ptr<qlft::Trainer> trainer;
  ~qlft_trainer();
};

namespace qlft {
// The settings of cfg, or the defaults when cfg is NULL.
const Config& config_or_default(const qlft_config* cfg);
// Fills out from runtime's tracker (api_runtime.cpp); fn names the C entry point in errors.
void memory_report(const qlft_runtime* runtime, qlft_memory_report* out, const char* fn);
}  // namespace qlft
