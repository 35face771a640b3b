#include "report_fields.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "cli.h"

namespace cli {

namespace {

std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += static_cast<char>(c);
    } else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o += static_cast<char>(c);
    }
  }
  return o + "\"";
}

std::string uint_member(const char* key, unsigned long long v) {
  return std::string(", \"") + key + "\": " + std::to_string(v);
}

std::string mem_object(const uint64_t* bytes) {
  std::string o = "{";
  for (int c = 0; c < QLFT_MEM_CATEGORY_COUNT; ++c) {
    if (c) o += ", ";
    o += json_string(qlft_memory_category_name(c)) + ": " +
         std::to_string(static_cast<unsigned long long>(bytes[c]));
  }
  return o + "}";
}

}  // namespace

std::string report_run_members(const qlft_config* cfg, const qlft_model* model,
                               const qlft_dataset* data, const std::string& model_path,
                               const qlft_memory_estimate* predicted) {
  std::string o = "\"model\": " + json_string(model_path);
  qlft_model_details md{};
  md.struct_size = sizeof md;
  if (model && qlft_model_info(model, &md) == QLFT_OK) {
    o += ", \"architecture\": " + json_string(md.architecture);
    o += ", \"quant_type\": " + json_string(md.quant_type);
  }
  auto num_setting = [&](const char* member, const char* key) {
    const std::string v = setting(cfg, key);
    if (!v.empty() && v.find_first_not_of("0123456789") == std::string::npos)
      o += std::string(", \"") + member + "\": " + v;
  };
  num_setting("lora_r", "lora.r");
  // lora.alpha is a real number (24.5): written as the JSON number it is.
  const std::string alpha = setting(cfg, "lora.alpha");
  char* end = nullptr;
  const double av = std::strtod(alpha.c_str(), &end);
  if (!alpha.empty() && end && *end == '\0' && std::isfinite(av)) {
    char b[40];
    std::snprintf(b, sizeof b, "%.17g", av);
    o += std::string(", \"lora_alpha\": ") + b;
  }
  o += ", \"lora_targets\": " + json_string(setting(cfg, "lora.target_modules"));
  o += ", \"precision\": " + json_string(setting(cfg, "train.precision"));
  num_setting("seq_len", "data.seq_len");
  num_setting("micro_batch", "train.micro_batch");
  num_setting("accumulation", "train.accumulation");
  qlft_dataset_stats ds{};
  ds.struct_size = sizeof ds;
  if (data && qlft_dataset_get_stats(data, &ds) == QLFT_OK) {
    o += uint_member("data_records", ds.records);
    o += uint_member("data_tokens", ds.tokens);
    o += uint_member("train_sequences", ds.train_sequences);
    o += uint_member("eval_sequences", ds.eval_sequences);
  }
  o += uint_member("started_unix", static_cast<unsigned long long>(std::time(nullptr)));
  if (predicted) {
    o += ", \"mem_predicted\": " + mem_object(predicted->train);
    o += uint_member("mem_predicted_total", predicted->train_peak);
  }
  return o;
}

std::string report_step_fields(const qlft_trainer* trainer, const qlft_step_stats* s,
                               std::string* run_members) {
  std::string o;
  qlft_memory_report m{};
  m.struct_size = sizeof m;
  if (qlft_trainer_memory_report(trainer, &m) == QLFT_OK) {
    o += ", \"mem\": " + mem_object(m.reserved);
    o += ", \"mem_peak\": " + mem_object(m.peak);
  }
  // Device backends: the step's launches by kernel (the "launches" total split by name).
  size_t need = 0;
  if (s->device_launches > 0 && qlft_trainer_step_launches(trainer, nullptr, 0, &need) == QLFT_OK &&
      need > 3) {
    std::string k(need, '\0');
    if (qlft_trainer_step_launches(trainer, k.data(), k.size(), nullptr) == QLFT_OK) {
      k.resize(need - 1);
      o += ", \"launches_by_kernel\": " + k;
    }
  }
  if (run_members && !run_members->empty()) {
    o += ", \"run\": {" + *run_members + uint_member("total_steps", s->total_steps) + "}";
    run_members->clear();
  }
  return o;
}

void write_run_report(const std::string& dir, const char* status) {
  qlft_report_options o{};
  o.struct_size = sizeof o;
  o.status = status;
  if (qlft_report_write(dir.c_str(), &o) == QLFT_OK)
    std::fprintf(stderr, "report: %s/report.html\n", dir.c_str());
  else
    std::fprintf(stderr, "warning: no report written: %s\n", qlft_last_error());
}

}  // namespace cli
