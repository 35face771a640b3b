// The structs behind the opaque C handles. Only src/api/ casts between them and the C names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "config/run_spec.h"
#include "core/memory.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "train/preference.h"

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
  // backend, cuda.tf32 (validated at create): what generation computes on when its call's config
  // does not name a backend (always fp32: train.precision is the trainer's).
  qlft::BackendSpec backend;
  int threads = 1;  // `threads`, 0 resolved to the cores the process may use
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
  std::unique_ptr<qlft::data::Dataset> data;  // nullptr when pref is set
  // train.objective != sft: the preference examples (train/preference.h) instead of data.
  std::unique_ptr<qlft::PrefSet> pref;
  ~qlft_dataset();
};

struct qlft_trainer {
  qlft_model* model = nullptr;
  qlft_dataset* data = nullptr;
  qlft::RunSpec spec;  // the trainer's config, parsed once at create
  std::unique_ptr<qlft::Trainer> trainer;
  std::vector<qlft::KernelLaunches> last_launches;  // the last step's (qlft_trainer_step_launches)
  ~qlft_trainer();
};

namespace qlft {
// The settings of cfg, or the defaults when cfg is NULL.
const Config& config_or_default(const qlft_config* cfg);
// Fills out from runtime's tracker (api_runtime.cpp); fn names the C entry point in errors.
void memory_report(const qlft_runtime* runtime, qlft_memory_report* out, const char* fn);
}  // namespace qlft

// ---- versioned structs (qlft.h): each starts with uint32_t struct_size; fields are only appended,
// so the caller's struct and the library's share their first min(caller's, ours) bytes.
namespace qlft {

// The bytes of a T that both sides know, given the caller's struct_size.
template <class T>
uint32_t struct_bytes(uint32_t caller_size) {
  return caller_size < sizeof(T) ? caller_size : static_cast<uint32_t>(sizeof(T));
}

// An out-parameter struct the caller must have sized: fn is the entry point's name (inside
// guard's lambda __func__ would be "operator()").
#define QLFT_CHECK_STRUCT(fn, p, T)                           \
  QLFT_CHECK_ARG((p) && (p)->struct_size >= sizeof(uint32_t), \
                 fn ": out is NULL or out->struct_size is not set (use sizeof(" #T "))")

// Copies the library's filled struct to the caller's, whose struct_size is out_size (at least 4:
// the entry point checks it): the known bytes only, then struct_size = how many were written, so
// an older caller's shorter struct is never overrun and a newer caller sees what it got.
template <class T>
void copy_out(const T& full, void* out, uint32_t out_size) {
  static_assert(offsetof(T, struct_size) == 0, "a versioned struct starts with struct_size");
  const uint32_t n = struct_bytes<T>(out_size);
  std::memcpy(out, &full, n);
  std::memcpy(out, &n, sizeof n);
}
template <class T>
void copy_out(const T& full, T* out) {
  copy_out(full, out, out->struct_size);
}

// The caller's options struct (may be NULL): the fields past its struct_size keep T's zero
// defaults.
template <class T>
T copy_in(const T* in) {
  T o{};
  if (in) std::memcpy(&o, in, struct_bytes<T>(in->struct_size));
  return o;
}

}  // namespace qlft
