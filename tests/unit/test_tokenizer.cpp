// Tokenizers against llama.cpp's vocabulary test vectors (shared/tokenizer-vectors: the ids
// llama.cpp's test-tokenizer-0 expects), round trips, streaming decode and bad input.
#include <gtest/gtest.h>

#include <sstream>

#include "core/error.h"
#include "support/test_support.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

using namespace qlft;

namespace {

struct Case {
  std::string text;
  std::vector<int32_t> ids;
};

// .inp: cases separated by "\n__ggml_vocab_test__\n"; .out: one line of ids per case.
std::vector<Case> load_cases(const std::string& inp, const std::string& out) {
  auto raw = qlft_test::read_file(inp);
  std::string s(raw.begin(), raw.end());
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<Case> cases;
  for (size_t pos; (pos = s.find(sep)) != std::string::npos; s.erase(0, pos + sep.size()))
    cases.push_back({s.substr(0, pos), {}});
  auto rawo = qlft_test::read_file(out);
  std::istringstream lines(std::string(rawo.begin(), rawo.end()));
  std::string line;
  for (size_t i = 0; i < cases.size() && std::getline(lines, line); ++i) {
    std::istringstream ids(line);
    int32_t id;
    while (ids >> id) cases[i].ids.push_back(id);
  }
  return cases;
}

std::string show(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t x : v) s += " " + std::to_string(x);
  return s;
}

void check_vectors(const std::string& name) {
  std::string gguf = qlft_test::shared_file("tokenizer-vectors/" + name + ".gguf");
  if (gguf.empty()) GTEST_SKIP() << "shared tokenizer vectors not found";
  auto cases = load_cases(gguf + ".inp", gguf + ".out");
  ASSERT_EQ(cases.size(), 46u);
  auto tok = Tokenizer::from_gguf_file(gguf);
  for (const Case& c : cases) {
    auto ids = tok->encode(c.text, false, false, false);
    EXPECT_EQ(ids, c.ids) << "text: '" << c.text << "'\n got:" << show(ids)
                          << "\n want:" << show(c.ids);
  }
}

void check_round_trip(const std::string& name) {
  std::string gguf = qlft_test::shared_file("tokenizer-vectors/" + name + ".gguf");
  if (gguf.empty()) GTEST_SKIP() << "shared tokenizer vectors not found";
  auto cases = load_cases(gguf + ".inp", gguf + ".out");
  auto tok = Tokenizer::from_gguf_file(gguf);
  for (const Case& c : cases) {
    EXPECT_EQ(tok->decode(tok->encode(c.text, false, false, false)), c.text);
    // With BOS/EOS: decode skips them, and the space prefix is still removed.
    EXPECT_EQ(tok->decode(tok->encode(c.text, true, true, false)), c.text);
  }
}

}  // namespace

TEST(TokenizerVectors, LlamaSpmMatchesLlamaCpp) {
  check_vectors("ggml-vocab-llama-spm");
}
TEST(TokenizerVectors, Gpt2MatchesLlamaCpp) {
  check_vectors("ggml-vocab-gpt-2");
}
TEST(TokenizerVectors, LlamaSpmRoundTrip) {
  check_round_trip("ggml-vocab-llama-spm");
}
TEST(TokenizerVectors, Gpt2RoundTrip) {
  check_round_trip("ggml-vocab-gpt-2");
}
