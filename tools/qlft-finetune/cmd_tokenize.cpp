// qlft-finetune tokenize --model M [--text T | --file F | stdin] [--no-bos] [--ids]
//   BOS/EOS as the model's tokenizer adds them (--no-bos: none). --file: the file's bytes, all
//   of them, as one text; stdin: one text per line. Only the vocabulary is loaded (a GGUF's
//   metadata, or tokenizer.json), so vocabulary-only GGUF files work.
//   --ids: one line of space-separated ids per text; otherwise "id<TAB>piece" lines.
// qlft-finetune data-stats --model M --data FILE [--data.* settings]
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "cli.h"

namespace cli {

namespace {

struct TokenizerFree {
  void operator()(qlft_tokenizer* t) const { qlft_tokenizer_free(t); }
};

int emit(const qlft_tokenizer* tok, const std::string& text, int32_t add_special, bool ids_only) {
  size_t n = 0;
  int32_t st = qlft_tokenizer_encode(tok, text.data(), text.size(), add_special, 0, nullptr, 0, &n);
  if (st != QLFT_OK) return fail("tokenize", st);
  std::vector<int32_t> ids(n);
  st = qlft_tokenizer_encode(tok, text.data(), text.size(), add_special, 0, ids.data(), ids.size(),
                             &n);
  if (st != QLFT_OK) return fail("tokenize", st);
  if (ids_only) {
    for (size_t i = 0; i < n; ++i) std::printf(i ? " %d" : "%d", ids[i]);
    std::printf("\n");
    return kOk;
  }
  for (size_t i = 0; i < n; ++i) {
    char buf[256];
    size_t need = 0;
    if (qlft_tokenizer_decode(tok, &ids[i], 1, buf, sizeof buf, &need) != QLFT_OK) buf[0] = '\0';
    std::printf("%d\t%s\n", ids[i], buf);
  }
  return kOk;
}

}  // namespace

int cmd_tokenize(int argc, char** argv) {
  Args a;
  std::string err;
  if (!parse_args(argc, argv, 2, {"model", "text", "file"}, {"no-bos", "ids", "help"}, &a, &err) ||
      a.flags.count("help") || !a.flags.count("model")) {
    if (!err.empty()) std::fprintf(stderr, "qlft-finetune: %s\n", err.c_str());
    std::fprintf(stderr,
                 "usage: qlft-finetune tokenize --model MODEL [--text TEXT | --file FILE] "
                 "[--no-bos] [--ids]\n"
                 "  BOS/EOS as the model's tokenizer adds them; --no-bos: none\n"
                 "  --file: the whole file as one text; without --text/--file, reads stdin, one "
                 "text per line\n");
    return a.flags.count("help") && err.empty() ? kOk : kUsage;
  }
  if (a.flags.count("text") && a.flags.count("file")) {
    std::fprintf(stderr, "qlft-finetune: tokenize takes --text or --file, not both\n");
    return kUsage;
  }
  int code = kOk;
  ConfigPtr cfg = make_config(a, &code);  // rejects unknown settings; tokenizing needs none
  if (!cfg) return code;
  const std::string& model = a.flags["model"];
  qlft_tokenizer* t = nullptr;
  if (int32_t st = qlft_tokenizer_load(model.c_str(), &t); st != QLFT_OK)
    return fail(model.c_str(), st);
  std::unique_ptr<qlft_tokenizer, TokenizerFree> tok(t);
  const int32_t add = a.flags.count("no-bos") ? 0 : QLFT_ADD_SPECIAL_AS_MODEL;
  const bool ids = a.flags.count("ids") != 0;
  if (a.flags.count("text")) return emit(t, a.flags["text"], add, ids);
  if (a.flags.count("file")) {
    const std::string& path = a.flags["file"];
    std::ifstream f(path, std::ios::binary);
    if (!f) {
      std::fprintf(stderr, "qlft-finetune: %s: cannot open (%s)\n", path.c_str(),
                   std::strerror(errno));
      return kIo;
    }
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (f.bad()) {
      std::fprintf(stderr, "qlft-finetune: %s: read error\n", path.c_str());
      return kIo;
    }
    return emit(t, text, add, ids);
  }
  std::string line;
  while (std::getline(std::cin, line))
    if (int rc = emit(t, line, add, ids)) return rc;
  return kOk;
}

int cmd_data_stats(int argc, char** argv) {
  Args a;
  std::string err;
  if (!parse_args(argc, argv, 2, {"model", "data", "config"}, {"help"}, &a, &err) ||
      a.flags.count("help") || !a.flags.count("model") || !a.flags.count("data")) {
    if (!err.empty()) std::fprintf(stderr, "qlft-finetune: %s\n", err.c_str());
    std::fprintf(stderr,
                 "usage: qlft-finetune data-stats --model MODEL --data FILE [--data.* ...]\n");
    return a.flags.count("help") && err.empty() ? kOk : kUsage;
  }
  int code = kOk;
  ConfigPtr cfg = make_config(a, &code);
  if (!cfg) return code;
  TrainSession session;
  if (int rc = open_model(a.flags["model"], cfg.get(), &session)) return rc;
  qlft_model* m = session.model.get();
  int32_t st = QLFT_OK;
  qlft_dataset* d = nullptr;
  st = qlft_dataset_load(m, a.flags["data"].c_str(), cfg.get(), &d);
  if (st != QLFT_OK) return fail(a.flags["data"].c_str(), st);
  DatasetPtr data(d);
  qlft_dataset_stats s{};
  s.struct_size = sizeof s;
  if ((st = qlft_dataset_get_stats(d, &s)) != QLFT_OK) return fail("data-stats", st);
  std::printf("records          %llu\n", static_cast<unsigned long long>(s.records));
  std::printf("dropped records  %llu\n", static_cast<unsigned long long>(s.dropped_records));
  std::printf("tokens           %llu\n", static_cast<unsigned long long>(s.tokens));
  std::printf("trained tokens   %llu\n", static_cast<unsigned long long>(s.trained_tokens));
  std::printf("train sequences  %llu\n", static_cast<unsigned long long>(s.train_sequences));
  std::printf("eval sequences   %llu\n", static_cast<unsigned long long>(s.eval_sequences));
  std::printf("slots filled     %.1f%%\n", 100.0 * s.fill_ratio);
  std::printf("record lengths (tokens):\n");
  for (int i = 0; i < QLFT_HISTOGRAM_BUCKETS; ++i) {
    if (!s.length_histogram[i]) continue;
    unsigned lo = i * s.histogram_bucket_width, hi = lo + s.histogram_bucket_width;
    if (i == QLFT_HISTOGRAM_BUCKETS - 1)
      std::printf("  %6u+       %llu\n", lo,
                  static_cast<unsigned long long>(s.length_histogram[i]));
    else
      std::printf("  %6u-%-6u %llu\n", lo, hi - 1,
                  static_cast<unsigned long long>(s.length_histogram[i]));
  }
  return kOk;
}

}  // namespace cli
