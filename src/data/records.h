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

struct ReadOptions {
  DataFormat format = DataFormat::Auto;
  // .txt only: documents are separated by blank lines (one or more lines holding only
  // whitespace), not at all (the whole file is one document), or at `separator`.
  TextSplit split = TextSplit::BlankLines;
  std::string separator;                // with TextSplit::AtSeparator only
  bool skip_bad = false;                // on_error = skip
  uint64_t max_record_bytes = 1 << 20;  // 0 = no limit
};

// The reading part of data.* (format, .txt split, bad-record policy), for records and
// preference records alike.
ReadOptions read_options(const DataSpec& d);

// Bad-record policy in one place: throws QLFT_ERR_FORMAT "<where>: <detail>" or logs the drop.
void bad_record(const ReadOptions& opt, DropLog& log, const char* reason, const std::string& where,
                const std::string& detail);

// Reads one file (format by extension: .txt, .jsonl, .json; .json holding JSON lines is accepted
// too) or every such file in a directory, in name order. The format is opt.format or, when Auto,
// detected from the first record; *detected receives it (Text for .txt).
std::vector<Record> read_records(const std::string& path, const ReadOptions& opt, DropLog& log,
                                 DataFormat* detected = nullptr);

}  // namespace qlft::data
