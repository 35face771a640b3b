// Preference records: reading (JSON lines) and TRL's tokenization.
#include "data/preference.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string_view>

#include "core/error.h"
#include "data/dataset.h"  // tokenize_record
#include "formats/mapped_file.h"

namespace qlft::data {

namespace {

using nlohmann::json;

// A list of {"role", "content"} messages, or what is wrong with it.
std::string messages_of(const json& v, const char* key, std::vector<Message>& out) {
  if (!v.is_array() || v.empty())
    return std::string("field \"") + key + "\" must be a string or a non-empty list of messages";
  for (const json& m : v) {
    auto role = m.is_object() ? m.find("role") : m.end();
    auto content = m.is_object() ? m.find("content") : m.end();
    if (!m.is_object() || role == m.end() || content == m.end() || !role->is_string() ||
        !content->is_string())
      return std::string("field \"") + key + "\": each message needs string role and content";
    out.push_back({role->get<std::string>(), content->get<std::string>()});
  }
  return "";
}

// The record's fields, or a message naming what is wrong ("" when good).
std::string to_pref(const json& j, bool kto, PrefRecord& r) {
  if (!j.is_object()) return "a record must be a JSON object";
  if (auto p = j.find("prompt"); p != j.end() && p->is_array()) {  // conversational
    r.chat = true;
    std::string e = messages_of(*p, "prompt", r.prompt_msgs);
    const std::vector<const char*> answers = kto ? std::vector<const char*>{"completion"}
                                                 : std::vector<const char*>{"chosen", "rejected"};
    for (const char* k : answers) {
      if (!e.empty()) return e;
      auto a = j.find(k);
      if (a == j.end()) return std::string("missing field \"") + k + "\"";
      e = messages_of(*a, k, std::string(k) == "rejected" ? r.rejected_msgs : r.chosen_msgs);
    }
    if (!e.empty() || !kto) return e;
    auto it = j.find("label");
    if (it == j.end()) return "missing field \"label\"";
    if (!it->is_boolean()) return "field \"label\" must be true or false";
    r.label = it->get<bool>();
    return "";
  }
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

// A conversation's ids and where its answer starts: the last run of trained tokens (the final
// assistant turn), as tokenize_record masks it.
std::vector<int32_t> chat_ids(const std::vector<Message>& prompt,
                              const std::vector<Message>& answer, const ChatTemplate& t,
                              const TextEncoder& enc, size_t* start) {
  Record rec;
  rec.format = DataFormat::Chat;
  rec.messages = prompt;
  rec.messages.insert(rec.messages.end(), answer.begin(), answer.end());
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;
  tokenize_record(rec, t, TrainOn::Completion, enc, ids, trained);
  size_t e = ids.size();
  while (e > 0 && !trained[e - 1]) --e;
  size_t b = e;
  while (b > 0 && trained[b - 1]) --b;
  *start = b;
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

PrefExample tokenize_preference(const PrefRecord& r, bool kto, const TextEncoder& enc,
                                const ChatTemplate* chat) {
  // The chosen (KTO: the completion) and rejected sequences, prompt included, and n: the
  // length of the prompt they share. The first n tokens of c are the prompt (c and p agree there).
  std::vector<int32_t> c, rj;
  size_t n = 0;
  if (r.chat) {
    QLFT_CHECK_FORMAT(chat, "%s: a conversational record needs a chat template", r.where.c_str());
    size_t sc = 0, sr = 0;
    try {
      c = chat_ids(r.prompt_msgs, r.chosen_msgs, *chat, enc, &sc);
      if (!kto) rj = chat_ids(r.prompt_msgs, r.rejected_msgs, *chat, enc, &sr);
    } catch (const Error& err) {
      throw_error(QLFT_ERR_FORMAT, "%s: %s", r.where.c_str(), err.what());
    }
    n = kto ? sc : std::min({sc, sr, common_prefix(c, rj)});
  } else {
    const std::string eos = enc.eos_text();
    auto with_eos = [&](const std::string& a) {
      return !eos.empty() && (a.size() < eos.size() ||
                              a.compare(a.size() - eos.size(), eos.size(), eos) != 0)
                 ? a + eos
                 : a;
    };
    const std::vector<int32_t> p = tokens_of(r.prompt, enc);
    c = tokens_of(r.prompt + with_eos(kto ? r.completion : r.chosen), enc);
    n = std::min(p.size(), common_prefix(p, c));
    if (!kto) {
      rj = tokens_of(r.prompt + with_eos(r.rejected), enc);
      n = std::min(n, common_prefix(p, rj));
    }
  }
  PrefExample e;
  e.where = r.where;
  e.desirable = r.label;
  e.prompt.assign(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(n));
  e.chosen.assign(c.begin() + static_cast<std::ptrdiff_t>(n), c.end());
  if (!kto) e.rejected.assign(rj.begin() + static_cast<std::ptrdiff_t>(n), rj.end());
  QLFT_CHECK_FORMAT(!e.chosen.empty() && (kto || !e.rejected.empty()),
                    "%s: an answer has no tokens", r.where.c_str());
  return e;
}

}  // namespace qlft::data
