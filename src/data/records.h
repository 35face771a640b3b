// Reading training records from .txt, .jsonl and .json files.
//
// Formats: text ({"text": ...}), alpaca ({"instruction", "input"?, "output", "system"?}) and
// chat ({"messages": [{"role", "content"}...]}, or ShareGPT's {"conversations": [{"from",
// "value"}...]}). A bad record (invalid JSON, missing field, wrong type, empty text, over-long)
// is either a QLFT_ERR_FORMAT naming the file and line (jsonl, txt) or the record index (a .json
// array), or, when skipping, counted by reason in a DropLog.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "config/run_spec.h"  // DataFormat, unescape

namespace qlft::data {

struct Message {
  std::string role;  // system | user | assistant
  std::string content;
};

struct Record {
  DataFormat format = DataFormat::Text;
  std::string text;                                // Text
  std::string system, instruction, input, output;  // Alpaca (system optional)
  std::vector<Message> messages;                   // Chat
  std::string where;  // "file.jsonl:12", "file.json record 3", "file.txt:40"
};

// Why records were dropped; reason keys are short stable words ("invalid_json", "too_long"...).
struct DropLog {
  uint64_t count = 0;
  std::map<std::string, uint64_t> by_reason;
  std::vector<std::string> examples;  // the first few full messages
  void add(const std::string& reason, const std::string& message);
};

// The readers take data.* as parsed (config/run_spec.h) and use its format, split and
// separator (.txt: blank lines (lines holding only whitespace), none, or the separator),
// skip_bad and max_record_bytes.
using ReadOptions = DataSpec;

// Bad-record policy in one place: throws QLFT_ERR_FORMAT "<where>: <detail>" or logs the drop.
void bad_record(const ReadOptions& opt, DropLog& log, const char* reason, const std::string& where,
                const std::string& detail);

// Reads one file (format by extension: .txt, .jsonl, .json; .json holding JSON lines is accepted
// too) or every such file in a directory, in name order. The format is opt.format or, when Auto,
// detected from the first record; *detected receives it (Text for .txt).
std::vector<Record> read_records(const std::string& path, const ReadOptions& opt, DropLog& log,
                                 DataFormat* detected = nullptr);

}  // namespace qlft::data
