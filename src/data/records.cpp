#include "data/records.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string_view>

#include "core/error.h"
#include "formats/mapped_file.h"
#include "tokenizer/utf8.h"

namespace qlft::data {

using nlohmann::json;

void DropLog::add(const std::string& reason, const std::string& message) {
  ++count;
  ++by_reason[reason];
  if (examples.size() < 20) examples.push_back(message);
}

void bad_record(const ReadOptions& opt, DropLog& log, const char* reason, const std::string& where,
                const std::string& detail) {
  std::string msg = where + ": " + detail;
  if (!opt.skip_bad)
    throw_error(QLFT_ERR_FORMAT, "%s (set data.on_error=skip to skip bad records)", msg.c_str());
  log.add(reason, msg);
}

namespace {

bool is_blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v';
  });
}

std::string ext_of(const std::string& path) {
  std::string e = std::filesystem::path(path).extension().string();
  for (char& c : e) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return e;
}

// Why a JSON value is not a record of format f: returns false and sets reason/detail.
struct Problem {
  const char* reason = nullptr;
  std::string detail;
};

bool get_string(const json& obj, const char* key, bool required, std::string& out, Problem& p) {
  auto it = obj.find(key);
  if (it == obj.end() || (it->is_null() && !required)) {
    if (!required) return true;
    p = {"missing_field", std::string("missing field \"") + key + "\""};
    return false;
  }
  if (!it->is_string()) {
    p = {"wrong_type",
         std::string("field \"") + key + "\" must be a string, got " + it->type_name()};
    return false;
  }
  out = it->get<std::string>();
  return true;
}

std::string map_role(const std::string& r) {
  if (r == "user" || r == "human") return "user";
  if (r == "assistant" || r == "gpt" || r == "model" || r == "bot") return "assistant";
  if (r == "system") return "system";
  return "";
}

bool to_record(const json& j, DataFormat f, Record& rec, Problem& p) {
  if (!j.is_object()) {
    p = {"wrong_type", std::string("record must be a JSON object, got ") + j.type_name()};
    return false;
  }
  rec.format = f;
  switch (f) {
    case DataFormat::Text:
      if (!get_string(j, "text", true, rec.text, p)) return false;
      if (is_blank(rec.text)) {
        p = {"empty_text", "field \"text\" is empty"};
        return false;
      }
      return true;
    case DataFormat::Alpaca:
      if (!get_string(j, "instruction", true, rec.instruction, p) ||
          !get_string(j, "input", false, rec.input, p) ||
          !get_string(j, "output", true, rec.output, p) ||
          !get_string(j, "system", false, rec.system, p))
        return false;
      if (is_blank(rec.instruction)) {
        p = {"empty_text", "field \"instruction\" is empty"};
        return false;
      }
      if (is_blank(rec.output)) {
        p = {"empty_text", "field \"output\" is empty"};
        return false;
      }
      return true;
    case DataFormat::Chat: {
      bool sharegpt = !j.contains("messages") && j.contains("conversations");
      const char* list_key = sharegpt ? "conversations" : "messages";
      const char* role_key = sharegpt ? "from" : "role";
      const char* content_key = sharegpt ? "value" : "content";
      auto it = j.find(list_key);
      if (it == j.end()) {
        p = {"missing_field", "missing field \"messages\""};
        return false;
      }
      if (!it->is_array()) {
        p = {"wrong_type",
             std::string("field \"") + list_key + "\" must be an array, got " + it->type_name()};
        return false;
      }
      if (it->empty()) {
        p = {"empty_text", std::string("field \"") + list_key + "\" is empty"};
        return false;
      }
      bool any_content = false;
      for (size_t i = 0; i < it->size(); ++i) {
        const json& m = (*it)[i];
        std::string where = std::string(list_key) + "[" + std::to_string(i) + "]";
        if (!m.is_object()) {
          p = {"wrong_type", where + " must be an object, got " + m.type_name()};
          return false;
        }
        Message msg;
        Problem q;
        if (!get_string(m, role_key, true, msg.role, q) ||
            !get_string(m, content_key, true, msg.content, q)) {
          p = {q.reason, where + ": " + q.detail};
          return false;
        }
        std::string r = map_role(msg.role);
        if (r.empty()) {
          p = {"bad_role",
               where + ": unknown role \"" + msg.role + "\" (expected system, user or assistant)"};
          return false;
        }
        msg.role = r;
        any_content = any_content || !is_blank(msg.content);
        rec.messages.push_back(std::move(msg));
      }
      if (!any_content) {
        p = {"empty_text", "every message is empty"};
        return false;
      }
      return true;
    }
    case DataFormat::Auto:
      break;
  }
  p = {"internal", "no format"};
  return false;
}

DataFormat detect_from(const json& j) {
  if (!j.is_object()) return DataFormat::Auto;
  if (j.contains("messages") || j.contains("conversations")) return DataFormat::Chat;
  if (j.contains("instruction")) return DataFormat::Alpaca;
  if (j.contains("text")) return DataFormat::Text;
  return DataFormat::Auto;
}

[[noreturn]] void undetectable(const std::string& path, const json& j) {
  std::string keys;
  if (j.is_object())
    for (auto it = j.begin(); it != j.end(); ++it) keys += (keys.empty() ? "" : ", ") + it.key();
  throw_error(QLFT_ERR_FORMAT,
              "%s: cannot tell the data format from the first record (keys: %s); expected "
              "\"text\", \"instruction\"/\"output\" or \"messages\", or set data.format",
              path.c_str(), keys.empty() ? "none" : keys.c_str());
}

// 1-based line of byte offset `pos` in s.
size_t line_of(std::string_view s, size_t pos) {
  pos = std::min(pos, s.size());
  return 1 +
         static_cast<size_t>(std::count(s.begin(), s.begin() + static_cast<ptrdiff_t>(pos), '\n'));
}

std::string_view trim_newlines(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == '\n' || s[b] == '\r')) ++b;
  while (e > b && (s[e - 1] == '\n' || s[e - 1] == '\r')) --e;
  return s.substr(b, e - b);
}

// Offset of the first byte of s that is not valid UTF-8, or npos. (JSONL text is checked by the
// JSON parser; a .txt must meet the same bar, or binary garbage trains silently.)
size_t first_invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + i;
    if (*p < 0x80) {
      ++i;
      continue;
    }
    int len = tok::utf8_valid_prefix(p, s.size() - i);
    if (len <= 0) return i;
    i += static_cast<size_t>(len);
  }
  return std::string_view::npos;
}

void read_txt(const std::string& path, std::string_view s, const ReadOptions& opt, DropLog& log,
              std::vector<Record>& out) {
  // Takes a view into the mapped file and copies only a document that is kept, so an oversized
  // one (a 1 GB line) is refused without ever being held in memory.
  auto emit = [&](std::string_view text, size_t line, bool check_size) {
    std::string where = path + ":" + std::to_string(line);
    if (is_blank(text)) return;  // empty pieces between separators are not records
    if (check_size && opt.max_record_bytes && text.size() > opt.max_record_bytes) {
      bad_record(opt, log, "too_long", where,
                 strf("document of %zu bytes is longer than data.max_record_bytes (%llu)",
                      text.size(), static_cast<unsigned long long>(opt.max_record_bytes)));
      return;
    }
    size_t bad = first_invalid_utf8(text);
    if (bad != std::string_view::npos) {
      size_t bad_line =
          line + static_cast<size_t>(std::count(text.begin(), text.begin() + bad, '\n'));
      bad_record(opt, log, "invalid_utf8", path + ":" + std::to_string(bad_line),
                 strf("byte 0x%02x is not valid UTF-8 (is this a text file?)",
                      static_cast<unsigned>(static_cast<uint8_t>(text[bad]))));
      return;
    }
    Record r;
    r.format = DataFormat::Text;
    // CRLF line ends read as LF: a file saved on Windows trains on the same tokens, not '\r's.
    r.text.reserve(text.size());
    for (size_t i = 0; i < text.size(); ++i)
      if (text[i] != '\r' || i + 1 >= text.size() || text[i + 1] != '\n') r.text += text[i];
    r.where = std::move(where);
    out.push_back(std::move(r));
  };
  if (opt.split == TextSplit::Whole) {
    emit(s, 1, false);  // the whole file is one document, split later by length
    return;
  }
  if (opt.split == TextSplit::BlankLines) {
    // Blank lines (only whitespace) separate documents; line endings inside are kept.
    size_t pos = 0, line = 1, doc_begin = std::string::npos, doc_end = 0, doc_line = 0;
    while (pos < s.size()) {
      size_t nl = s.find('\n', pos);
      size_t end = nl == std::string::npos ? s.size() : nl;
      std::string_view ln = s.substr(pos, end - pos);
      if (is_blank(ln)) {
        if (doc_begin != std::string::npos)
          emit(s.substr(doc_begin, doc_end - doc_begin), doc_line, true);
        doc_begin = std::string::npos;
      } else {
        if (doc_begin == std::string::npos) {
          doc_begin = pos;
          doc_line = line;
        }
        doc_end = end;
        if (doc_end > doc_begin && s[doc_end - 1] == '\r') --doc_end;
      }
      pos = end + 1;
      ++line;
    }
    if (doc_begin != std::string::npos)
      emit(s.substr(doc_begin, doc_end - doc_begin), doc_line, true);
    return;
  }
  QLFT_CHECK_ARG(!opt.separator.empty(), "%s: data.separator is empty (none reads the whole file)",
                 path.c_str());
  size_t pos = 0, line = 1, counted = 0;
  while (pos <= s.size()) {
    size_t hit = s.find(opt.separator, pos);
    size_t end = hit == std::string::npos ? s.size() : hit;
    std::string_view piece = s.substr(pos, end - pos);
    size_t lead = 0;
    while (lead < piece.size() && (piece[lead] == '\n' || piece[lead] == '\r')) ++lead;
    line += static_cast<size_t>(std::count(s.begin() + static_cast<ptrdiff_t>(counted),
                                           s.begin() + static_cast<ptrdiff_t>(pos + lead), '\n'));
    counted = pos + lead;
    emit(trim_newlines(piece), line, true);
    if (hit == std::string::npos) break;
    pos = hit + opt.separator.size();
  }
}

// Parses one JSON value; on failure fills p with the parser's message.
bool parse_json(std::string_view text, json& j, Problem& p) {
  try {
    j = json::parse(text.begin(), text.end());
    return true;
  } catch (const json::exception& e) {  // parse_error, or out_of_range for numbers like 1e999
    std::string m = e.what();
    // nlohmann prefixes "[json.exception.parse_error.101] parse error at line 1, column 5: ".
    size_t c = m.find("parse error");
    m = c == std::string::npos ? m : m.substr(c);
    // One line holds one record: "line 1, column N" would only confuse next to file:line.
    size_t l1 = m.find("at line 1, column");
    if (l1 != std::string::npos) m.replace(l1, 17, "at column");
    p = {"invalid_json", "invalid JSON: " + m};
    return false;
  }
}

void read_jsonl(const std::string& path, std::string_view s, const ReadOptions& opt,
                DataFormat& fmt, DropLog& log, std::vector<Record>& out) {
  struct Line {
    std::string_view text;
    size_t number;
  };
  std::vector<Line> lines;
  for (size_t pos = 0, n = 1; pos < s.size(); ++n) {
    size_t nl = s.find('\n', pos);
    size_t end = nl == std::string::npos ? s.size() : nl;
    std::string_view ln = s.substr(pos, end - pos);
    if (!is_blank(ln)) lines.push_back({ln, n});
    pos = end + 1;
  }
  if (fmt == DataFormat::Auto) {
    for (const Line& l : lines) {
      json j;
      Problem p;
      if (l.text.size() > (opt.max_record_bytes ? opt.max_record_bytes : l.text.size()) ||
          !parse_json(l.text, j, p))
        continue;
      fmt = detect_from(j);
      if (fmt == DataFormat::Auto) undetectable(path + ":" + std::to_string(l.number), j);
      break;
    }
    if (fmt == DataFormat::Auto) fmt = DataFormat::Text;  // nothing parseable: errors follow
  }
  for (const Line& l : lines) {
    std::string where = path + ":" + std::to_string(l.number);
    if (opt.max_record_bytes && l.text.size() > opt.max_record_bytes) {
      bad_record(opt, log, "too_long", where,
                 strf("record of %zu bytes is longer than data.max_record_bytes (%llu)",
                      l.text.size(), static_cast<unsigned long long>(opt.max_record_bytes)));
      continue;
    }
    json j;
    Problem p;
    Record r;
    if (!parse_json(l.text, j, p) || !to_record(j, fmt, r, p)) {
      bad_record(opt, log, p.reason, where, p.detail);
      continue;
    }
    r.where = std::move(where);
    out.push_back(std::move(r));
  }
}

void read_json_array(const std::string& path, std::string_view s, const ReadOptions& opt,
                     DataFormat& fmt, DropLog& log, std::vector<Record>& out) {
  json arr;
  try {
    arr = json::parse(s.begin(), s.end());
  } catch (const json::parse_error& e) {
    // The whole file is one JSON value: no record can be trusted, so this is never skipped.
    throw_error(QLFT_ERR_FORMAT, "%s:%zu: invalid JSON: %s", path.c_str(), line_of(s, e.byte),
                e.what());
  } catch (const json::exception& e) {
    throw_error(QLFT_ERR_FORMAT, "%s: invalid JSON: %s", path.c_str(), e.what());
  }
  if (!arr.is_array())
    throw_error(QLFT_ERR_FORMAT, "%s: expected a JSON array of records, got %s", path.c_str(),
                arr.type_name());
  if (fmt == DataFormat::Auto && !arr.empty()) {
    fmt = detect_from(arr[0]);
    if (fmt == DataFormat::Auto) undetectable(path + " record index 0", arr[0]);
  }
  for (size_t i = 0; i < arr.size(); ++i) {
    std::string where = path + " record index " + std::to_string(i);
    if (opt.max_record_bytes) {
      size_t bytes = arr[i].dump(-1, ' ', false, json::error_handler_t::replace).size();
      if (bytes > opt.max_record_bytes) {
        bad_record(opt, log, "too_long", where,
                   strf("record of %zu bytes is longer than data.max_record_bytes (%llu)", bytes,
                        static_cast<unsigned long long>(opt.max_record_bytes)));
        continue;
      }
    }
    Problem p;
    Record r;
    if (!to_record(arr[i], fmt, r, p)) {
      bad_record(opt, log, p.reason, where, p.detail);
      continue;
    }
    r.where = std::move(where);
    out.push_back(std::move(r));
  }
}

void read_one(const std::string& path, const ReadOptions& opt, DataFormat& fmt, DropLog& log,
              std::vector<Record>& out) {
  std::string ext = ext_of(path);
  MappedFile file(path);
  std::string_view s(reinterpret_cast<const char*>(file.data()), file.size());
  if (ext == ".txt") {
    if (fmt != DataFormat::Auto && fmt != DataFormat::Text)
      throw_error(QLFT_ERR_INVALID_ARGUMENT,
                  "%s: a .txt file holds plain text; data.format=%s "
                  "needs a .jsonl or .json file",
                  path.c_str(), format_name(fmt));
    fmt = DataFormat::Text;
    read_txt(path, s, opt, log, out);
  } else if (ext == ".jsonl" || ext == ".json") {
    size_t first = s.find_first_not_of(" \t\r\n");
    if (ext == ".json" && first != std::string::npos && s[first] == '[')
      read_json_array(path, s, opt, fmt, log, out);
    else
      read_jsonl(path, s, opt, fmt, log, out);
  } else {
    throw_error(QLFT_ERR_UNSUPPORTED,
                "%s: unknown data file type '%s' (expected .txt, .jsonl or "
                ".json)",
                path.c_str(), ext.c_str());
  }
}

}  // namespace

std::vector<Record> read_records(const std::string& path, const ReadOptions& opt, DropLog& log,
                                 DataFormat* detected) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::directory_iterator(path, ec)) {
      std::string ext = ext_of(e.path().string());
      if (e.is_regular_file() && (ext == ".txt" || ext == ".jsonl" || ext == ".json"))
        files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());
    if (files.empty())
      throw_error(QLFT_ERR_IO, "%s: no .txt, .jsonl or .json files in this directory",
                  path.c_str());
  } else {
    files.push_back(path);
  }
  std::vector<Record> out;
  DataFormat fmt = opt.format;
  for (const auto& f : files) {
    DataFormat ff = fmt;
    read_one(f, opt, ff, log, out);
    if (fmt == DataFormat::Auto) fmt = ff;  // later files must hold the same format
  }
  if (detected) *detected = fmt == DataFormat::Auto ? DataFormat::Text : fmt;
  return out;
}

}  // namespace qlft::data
