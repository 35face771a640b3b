// The data reader: arbitrary bytes as a .jsonl, .json and .txt file, every format (auto, text,
// alpaca, chat), with on_error both stop and skip.
#include "data/records.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const char* kExt[] = {".jsonl", ".json", ".txt", ".jsonl"};
  static const qlft::data::DataFormat kFmt[] = {
      qlft::data::DataFormat::Auto, qlft::data::DataFormat::Text, qlft::data::DataFormat::Alpaca,
      qlft::data::DataFormat::Chat};
  const uint8_t sel = data[0];
  std::string path = qlft_fuzz::write_scratch(std::string("data") + kExt[sel & 3],
                                              {reinterpret_cast<const char*>(data) + 1, size - 1});
  qlft_fuzz::expect_only_qlft_errors([&] {
    qlft::data::ReadOptions opt;
    opt.format = kFmt[(sel >> 2) & 3];
    opt.skip_bad = sel & 16;
    opt.max_record_bytes = (sel & 32) ? 64 : (1 << 20);
    qlft::data::DropLog log;
    qlft::data::DataFormat detected;
    auto recs = qlft::data::read_records(path, opt, log, &detected);
    size_t sink = recs.size() + log.count;
    for (const auto& r : recs) sink += r.text.size() + r.messages.size() + r.output.size();
    qlft_fuzz::keep(sink);
  });
  qlft_fuzz::expect_only_qlft_errors([&] {
    size_t n = qlft::data::unescape(std::string(reinterpret_cast<const char*>(data), size)).size();
    qlft_fuzz::keep(n);
  });
  return 0;
}
