// Reading metrics.jsonl (see metrics_series.h). nlohmann::json parses each line; the keys are
// the ones tools/qlft-finetune/cmd_train.cpp and report_fields.cpp write.
#include "report/metrics_series.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <variant>

#include "core/error.h"

namespace qlft::report {

namespace {

using nlohmann::json;

const char* const kMemKeys[QLFT_MEM_CATEGORY_COUNT] = {
    "weights", "adapter", "gradients", "optimizer", "activations", "workspace", "communication"};

// A number, or NaN for null/absent. Anything else is a format error naming the key.
double num(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return kNaN;
  QLFT_CHECK_FORMAT(it->is_number(), "%s: \"%s\" is not a number", where.c_str(), key);
  return it->get<double>();
}

uint64_t count(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return 0;
  QLFT_CHECK_FORMAT(
      it->is_number_unsigned() || (it->is_number_integer() && it->get<int64_t>() >= 0),
      "%s: \"%s\" is not a non-negative integer", where.c_str(), key);
  return it->get<uint64_t>();
}

std::string str(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

void read_mem(const json& j, uint64_t* out, const std::string& where) {
  QLFT_CHECK_FORMAT(j.is_object(), "%s: memory per category is not an object", where.c_str());
  for (int c = 0; c < QLFT_MEM_CATEGORY_COUNT; ++c) out[c] = count(j, kMemKeys[c], where);
}

// Each key of a record read into its member by the member's type: a number (NaN when absent), a
// count (0 when absent), a flag (a count, nonzero) or a string ("" when absent).
void read(const json& j, const char* key, const std::string& where, double& v) {
  v = num(j, key, where);
}
void read(const json& j, const char* key, const std::string& where, uint64_t& v) {
  v = count(j, key, where);
}
void read(const json& j, const char* key, const std::string& where, int64_t& v) {
  v = static_cast<int64_t>(count(j, key, where));
}
void read(const json& j, const char* key, const std::string& where, bool& v) {
  v = count(j, key, where) != 0;
}
void read(const json& j, const char* key, const std::string&, std::string& v) {
  v = str(j, key);
}

template <class T>
struct Field {
  const char* key;
  std::variant<double T::*, uint64_t T::*, int64_t T::*, bool T::*, std::string T::*> member;
};

template <class T, size_t N>
void read_fields(const json& j, const Field<T> (&fields)[N], const std::string& where, T& out) {
  for (const Field<T>& f : fields)
    std::visit([&](auto m) { read(j, f.key, where, out.*m); }, f.member);
}

// The keys report_fields.cpp writes in the "run" object, and cmd_train.cpp in each record.
const Field<RunInfo> kRunFields[] = {
    {"model", &RunInfo::model},
    {"architecture", &RunInfo::architecture},
    {"quant_type", &RunInfo::quant_type},
    {"lora_targets", &RunInfo::lora_targets},
    {"precision", &RunInfo::precision},
    {"lora_r", &RunInfo::lora_r},
    {"lora_alpha", &RunInfo::lora_alpha},
    {"seq_len", &RunInfo::seq_len},
    {"micro_batch", &RunInfo::micro_batch},
    {"accumulation", &RunInfo::accumulation},
    {"total_steps", &RunInfo::total_steps},
    {"data_records", &RunInfo::data_records},
    {"data_tokens", &RunInfo::data_tokens},
    {"train_sequences", &RunInfo::train_sequences},
    {"eval_sequences", &RunInfo::eval_sequences},
    {"started_unix", &RunInfo::started_unix},
};
const Field<MetricsRecord> kRecordFields[] = {
    {"loss", &MetricsRecord::loss},
    {"lr", &MetricsRecord::lr},
    {"grad_norm", &MetricsRecord::grad_norm},
    {"loss_scale", &MetricsRecord::loss_scale},
    {"skipped", &MetricsRecord::skipped},
    {"tokens", &MetricsRecord::tokens},
    {"tokens_per_s", &MetricsRecord::tokens_per_s},
    {"elapsed_s", &MetricsRecord::elapsed_s},
    {"memory_bytes", &MetricsRecord::memory_bytes},
    {"memory_peak_bytes", &MetricsRecord::memory_peak_bytes},
    {"eval_loss", &MetricsRecord::eval_loss},
    {"eval_tokens", &MetricsRecord::eval_tokens},
    {"margin", &MetricsRecord::margin},
    {"rewards_accuracies", &MetricsRecord::accuracy},
};

RunInfo read_info(const json& r, const std::string& where) {
  QLFT_CHECK_FORMAT(r.is_object(), "%s: \"run\" is not an object", where.c_str());
  RunInfo i;
  i.present = true;
  read_fields(r, kRunFields, where, i);
  if (r.contains("mem_predicted")) {
    i.has_predicted = true;
    read_mem(r["mem_predicted"], i.mem_predicted, where + " run.mem_predicted");
    i.mem_predicted_total = count(r, "mem_predicted_total", where);
  }
  return i;
}

}  // namespace

const char* mem_key(int category) {
  return category >= 0 && category < QLFT_MEM_CATEGORY_COUNT ? kMemKeys[category] : "?";
}

RunSeries parse_metrics(const std::string& text, const std::string& path) {
  RunSeries out;
  size_t pos = 0;
  int line_no = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) break;  // a record still being written
    ++line_no;
    const std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = strf("%s line %d", path.c_str(), line_no);
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    QLFT_CHECK_FORMAT(!j.is_discarded() && j.is_object(), "%s: not a JSON object", where.c_str());
    QLFT_CHECK_FORMAT(j.contains("step") && j["step"].is_number_unsigned(),
                      "%s: no \"step\" (a non-negative integer)", where.c_str());
    MetricsRecord r;
    r.step = j["step"].get<uint64_t>();
    read_fields(j, kRecordFields, where, r);
    // Preference runs log TRL's name for the margin; "margin" is the older key.
    if (j.contains("rewards_margins")) r.margin = num(j, "rewards_margins", where);
    r.evaluation = !j.contains("loss") && j.contains("eval_loss");
    if (j.contains("mem")) {
      r.has_mem = true;
      read_mem(j["mem"], r.mem, where + " mem");
    }
    if (j.contains("mem_peak")) {
      r.has_mem_peak = true;
      read_mem(j["mem_peak"], r.mem_peak, where + " mem_peak");
    }
    if (j.contains("run")) out.info = read_info(j["run"], where);
    out.records.push_back(r);
  }
  return out;
}

RunSeries read_metrics(const std::string& path) {
  // Only a regular file: a device (a run logging to /dev/full) would be read forever.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw_error(QLFT_ERR_IO, "%s: cannot open: %s", path.c_str(), std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw_error(QLFT_ERR_IO, "%s: not a regular file", path.c_str());
  std::ifstream f(path, std::ios::binary);
  if (!f) throw_error(QLFT_ERR_IO, "%s: cannot open", path.c_str());
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw_error(QLFT_ERR_IO, "%s: read failed", path.c_str());
  return parse_metrics(ss.str(), path);
}

}  // namespace qlft::report
