// Preference records: reading (JSON lines) and TRL's tokenization.
#include "data/preference.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string_view>

#include "core/error.h"
#include "formats/mapped_file.h"

namespace qlft::data {

namespace {

using nlohmann::json;

// The record's fields, or a message naming what is wrong ("" when good).
std::string to_pref(const json& j, bool kto, PrefRecord& r) {
  if (!j.is_object()) return "a record must be a JSON object";
  auto str = [&](const char* k, std::string& out) -> std::string {
    auto it = j.find(k);
    if (it == j.end()) return std::string("missing field \"") + k + "\"";
    if (!it->is_string()) return std::string("field \"") + k + "\" must be a string";
    out = it->get<std::string>();
    return "";
  };
  std::string e = str("prompt", r.prompt);
  if (!e.empty()) return e;
  if (kto) {
    if (!(e = str("completion", r.completion)).empty()) return e;
    auto it = j.find("label");
    if (it == j.end()) return "missing field \"label\"";
    if (!it->is_boolean()) return "field \"label\" must be true or false";
    r.label = it->get<bool>();
    if (r.completion.empty()) return "field \"completion\" is empty";
    return "";
  }
  if (!(e = str("chosen", r.chosen)).empty()) return e;
  if (!(e = str("rejected", r.rejected)).empty()) return e;
  if (r.chosen.empty() || r.rejected.empty()) return "an empty answer";
  return "";
}

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

std::vector<int32_t> tokens_of(const std::string& text, const TextEncoder& enc) {
  std::vector<int32_t> ids;
  if (enc.wants_bos() && enc.bos_id() >= 0) ids.push_back(enc.bos_id());
  enc.encode(text, true, false, ids);
  return ids;
}

}  // namespace

std::vector<PrefRecord> read_preference_records(const std::string& path, bool kto,
                                                const ReadOptions& opt, DropLog& log) {
  MappedFile f(path);
  std::string_view s(reinterpret_cast<const char*>(f.data()), f.size());
  std::vector<PrefRecord> out;
  size_t line = 0;
  while (!s.empty()) {
    const size_t nl = s.find('\n');
    std::string_view l = s.substr(0, nl);
    s = nl == std::string_view::npos ? std::string_view() : s.substr(nl + 1);
    ++line;
    while (!l.empty() && (l.back() == '\r' || l.back() == ' ' || l.back() == '\t'))
      l.remove_suffix(1);
    if (l.empty()) continue;
    const std::string where = path + ":" + std::to_string(line);
    if (opt.max_record_bytes && l.size() > opt.max_record_bytes) {
      bad_record(opt, log, "too_long", where, "record longer than data.max_record_bytes");
      continue;
    }
    json j;
    try {
      j = json::parse(l.begin(), l.end());
    } catch (const json::exception& e) {
      bad_record(opt, log, "invalid_json", where, std::string("invalid JSON: ") + e.what());
      continue;
    }
    PrefRecord r;
    const std::string problem = to_pref(j, kto, r);
    if (!problem.empty()) {
      bad_record(opt, log, "bad_field", where, problem);
      continue;
    }
    r.where = where;
    out.push_back(std::move(r));
  }
  return out;
}

PrefExample tokenize_preference(const PrefRecord& r, bool kto, const TextEncoder& enc) {
  PrefExample e;
  e.where = r.where;
  e.desirable = r.label;
  const std::string eos = enc.eos_text();
  auto with_eos = [&](const std::string& a) {
    return !eos.empty() &&
                   (a.size() < eos.size() || a.compare(a.size() - eos.size(), eos.size(), eos) != 0)
               ? a + eos
               : a;
  };
  const std::vector<int32_t> p = tokens_of(r.prompt, enc);
  const std::vector<int32_t> c = tokens_of(r.prompt + with_eos(kto ? r.completion : r.chosen), enc);
  std::vector<int32_t> rj;
  size_t n = std::min(p.size(), common_prefix(p, c));
  if (!kto) {
    rj = tokens_of(r.prompt + with_eos(r.rejected), enc);
    n = std::min(n, common_prefix(p, rj));
  }
  e.prompt.assign(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(n));
  e.chosen.assign(c.begin() + static_cast<std::ptrdiff_t>(n), c.end());
  if (!kto) e.rejected.assign(rj.begin() + static_cast<std::ptrdiff_t>(n), rj.end());
  QLFT_CHECK_FORMAT(!e.chosen.empty() && (kto || !e.rejected.empty()),
                    "%s: an answer has no tokens", r.where.c_str());
  return e;
}

}  // namespace qlft::data
