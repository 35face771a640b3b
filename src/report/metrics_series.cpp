// Reading metrics.jsonl (see metrics_series.h). nlohmann::json parses each line; the keys are
// the ones tools/qlft-finetune/cmd_train.cpp and report_fields.cpp write.
#include "report/metrics_series.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

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

RunInfo read_info(const json& r, const std::string& where) {
  QLFT_CHECK_FORMAT(r.is_object(), "%s: \"run\" is not an object", where.c_str());
  RunInfo i;
  i.present = true;
  i.model = str(r, "model");
  i.architecture = str(r, "architecture");
  i.quant_type = str(r, "quant_type");
  i.lora_targets = str(r, "lora_targets");
  i.precision = str(r, "precision");
  i.lora_r = static_cast<int64_t>(count(r, "lora_r", where));
  i.lora_alpha = num(r, "lora_alpha", where);
  i.seq_len = static_cast<int64_t>(count(r, "seq_len", where));
  i.micro_batch = static_cast<int64_t>(count(r, "micro_batch", where));
  i.accumulation = static_cast<int64_t>(count(r, "accumulation", where));
  i.total_steps = count(r, "total_steps", where);
  i.data_records = count(r, "data_records", where);
  i.data_tokens = count(r, "data_tokens", where);
  i.train_sequences = count(r, "train_sequences", where);
  i.eval_sequences = count(r, "eval_sequences", where);
  i.started_unix = num(r, "started_unix", where);
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
    r.loss = num(j, "loss", where);
    r.lr = num(j, "lr", where);
    r.grad_norm = num(j, "grad_norm", where);
    r.loss_scale = num(j, "loss_scale", where);
    r.skipped = count(j, "skipped", where) != 0;
    r.tokens = count(j, "tokens", where);
    r.tokens_per_s = num(j, "tokens_per_s", where);
    r.elapsed_s = num(j, "elapsed_s", where);
    r.memory_bytes = count(j, "memory_bytes", where);
    r.memory_peak_bytes = count(j, "memory_peak_bytes", where);
    r.eval_loss = num(j, "eval_loss", where);
    r.evaluation = !j.contains("loss") && j.contains("eval_loss");
    r.eval_tokens = count(j, "eval_tokens", where);
    r.margin = num(j, "margin", where);
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
