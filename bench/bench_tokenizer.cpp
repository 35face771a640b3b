// Tokenizer throughput: encode all of shared/data/tinyshakespeare.txt with the stories260K
// SentencePiece vocabulary and with GPT-2's byte-level BPE, reporting input bytes/s.
//   build-bench/bench/bench_tokenizer --benchmark_min_time=2
// The `tokenizers` package's figure on the same text: tests/reference/bench_tokenizers_peer.py.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "tokenizer/tokenizer.h"

namespace {

std::string shared(const std::string& rel) {
  const char* e = std::getenv("QLFT_SHARED_DIR");
  return std::string(e && *e ? e : QLFT_SHARED_DIR_DEFAULT) + "/" + rel;
}

const std::string& text() {
  static const std::string t = [] {
    std::ifstream f(shared("data/tinyshakespeare.txt"), std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }();
  return t;
}

// The text in lines, as a dataset pipeline would hand over records.
const std::vector<std::string>& lines() {
  static const std::vector<std::string> v = [] {
    std::vector<std::string> out;
    std::istringstream in(text());
    for (std::string l; std::getline(in, l);) out.push_back(l + "\n");
    return out;
  }();
  return v;
}

void run(benchmark::State& st, const char* vocab, bool per_line) {
  if (text().empty()) {
    st.SkipWithError("shared/data/tinyshakespeare.txt not found (set QLFT_SHARED_DIR)");
    return;
  }
  auto tok = qlft::Tokenizer::from_gguf_file(shared(vocab));
  size_t n_tokens = 0;
  for (auto _ : st) {
    n_tokens = 0;
    if (per_line) {
      for (const auto& l : lines()) n_tokens += tok->encode(l, false, false, false).size();
    } else {
      n_tokens = tok->encode(text(), false, false, false).size();
    }
    benchmark::DoNotOptimize(n_tokens);
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations() * text().size()));
  st.counters["tokens"] = static_cast<double>(n_tokens);
}

void BM_EncodeSpmStories260k(benchmark::State& st) {
  run(st, "models/stories260K.gguf", false);
}
void BM_EncodeSpmStories260kLines(benchmark::State& st) {
  run(st, "models/stories260K.gguf", true);
}
void BM_EncodeBpeGpt2(benchmark::State& st) {
  run(st, "tokenizer-vectors/ggml-vocab-gpt-2.gguf", false);
}
void BM_EncodeBpeGpt2Lines(benchmark::State& st) {
  run(st, "tokenizer-vectors/ggml-vocab-gpt-2.gguf", true);
}

}  // namespace

BENCHMARK(BM_EncodeSpmStories260k)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeSpmStories260kLines)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeBpeGpt2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeBpeGpt2Lines)->Unit(benchmark::kMillisecond);
