// qlft_config: key/value settings validated against the key table.
#include <cstring>

#include "api/handles.h"
#include "config/config_file.h"
#include "config/keys.h"
#include "config/run_spec.h"
#include "core/error.h"

namespace qlft {
const Config& config_or_default(const qlft_config* cfg) {
  static const Config empty;
  return cfg ? cfg->cfg : empty;
}
}  // namespace qlft

using qlft::guard;

extern "C" {

int32_t qlft_config_create(qlft_config** out) {
  return guard([&] {
    QLFT_CHECK_ARG(out, "qlft_config_create: out is NULL");
    *out = new qlft_config();
  });
}

void qlft_config_free(qlft_config* config) {
  delete config;
}

int32_t qlft_config_set(qlft_config* config, const char* key, const char* value) {
  return guard([&] {
    QLFT_CHECK_ARG(config && key && value,
                   "qlft_config_set: config, key and value must not be NULL");
    config->cfg.set(key, value);
  });
}

int32_t qlft_config_get(const qlft_config* config, const char* key, char* buf, size_t buf_size,
                        size_t* needed) {
  return guard([&] {
    QLFT_CHECK_ARG(key, "qlft_config_get: key is NULL");
    std::string v = qlft::config_or_default(config).get(key);
    if (needed) *needed = v.size() + 1;
    if (!buf && buf_size == 0) return;  // size query
    QLFT_CHECK_ARG(buf && buf_size > v.size(),
                   "qlft_config_get: buffer of %zu bytes is too small for '%s' (%zu needed)",
                   buf_size, key, v.size() + 1);
    std::memcpy(buf, v.c_str(), v.size() + 1);
  });
}

int32_t qlft_config_load_file(qlft_config* config, const char* path) {
  return guard([&] {
    QLFT_CHECK_ARG(config && path, "qlft_config_load_file: config and path must not be NULL");
    qlft::load_config_file(config->cfg, path);
  });
}

size_t qlft_config_key_count(void) {
  return qlft::key_count();
}

int32_t qlft_config_key_at(size_t index, qlft_config_key* out) {
  return guard([&] {
    QLFT_CHECK_ARG(out && out->struct_size >= sizeof(uint32_t),
                   "qlft_config_key_at: out is NULL or struct_size unset");
    QLFT_CHECK_ARG(index < qlft::key_count(),
                   "qlft_config_key_at: index %zu out of range (%zu keys)", index,
                   qlft::key_count());
    const qlft::KeyDef& k = qlft::key_at(index);
    // `allowed` is built per key once and kept for the life of the process.
    static std::vector<std::string> allowed = [] {
      std::vector<std::string> v;
      for (size_t i = 0; i < qlft::key_count(); ++i)
        v.push_back(qlft::key_allowed(qlft::key_at(i)));
      return v;
    }();
    qlft_config_key full{};
    full.struct_size = sizeof(full);
    full.name = k.name;
    full.type = qlft::key_type_name(k.type);
    full.default_value = k.default_value;
    full.allowed = allowed[index].c_str();
    full.doc = k.doc;
    qlft::copy_out(full, out);
  });
}

int32_t qlft_config_run_settings(const qlft_config* config, qlft_run_settings* out) {
  return guard([&] {
    QLFT_CHECK_STRUCT("qlft_config_run_settings", out, qlft_run_settings);
    const qlft::RunSpec spec = qlft::parse_run_spec(qlft::config_or_default(config));
    qlft_run_settings f{};
    f.struct_size = sizeof f;
    f.micro_batch_auto = spec.train.micro_batch.is_auto ? 1 : 0;
    f.micro_batch = static_cast<uint32_t>(spec.train.micro_batch.n);
    f.seq_len = static_cast<uint32_t>(spec.data.seq_len);
    f.memory_limit = spec.memory.limit;
    f.distributed = spec.dist.backend != qlft::DistBackend::None ? 1 : 0;
    f.zero3_shard_adapter = spec.dist.shard_adapter ? 1 : 0;
    f.save_every = spec.train.save_every;
    qlft::copy_out(f, out);
  });
}

}  // extern "C"
