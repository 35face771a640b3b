#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "cli.h"

namespace cli {

std::string setting(const qlft_config* cfg, const char* key) {
  size_t need = 0;
  if (qlft_config_get(cfg, key, nullptr, 0, &need) != QLFT_OK && need == 0) return "";
  std::string v(need, '\0');
  if (need) qlft_config_get(cfg, key, v.data(), v.size(), &need);
  if (!v.empty() && v.back() == '\0') v.pop_back();
  return v;
}

int32_t run_settings(const qlft_config* cfg, qlft_run_settings* out) {
  *out = qlft_run_settings{};
  out->struct_size = sizeof *out;
  return qlft_config_run_settings(cfg, out);
}

int exit_code_for(int32_t status) {
  switch (status) {
    case QLFT_OK:
      return kOk;
    case QLFT_ERR_INVALID_ARGUMENT:
      return kUsage;
    case QLFT_ERR_IO:
      return kIo;
    case QLFT_ERR_FORMAT:
      return kFormat;
    case QLFT_ERR_OUT_OF_MEMORY:
      return kOutOfMemory;
    case QLFT_ERR_CANCELLED:
      return kCancelled;
    case QLFT_ERR_NUMERICAL:
      return kNumerical;
    default:
      return kFailure;
  }
}

int fail(const char* what, int32_t status) {
  // Errors about a file usually begin with its path already: say it once ("x: ...", not
  // "x: x: ...").
  const char* msg = qlft_last_error();
  const size_t n = std::strlen(what);
  if (std::strncmp(msg, what, n) == 0 && msg[n] == ':')
    std::fprintf(stderr, "qlft-finetune: %s (%s)\n", msg, qlft_status_string(status));
  else
    std::fprintf(stderr, "qlft-finetune: %s: %s (%s)\n", what, msg, qlft_status_string(status));
  return exit_code_for(status);
}

std::string human_bytes(uint64_t b) {
  const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int i = 0;
  while (v >= 1024 && i < 4) {
    v /= 1024;
    ++i;
  }
  char buf[64];
  if (i == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, u[i]);
  return buf;
}

namespace {
bool is_config_key(const std::string& k) {
  size_t n = qlft_config_key_count();
  for (size_t i = 0; i < n; ++i) {
    qlft_config_key key{};
    key.struct_size = sizeof key;
    if (qlft_config_key_at(i, &key) == QLFT_OK && k == key.name) return true;
  }
  return false;
}
bool contains(const std::vector<std::string>& v, const std::string& s) {
  for (const auto& x : v)
    if (x == s) return true;
  return false;
}
}  // namespace

bool parse_args(int argc, char** argv, int first, const std::vector<std::string>& known_flags,
                const std::vector<std::string>& bool_flags, Args* out, std::string* error,
                size_t max_positional) {
  std::string previous;  // the option before a stray word, for the message
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a.size() > 2 && a.compare(0, 2, "--") == 0) {
      std::string key = a.substr(2), value;
      size_t eq = key.find('=');
      bool has_value = eq != std::string::npos;
      if (has_value) {
        value = key.substr(eq + 1);
        key = key.substr(0, eq);
      }
      if (contains(bool_flags, key)) {
        out->flags[key] = has_value ? value : "true";
        previous.clear();
        continue;
      }
      bool known = contains(known_flags, key);
      if (!known && !is_config_key(key)) {
        *error = "unknown option --" + key + " (see --help; settings are listed in docs/CONFIG.md)";
        return false;
      }
      if (!has_value) {
        if (i + 1 >= argc) {
          *error = "option --" + key + " needs a value";
          return false;
        }
        value = argv[++i];
      }
      if (known)
        out->flags[key] = value;
      else
        out->settings.emplace_back(key, value);
      previous = "--" + key + " " + value;
      continue;
    } else {
      if (out->positional.size() >= max_positional) {
        *error = "unexpected argument '" + a + "'" +
                 (previous.empty() ? std::string()
                                   : " after " + previous +
                                         " (an option takes one value; quote a value with "
                                         "spaces)");
        return false;
      }
      out->positional.push_back(a);
    }
    previous.clear();
  }
  return true;
}

ConfigPtr make_config(const Args& a, int* exit_code) {
  qlft_config* raw = nullptr;
  int32_t st = qlft_config_create(&raw);
  if (st != QLFT_OK) {
    *exit_code = fail("config", st);
    return nullptr;
  }
  ConfigPtr cfg(raw);
  // --adapter DIR (generate/eval/export pass it on as lora.init_from).
  std::string adapter;
  if (a.flags.count("adapter")) adapter = a.flags.at("adapter");
  for (const auto& kv : a.settings)
    if (kv.first == "lora.init_from") adapter = kv.second;
  if (!adapter.empty()) {
    // The base as the adapter was trained on it (quant.type keep or nf4...), unless the YAML or
    // the command line below says otherwise. Adapters from elsewhere have no such file.
    const std::string base = adapter + "/qlft_base_config.json";
    if (FILE* f = std::fopen(base.c_str(), "rb")) {
      std::fclose(f);
      st = qlft_config_load_file(cfg.get(), base.c_str());
      if (st != QLFT_OK) {
        *exit_code = fail(base.c_str(), st);
        return nullptr;
      }
    }
  }
  auto file = a.flags.find("config");
  if (file != a.flags.end()) {
    st = qlft_config_load_file(cfg.get(), file->second.c_str());
    if (st != QLFT_OK) {
      *exit_code = fail(file->second.c_str(), st);
      return nullptr;
    }
  }
  for (const auto& kv : a.settings) {
    st = qlft_config_set(cfg.get(), kv.first.c_str(), kv.second.c_str());
    if (st != QLFT_OK) {
      *exit_code = fail(("--" + kv.first).c_str(), st);
      return nullptr;
    }
  }
  return cfg;
}

int open_model(const std::string& path, const qlft_config* cfg, TrainSession* s) {
  // A file that is not a model is refused by qlft_model_load before it reads anything.
  qlft_runtime* rt = nullptr;
  int32_t st = qlft_runtime_create(cfg, &rt);
  if (st != QLFT_OK) return fail("runtime", st);
  s->runtime.reset(rt);
  qlft_model* model = nullptr;
  st = qlft_model_load(rt, path.c_str(), cfg, &model);
  if (st != QLFT_OK) return fail(path.c_str(), st);
  s->model.reset(model);
  return kOk;
}

int open_session(const Args& a, const qlft_config* cfg, TrainSession* s, bool need_data) {
  auto m = a.flags.find("model");
  if (m == a.flags.end()) {
    std::fprintf(stderr, "qlft-finetune: --model is required\n");
    return kUsage;
  }
  // What the command needs besides the model and data, checked before they load (the
  // runtime checks offload.dir and the MPI plugin): the adapter to start from.
  auto ad = a.flags.find("adapter");
  if (ad != a.flags.end()) {
    struct stat st;
    if (::stat(ad->second.c_str(), &st) != 0) {
      std::fprintf(stderr, "qlft-finetune: %s: %s (--adapter)\n", ad->second.c_str(),
                   std::strerror(errno));
      return kIo;
    }
    if (!S_ISDIR(st.st_mode)) {
      std::fprintf(stderr,
                   "qlft-finetune: %s: not a directory; --adapter is a PEFT adapter directory "
                   "(adapter_config.json + adapter_model.safetensors, as train writes)\n",
                   ad->second.c_str());
      return kUsage;
    }
    const std::string peft_config = ad->second + "/adapter_config.json";
    if (::stat(peft_config.c_str(), &st) != 0) {
      std::fprintf(stderr, "qlft-finetune: %s: %s (--adapter: not a PEFT adapter directory)\n",
                   peft_config.c_str(), std::strerror(errno));
      return kIo;
    }
  }
  if (int rc = open_model(m->second, cfg, s)) return rc;
  qlft_model* model = s->model.get();
  int32_t st = QLFT_OK;
  auto d = a.flags.find("data");
  if (d != a.flags.end()) {
    qlft_dataset* data = nullptr;
    st = qlft_dataset_load(model, d->second.c_str(), cfg, &data);
    if (st != QLFT_OK) return fail(d->second.c_str(), st);
    s->data.reset(data);
    qlft_dataset_stats ds{};
    ds.struct_size = sizeof ds;
    if (qlft_dataset_get_stats(data, &ds) == QLFT_OK)
      std::fprintf(stderr,
                   "data: %llu records (%llu dropped), %llu tokens, %llu trained, %llu train / "
                   "%llu eval sequences, %.1f%% filled\n",
                   static_cast<unsigned long long>(ds.records),
                   static_cast<unsigned long long>(ds.dropped_records),
                   static_cast<unsigned long long>(ds.tokens),
                   static_cast<unsigned long long>(ds.trained_tokens),
                   static_cast<unsigned long long>(ds.train_sequences),
                   static_cast<unsigned long long>(ds.eval_sequences), 100.0 * ds.fill_ratio);
  } else if (need_data) {
    std::fprintf(stderr, "qlft-finetune: --data is required\n");
    return kUsage;
  }
  qlft_trainer* t = nullptr;
  st = qlft_trainer_create(model, s->data.get(), cfg, &t);
  if (st != QLFT_OK) return fail("trainer", st);
  s->trainer.reset(t);
  if (ad != a.flags.end()) {
    st = qlft_trainer_load_adapter(t, ad->second.c_str());
    if (st != QLFT_OK) return fail(ad->second.c_str(), st);
  }
  return kOk;
}

}  // namespace cli
