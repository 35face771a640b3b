// Tokenizers against llama.cpp's vocabulary test vectors (shared/tokenizer-vectors: the ids
// llama.cpp's test-tokenizer-0 expects), round trips, streaming decode and bad input.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <random>
#include <thread>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"
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
  QLFT_NEED_SHARED(gguf, "tokenizer-vectors/" + name + ".gguf");
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
  QLFT_NEED_SHARED(gguf, "tokenizer-vectors/" + name + ".gguf");
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
// deepseek-coder: five regexes in sequence, each splitting the previous one's pieces.
TEST(TokenizerVectors, DeepseekCoderMatchesLlamaCpp) {
  check_vectors("ggml-vocab-deepseek-coder");
}
TEST(TokenizerVectors, DeepseekCoderRoundTrip) {
  check_round_trip("ggml-vocab-deepseek-coder");
}
TEST(TokenizerVectors, LlamaSpmRoundTrip) {
  check_round_trip("ggml-vocab-llama-spm");
}
TEST(TokenizerVectors, Gpt2RoundTrip) {
  check_round_trip("ggml-vocab-gpt-2");
}

// ---- malformed metadata: QLFT_ERR_FORMAT naming the key ----

namespace {

void expect_error(const std::function<void()>& f, int32_t status, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected an error mentioning " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), status) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

std::string write_vocab(const std::function<void(GgufWriter&)>& fill) {
  static int n = 0;
  std::string path = qlft_test::temp_dir("tok") + "/v" + std::to_string(n++) + ".gguf";
  GgufWriter w;
  fill(w);
  w.write(path);
  return path;
}

const std::vector<std::string> kTinyVocab = {"<unk>", "<s>", "</s>", "a", "b", "ab"};

}  // namespace

// ---- tokenizer.json parity: the `tokenizers` package's ids (fixtures) == ours from
// tokenizer.json == ours from the GGUF ----

namespace {

nlohmann::json expected_ids() {
  auto raw = qlft_test::read_file(qlft_test::fixture_path("tokenizer/expected_ids.json"));
  return nlohmann::json::parse(std::string(raw.begin(), raw.end()));
}

std::vector<std::string> vector_inputs(const std::string& rel) {
  std::string p = qlft_test::shared_file(rel);
  if (p.empty()) return {};
  std::vector<std::string> out;
  for (const Case& c : load_cases(p, p.substr(0, p.size() - 4) + ".out")) out.push_back(c.text);
  return out;
}

// The stories the fixture script took: split on <|endoftext|>, trimmed, first n non-empty.
std::vector<std::string> first_stories(size_t n) {
  std::string p = qlft_test::shared_file("data/tinystories-sample.txt");
  if (p.empty()) return {};
  auto raw = qlft_test::read_file(p);
  std::string s(raw.begin(), raw.end());
  std::vector<std::string> out;
  const std::string sep = "<|endoftext|>", ws = " \t\n\r\v\f";
  size_t pos = 0;
  while (out.size() < n && pos <= s.size()) {
    size_t end = s.find(sep, pos);
    if (end == std::string::npos) end = s.size();
    std::string part = s.substr(pos, end - pos);
    size_t a = part.find_first_not_of(ws), b = part.find_last_not_of(ws);
    if (a != std::string::npos) out.push_back(part.substr(a, b - a + 1));
    pos = end + sep.size();
  }
  return out;
}

void check_ids(const Tokenizer& tok, const std::vector<std::string>& texts,
               const nlohmann::json& want, const char* what) {
  ASSERT_EQ(texts.size(), want.size()) << what;
  for (size_t i = 0; i < texts.size(); ++i) {
    auto ids = tok.encode(texts[i], false, false, false);
    EXPECT_EQ(ids, want[i].get<std::vector<int32_t>>())
        << what << " input " << i << ": '" << texts[i] << "'\n got:" << show(ids);
  }
}

void check_parity(const std::string& name, const std::string& gguf_rel) {
  QLFT_NEED_SHARED(gguf, gguf_rel);
  auto want = expected_ids()[name];
  auto texts = vector_inputs(want["inputs"].get<std::string>());
  ASSERT_FALSE(texts.empty());
  auto from_json = Tokenizer::from_hf_json_file(
      qlft_test::fixture_path("tokenizer/" + name + "/tokenizer.json"));
  auto from_gguf = Tokenizer::from_gguf_file(gguf);
  check_ids(*from_json, texts, want["ids"], "tokenizer.json");
  check_ids(*from_gguf, texts, want["ids"], "gguf");
  EXPECT_EQ(from_json->bos_id(), from_gguf->bos_id());
  EXPECT_EQ(from_json->eos_id(), from_gguf->eos_id());
  EXPECT_EQ(from_json->unk_id(), from_gguf->unk_id());
  EXPECT_EQ(from_json->wants_bos(), from_gguf->wants_bos());
  for (const auto& t : texts) {
    auto ids = from_json->encode(t, false, false, false);
    EXPECT_EQ(from_json->decode(ids), t);
    EXPECT_EQ(from_json->decode(ids), from_gguf->decode(ids));
  }
}

}  // namespace

TEST(TokenizerHfParity, LlamaSpm) {
  check_parity("llama-spm", "tokenizer-vectors/ggml-vocab-llama-spm.gguf");
}
TEST(TokenizerHfParity, Gpt2) {
  check_parity("gpt-2", "tokenizer-vectors/ggml-vocab-gpt-2.gguf");
}
TEST(TokenizerHfParity, Stories260kVectors) {
  check_parity("stories260k", "models/stories260K.gguf");
}

TEST(TokenizerHfParity, Stories260kTinyStories) {
  QLFT_NEED_SHARED(gguf, "models/stories260K.gguf");
  auto want = expected_ids()["stories260k"];
  auto texts = first_stories(want["n_stories"].get<size_t>());
  auto tok = Tokenizer::from_gguf_file(gguf);
  EXPECT_EQ(tok->vocab_size(), 512);
  check_ids(*tok, texts, want["story_ids"], "stories260K.gguf");
  auto from_json =
      Tokenizer::from_hf_json_file(qlft_test::fixture_path("tokenizer/stories260k/tokenizer.json"));
  check_ids(*from_json, texts, want["story_ids"], "stories260k tokenizer.json");
  for (const auto& t : texts) EXPECT_EQ(tok->decode(tok->encode(t, true, true, false)), t);
}

// All of tinyshakespeare.txt (1.1 MB, one encode call): count and hash of the `tokenizers`
// package's ids with the full vocabularies.
namespace {
uint64_t fnv1a(const std::vector<int32_t>& ids) {
  uint64_t h = 0xCBF29CE484222325ULL;
  for (int32_t id : ids)
    for (int k = 0; k < 4; ++k)
      h = (h ^ ((static_cast<uint32_t>(id) >> (8 * k)) & 0xFF)) * 0x100000001B3ULL;
  return h;
}
void check_shakespeare(const Tokenizer& tok, const nlohmann::json& want, const char* what) {
  std::string p = qlft_test::shared_file("data/tinyshakespeare.txt");
  if (p.empty()) return;
  auto raw = qlft_test::read_file(p);
  std::string text(raw.begin(), raw.end());
  auto ids = tok.encode(text, false, false, false);
  EXPECT_EQ(ids.size(), want["count"].get<size_t>()) << what;
  char hex[32];
  snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(fnv1a(ids)));
  EXPECT_EQ(std::string(hex), want["fnv1a64"].get<std::string>()) << what;
  EXPECT_EQ(tok.decode(ids), text) << what;
}
}  // namespace

TEST(TokenizerHfParity, WholeTinyShakespeare) {
  QLFT_NEED_SHARED(text, "data/tinyshakespeare.txt");
  auto want = expected_ids();
  for (const auto& [name, rel] : {std::pair<std::string, std::string>{
                                      "llama-spm", "tokenizer-vectors/ggml-vocab-llama-spm.gguf"},
                                  {"gpt-2", "tokenizer-vectors/ggml-vocab-gpt-2.gguf"},
                                  {"stories260k", "models/stories260K.gguf"}}) {
    std::string g = qlft_test::shared_file(rel);
    if (g.empty()) continue;
    check_shakespeare(*Tokenizer::from_gguf_file(g), want[name]["tinyshakespeare"], rel.c_str());
  }
  check_shakespeare(*Tokenizer::from_hf_json_file(
                        qlft_test::fixture_path("tokenizer/stories260k/tokenizer.json")),
                    want["stories260k"]["tinyshakespeare"], "stories260k tokenizer.json");
}

// The other llama.cpp pre-tokenizers (PCRE2 vs the `tokenizers` package's regex engine): the
// GPT-2 vocabulary re-labelled with tokenizer.ggml.pre = llama3 / qwen2 / smollm, and the
// multi-regex falcon / deepseek-llm / deepseek-v3 (a Sequence of isolated Splits), against the
// ids of a tokenizer.json spelled the way those model families spell it.
TEST(TokenizerHfParity, PreTokenizerVariants) {
  QLFT_NEED_SHARED(gpt2, "tokenizer-vectors/ggml-vocab-gpt-2.gguf");
  auto want = expected_ids();
  auto texts = vector_inputs("tokenizer-vectors/ggml-vocab-gpt-2.gguf.inp");
  for (const auto& e : want["extra_inputs"]) texts.push_back(e.get<std::string>());
  auto src = GgufFile::open(gpt2);
  auto strings = [&](const char* key) {
    std::vector<std::string> v;
    for (auto sv : src->find(key)->strings) v.emplace_back(sv);
    return v;
  };
  const auto tokens = strings("tokenizer.ggml.tokens"), merges = strings("tokenizer.ggml.merges");
  std::vector<int32_t> types;
  const GgufValue* tv = src->find("tokenizer.ggml.token_type");
  for (uint64_t i = 0; i < tv->count; ++i) types.push_back(static_cast<int32_t>(tv->array_i(i)));
  for (const char* pre : {"llama3", "qwen2", "smollm", "falcon", "deepseek-llm", "deepseek-v3"}) {
    const std::string name = std::string("gpt-2-") + pre;
    SCOPED_TRACE(name);
    auto json = Tokenizer::from_hf_json_file(
        qlft_test::fixture_path("tokenizer/" + name + "/tokenizer.json"));
    check_ids(*json, texts, want[name]["ids"], "tokenizer.json");
    auto gguf = Tokenizer::from_gguf_file(write_vocab([&](GgufWriter& w) {
      w.add_string("tokenizer.ggml.model", "gpt2");
      w.add_string("tokenizer.ggml.pre", pre);
      w.add_string_array("tokenizer.ggml.tokens", tokens);
      w.add_array("tokenizer.ggml.token_type", types);
      w.add_string_array("tokenizer.ggml.merges", merges);
    }));
    check_ids(*gguf, texts, want[name]["ids"], "gguf");
    for (const auto& t : texts) EXPECT_EQ(gguf->decode(gguf->encode(t, false, false, false)), t);
  }
}

// Metaspace(prepend_scheme="first") instead of the Prepend normalizer: different ids for text
// that starts with a space, and the decoder's own leading-space rule.
TEST(TokenizerHfParity, MetaspacePreTokenizer) {
  QLFT_NEED_SHARED(inp, "tokenizer-vectors/ggml-vocab-llama-spm.gguf.inp");
  auto want = expected_ids();
  auto texts = vector_inputs("tokenizer-vectors/ggml-vocab-llama-spm.gguf.inp");
  for (const auto& e : want["extra_inputs"]) texts.push_back(e.get<std::string>());
  auto tok = Tokenizer::from_hf_json_file(
      qlft_test::fixture_path("tokenizer/stories260k-metaspace/tokenizer.json"));
  const auto& w = want["stories260k-metaspace"];
  check_ids(*tok, texts, w["ids"], "metaspace");
  for (size_t i = 0; i < texts.size(); ++i)
    EXPECT_EQ(tok->decode(w["ids"][i].get<std::vector<int32_t>>()),
              w["decoded"][i].get<std::string>())
        << "input " << i;
}

// ---- special tokens, streaming, bad input ----

TEST(Tokenizer, SpecialTokensOnlyWithParseSpecial) {
  QLFT_NEED_SHARED(gguf, "tokenizer-vectors/ggml-vocab-llama-spm.gguf");
  auto tok = Tokenizer::from_gguf_file(gguf);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->unk_id(), 0);
  EXPECT_EQ(tok->pad_id(), -1);
  EXPECT_EQ(tok->vocab_size(), 32000);
  EXPECT_TRUE(tok->is_special(1));
  EXPECT_FALSE(tok->is_special(15043));
  auto plain = tok->encode("a</s>", false, false, false);
  auto parsed = tok->encode("a</s>", false, false, true);
  EXPECT_EQ(parsed, (std::vector<int32_t>{tok->encode("a", false, false, false)[0], 2}));
  EXPECT_NE(plain.back(), 2);
  EXPECT_EQ(tok->decode(plain), "a</s>");
  EXPECT_EQ(tok->decode(parsed), "a");
  EXPECT_EQ(tok->decode(parsed, false), "a</s>");
  auto with = tok->encode("Hello", true, true, false);
  EXPECT_EQ(with.front(), 1);
  EXPECT_EQ(with.back(), 2);
  EXPECT_EQ(tok->token_to_piece(15043), " Hello");  // "▁Hello"
  EXPECT_EQ(tok->token_to_piece(13), "\n");         // <0x0A>
  EXPECT_EQ(tok->token_to_piece(1, false), "");
  EXPECT_EQ(tok->token_id("\xe2\x96\x81Hello"), 15043);
  // A continuation gets no space prefix: "Hello" then " world" is "Hello world" (.out ids).
  auto cont = tok->encode("Hello", false, false, false);
  tok->encode_append(" world", false, cont, true);
  EXPECT_EQ(cont, (std::vector<int32_t>{15043, 3186}));
  auto fresh = tok->encode("Hello", false, false, false);
  tok->encode_append(" world", false, fresh, false);
  EXPECT_EQ(fresh, (std::vector<int32_t>{15043, 29871, 3186}));
}

TEST(Tokenizer, StreamDecoderEmitsOnlyCompleteUtf8) {
  QLFT_NEED_SHARED(gguf, "tokenizer-vectors/ggml-vocab-llama-spm.gguf");
  auto tok = Tokenizer::from_gguf_file(gguf);
  // 🦙 has no token: it is four byte tokens, of which the first three must be held back.
  const std::string text = " this is \xF0\x9F\xA6\x99.cpp \xC3\xA9t\xC3\xA9";
  auto ids = tok->encode(text, true, false, false);
  StreamDecoder sd(*tok);
  std::string all;
  int held = 0;
  for (int32_t id : ids) {
    std::string part = sd.push(id);
    for (size_t i = 0; i < part.size();) {
      int n = tok::utf8_valid_prefix(reinterpret_cast<const uint8_t*>(part.data()) + i,
                                     part.size() - i);
      ASSERT_GT(n, 0) << "incomplete or invalid UTF-8 returned";
      i += static_cast<size_t>(n);
    }
    if (part.empty() && sd.pending() > 0) ++held;
    all += part;
  }
  all += sd.flush();
  EXPECT_EQ(all, text);
  EXPECT_EQ(held, 3);
  EXPECT_EQ(all, tok->decode(ids));
  // A truncated sequence comes out as U+FFFD on flush; a stray continuation byte at once.
  StreamDecoder sd2(*tok);
  EXPECT_EQ(sd2.push(tok->token_id("<0xF0>")), "");
  EXPECT_EQ(sd2.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(sd2.push(tok->token_id("<0x9F>")), "\xEF\xBF\xBD");
}

TEST(Tokenizer, InvalidUtf8TextRoundTripsThroughBytes) {
  const std::string bad[] = {
      std::string("abc\xff\xfe def", 9), std::string("\xC3", 1), std::string("x\xE2\x82", 3),
      std::string("\x80\x80 \xF4\x90\x80\x80", 7), std::string("caf\xC3\xA9\0zero", 10)};
  for (const char* rel : {"tokenizer-vectors/ggml-vocab-llama-spm.gguf",
                          "tokenizer-vectors/ggml-vocab-gpt-2.gguf", "models/stories260K.gguf"}) {
    QLFT_NEED_SHARED(gguf, rel);
    auto tok = Tokenizer::from_gguf_file(gguf);
    for (const auto& s : bad) {
      auto ids = tok->encode(s, false, false, false);
      EXPECT_EQ(tok->decode(ids), s) << rel;
      for (int32_t id : ids) EXPECT_NE(id, tok->unk_id()) << rel;
    }
  }
  auto j = Tokenizer::from_hf_json_file(qlft_test::fixture_path("tokenizer/gpt-2/tokenizer.json"));
  for (const auto& s : bad) EXPECT_EQ(j->decode(j->encode(s, false, false, false)), s);
}

TEST(Tokenizer, DecodeRejectsOutOfRangeIds) {
  auto j =
      Tokenizer::from_hf_json_file(qlft_test::fixture_path("tokenizer/stories260k/tokenizer.json"));
  try {
    j->decode(std::vector<int32_t>{5, 512});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_INVALID_ARGUMENT);
  }
  EXPECT_THROW(j->token_to_piece(-1), Error);
}

TEST(TokenizerMalformed, GgufMetadataErrorsNameTheKey) {
  auto load = [](const std::string& p) { return [p] { Tokenizer::from_gguf_file(p); }; };
  expect_error(load(write_vocab([](GgufWriter& w) { w.add_string("general.name", "x"); })),
               QLFT_ERR_FORMAT, "tokenizer.ggml.model");
  expect_error(
      load(write_vocab([](GgufWriter& w) { w.add_string("tokenizer.ggml.model", "llama"); })),
      QLFT_ERR_FORMAT, "tokenizer.ggml.tokens");
  expect_error(load(write_vocab([](GgufWriter& w) {
                 w.add_string("tokenizer.ggml.model", "llama");
                 w.add_u32("tokenizer.ggml.tokens", 3);
               })),
               QLFT_ERR_FORMAT, "tokenizer.ggml.tokens");
  expect_error(load(write_vocab([](GgufWriter& w) {
                 w.add_string("tokenizer.ggml.model", "llama");
                 w.add_string_array("tokenizer.ggml.tokens", kTinyVocab);
                 w.add_array("tokenizer.ggml.scores", std::vector<float>{0, 0, 0});
               })),
               QLFT_ERR_FORMAT, "tokenizer.ggml.scores");
  expect_error(load(write_vocab([](GgufWriter& w) {
                 w.add_string("tokenizer.ggml.model", "llama");
                 w.add_string_array("tokenizer.ggml.tokens", kTinyVocab);
                 w.add_string_array("tokenizer.ggml.token_type", kTinyVocab);
               })),
               QLFT_ERR_FORMAT, "tokenizer.ggml.token_type");
  expect_error(load(write_vocab([](GgufWriter& w) {
                 w.add_string("tokenizer.ggml.model", "gpt2");
                 w.add_string_array("tokenizer.ggml.tokens", kTinyVocab);
               })),
               QLFT_ERR_FORMAT, "tokenizer.ggml.merges");
  expect_error(load(write_vocab([](GgufWriter& w) {
                 w.add_string("tokenizer.ggml.model", "gpt2");
                 w.add_string_array("tokenizer.ggml.tokens", kTinyVocab);
                 w.add_string_array("tokenizer.ggml.merges", {"a b", "ab"});
               })),
               QLFT_ERR_FORMAT, "tokenizer.ggml.merges");
  expect_error(load(write_vocab([](GgufWriter& w) {
                 w.add_string("tokenizer.ggml.model", "gpt2");
                 w.add_string("tokenizer.ggml.pre", "no-such-pre");
                 w.add_string_array("tokenizer.ggml.tokens", kTinyVocab);
                 w.add_string_array("tokenizer.ggml.merges", {"a b"});
               })),
               QLFT_ERR_UNSUPPORTED, "no-such-pre");
  expect_error(load(write_vocab([](GgufWriter& w) {
                 w.add_string("tokenizer.ggml.model", "bert");
                 w.add_string_array("tokenizer.ggml.tokens", kTinyVocab);
               })),
               QLFT_ERR_UNSUPPORTED, "tokenizer.ggml.model");
  expect_error(load(write_vocab([](GgufWriter& w) {
                 w.add_string("tokenizer.ggml.model", "llama");
                 w.add_string_array("tokenizer.ggml.tokens", kTinyVocab);
                 w.add_string("tokenizer.ggml.bos_token_id", "one");
               })),
               QLFT_ERR_FORMAT, "tokenizer.ggml.bos_token_id");
}

TEST(TokenizerMalformed, TinyGgufVocabsWork) {
  // A minimal SPM vocabulary without byte tokens: unknown characters become <unk>; an
  // out-of-range special id falls back to the default like llama.cpp.
  auto spm = Tokenizer::from_gguf_file(write_vocab([](GgufWriter& w) {
    w.add_string("tokenizer.ggml.model", "llama");
    w.add_string_array("tokenizer.ggml.tokens",
                       {"<unk>", "<s>", "</s>", "a", "b", "ab", "\xe2\x96\x81"});
    w.add_array("tokenizer.ggml.scores", std::vector<float>{0, 0, 0, -1, -1, -0.5f, -2});
    w.add_array("tokenizer.ggml.token_type", std::vector<int32_t>{2, 3, 3, 1, 1, 1, 1});
    w.add_u32("tokenizer.ggml.eos_token_id", 99);
  }));
  EXPECT_EQ(spm->encode("abz", false, false, false), (std::vector<int32_t>{6, 5, 0}));
  EXPECT_EQ(spm->eos_id(), 2);
  // Without tokenizer.ggml.token_type, <0xNN> tokens still decode to their byte.
  auto untyped = Tokenizer::from_gguf_file(write_vocab([](GgufWriter& w) {
    w.add_string("tokenizer.ggml.model", "llama");
    w.add_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "<0x7A>", "a"});
  }));
  EXPECT_EQ(untyped->encode("az", false, false, false), (std::vector<int32_t>{0, 4, 3}));
  EXPECT_EQ(untyped->token_to_piece(3), "z");
  auto bpe = Tokenizer::from_gguf_file(write_vocab([](GgufWriter& w) {
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string("tokenizer.ggml.pre", "qwen2");
    w.add_string_array("tokenizer.ggml.tokens", {"a", "b", "ab", "1", "Ġ"});
    w.add_string_array("tokenizer.ggml.merges", {"a b", "x y"});
  }));
  // Bytes outside this tiny alphabet have no token and no <unk>: they are dropped.
  EXPECT_EQ(bpe->encode("ab 11", false, false, false), (std::vector<int32_t>{2, 4, 3, 3}));
}

// BOS/EOS as each model's tokenizer adds them: the GGUF flags, else llama.cpp's defaults
// (SentencePiece: BOS; byte-level BPE: BOS only for the Llama-3 family; EOS never).
TEST(TokenizerSpecials, GgufFlagsAndLlamaCppDefaults) {
  const std::vector<std::string> spm_tokens = {"<unk>", "<s>", "</s>", "a", "\xe2\x96\x81"};
  auto spm = [&](std::function<void(GgufWriter&)> more) {
    return Tokenizer::from_gguf_file(write_vocab([&](GgufWriter& w) {
      w.add_string("tokenizer.ggml.model", "llama");
      w.add_string_array("tokenizer.ggml.tokens", spm_tokens);
      w.add_array("tokenizer.ggml.token_type", std::vector<int32_t>{2, 3, 3, 1, 1});
      more(w);
    }));
  };
  auto spm_default = spm([](GgufWriter&) {});
  EXPECT_TRUE(spm_default->wants_bos());
  EXPECT_FALSE(spm_default->wants_eos());
  EXPECT_EQ(spm_default->encode_as_model("a", false), (std::vector<int32_t>{1, 4, 3}));
  auto spm_flags = spm([](GgufWriter& w) {
    w.add_bool("tokenizer.ggml.add_bos_token", false);
    w.add_bool("tokenizer.ggml.add_eos_token", true);
  });
  EXPECT_EQ(spm_flags->encode_as_model("a", false), (std::vector<int32_t>{4, 3, 2}));

  auto bpe = [](const char* pre, std::function<void(GgufWriter&)> more) {
    return Tokenizer::from_gguf_file(write_vocab([&](GgufWriter& w) {
      w.add_string("tokenizer.ggml.model", "gpt2");
      w.add_string("tokenizer.ggml.pre", pre);
      w.add_string_array("tokenizer.ggml.tokens", {"a", "b", "ab", "<|begin|>", "<|end|>"});
      w.add_array("tokenizer.ggml.token_type", std::vector<int32_t>{1, 1, 1, 3, 3});
      w.add_string_array("tokenizer.ggml.merges", {"a b"});
      w.add_u32("tokenizer.ggml.bos_token_id", 3);
      w.add_u32("tokenizer.ggml.eos_token_id", 4);
      more(w);
    }));
  };
  for (const char* pre :
       {"gpt-2", "qwen2", "smollm", "deepseek-coder", "deepseek-llm", "deepseek-v3", "falcon"}) {
    SCOPED_TRACE(pre);
    EXPECT_EQ(bpe(pre, [](GgufWriter&) {})->encode_as_model("ab", false),
              (std::vector<int32_t>{2}));
  }
  for (const char* pre : {"llama3", "llama-bpe"})
    EXPECT_EQ(bpe(pre, [](GgufWriter&) {})->encode_as_model("ab", false),
              (std::vector<int32_t>{3, 2}))
        << pre;
  // SmolLM2's GGUF says add_bos_token = false; its BOS (<|im_start|>) is never prepended.
  EXPECT_EQ(bpe("smollm", [](GgufWriter& w) { w.add_bool("tokenizer.ggml.add_bos_token", false); })
                ->encode_as_model("ab", false),
            (std::vector<int32_t>{2}));
  EXPECT_EQ(bpe("llama3",
                [](GgufWriter& w) {
                  w.add_bool("tokenizer.ggml.add_bos_token", false);
                  w.add_bool("tokenizer.ggml.add_eos_token", true);
                })
                ->encode_as_model("ab", false),
            (std::vector<int32_t>{2, 4}));
}

TEST(TokenizerSpecials, DeepseekCoderGgufAddsItsBos) {
  QLFT_NEED_SHARED(gguf, "tokenizer-vectors/ggml-vocab-deepseek-coder.gguf");
  auto t = Tokenizer::from_gguf_file(gguf);  // add_bos_token = true in the file
  auto ids = t->encode_as_model("Hello", false);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), t->bos_id());
  EXPECT_EQ(t->token_text(t->bos_id()),
            "<\xef\xbd\x9c"
            "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
}

// tokenizer.json: tokenizer_config.json's add_bos_token / add_eos_token, else the
// post-processor's template, alone or inside a Sequence (as Llama-3's is).
TEST(TokenizerSpecials, HfConfigFlagsAndPostProcessor) {
  const std::string model =
      R"("model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]},)"
      R"("added_tokens":[{"id":3,"content":"<s>","special":true},)"
      R"({"id":4,"content":"</s>","special":true}],)"
      R"("pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"use_regex":true})";
  const std::string tmpl =
      R"({"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}},)"
      R"({"Sequence":{"id":"A","type_id":0}},{"SpecialToken":{"id":"</s>","type_id":0}}],)"
      R"("pair":[],"special_tokens":{}})";
  auto ids = [&](const std::string& pp, const std::string& cfg) {
    std::string j = "{" + model + (pp.empty() ? "" : ",\"post_processor\":" + pp) + "}";
    return Tokenizer::from_hf_json_text(j, cfg, "t.json")->encode_as_model("ab", false);
  };
  EXPECT_EQ(ids("", ""), (std::vector<int32_t>{2}));
  EXPECT_EQ(ids(tmpl, ""), (std::vector<int32_t>{3, 2, 4}));
  EXPECT_EQ(ids(R"({"type":"Sequence","processors":[{"type":"ByteLevel"},)" + tmpl + "]}", ""),
            (std::vector<int32_t>{3, 2, 4}));
  EXPECT_EQ(ids(tmpl, R"({"add_bos_token":false,"add_eos_token":false})"),
            (std::vector<int32_t>{2}));
  EXPECT_EQ(ids("", R"({"bos_token":"<s>","add_bos_token":true})"), (std::vector<int32_t>{3, 2}));
}

// The vocabulary alone from any form of a model: vocabulary-only GGUF, directory, tokenizer.json.
TEST(TokenizerSpecials, FromPathLoadsOnlyTheVocabulary) {
  QLFT_NEED_SHARED(gguf, "tokenizer-vectors/ggml-vocab-deepseek-coder.gguf");
  EXPECT_GT(Tokenizer::from_path(gguf)->vocab_size(), 32000);
  const std::string dir = qlft_test::fixture_path("tokenizer/gpt-2");
  EXPECT_EQ(Tokenizer::from_path(dir)->vocab_size(),
            Tokenizer::from_path(dir + "/tokenizer.json")->vocab_size());
  const std::string empty = qlft_test::temp_dir("tok_from_path");
  expect_error([&] { Tokenizer::from_path(empty); }, QLFT_ERR_FORMAT, "no tokenizer.json");
  expect_error([&] { Tokenizer::from_path(empty + "/missing.gguf"); }, QLFT_ERR_IO, "missing.gguf");
}

TEST(TokenizerMalformed, TokenizerJsonErrors) {
  auto load = [](const std::string& s) {
    return [s] { Tokenizer::from_hf_json_text(s, "", "t.json"); };
  };
  expect_error(load("{"), QLFT_ERR_FORMAT, "t.json");
  expect_error(load("{}"), QLFT_ERR_FORMAT, "model");
  expect_error(load(R"({"model":{"type":"BPE","vocab":[1,2]}})"), QLFT_ERR_FORMAT, "vocab");
  expect_error(load(R"({"model":{"type":"BPE","vocab":{"a":-4}}})"), QLFT_ERR_FORMAT, "'a'");
  expect_error(load(R"({"model":{"type":"BPE","vocab":{"a":0},"merges":["ab"]}})"), QLFT_ERR_FORMAT,
               "merges[0]");
  expect_error(load(R"({"model":{"type":"Unigram","vocab":[]}})"), QLFT_ERR_UNSUPPORTED, "Unigram");
  expect_error(load(R"({"model":{"type":"BPE","vocab":{"a":0}},
                        "pre_tokenizer":{"type":"Split","pattern":{"Regex":"(["},
                                         "behavior":"Isolated"}})"),
               QLFT_ERR_FORMAT, "regex");
  expect_error(load(R"({"model":{"type":"BPE","vocab":{"a":0}},"added_tokens":[{"id":"x"}]})"),
               QLFT_ERR_FORMAT, "added_tokens");
}

// Random bytes never crash and always round-trip through the byte tokens; random ids decode,
// and the stream decoder's output is the valid-UTF-8 rendering of decode()'s.
TEST(Tokenizer, RandomInputNeverCrashes) {
  std::mt19937 rng(1234);
  for (const char* rel : {"tokenizer-vectors/ggml-vocab-llama-spm.gguf",
                          "tokenizer-vectors/ggml-vocab-gpt-2.gguf", "models/stories260K.gguf"}) {
    QLFT_NEED_SHARED(gguf, rel);
    auto tok = Tokenizer::from_gguf_file(gguf);
    const char alphabet[] = "ab \n\t<>/s0x\xC3\xA9\xE2\x96\x81\xF0\x9F\xA6\x99\xFF'";
    for (int iter = 0; iter < 300; ++iter) {
      std::string s;
      int len = static_cast<int>(rng() % 40);
      for (int k = 0; k < len; ++k)
        s.push_back(rng() % 3 ? alphabet[rng() % (sizeof(alphabet) - 1)]
                              : static_cast<char>(rng()));
      for (bool special : {false, true}) {
        auto ids = tok->encode(s, iter % 2, iter % 3 == 0, special);
        for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok->vocab_size());
        if (!special) EXPECT_EQ(tok->decode(ids), s) << rel;
      }
      std::vector<int32_t> rid(rng() % 12);
      for (auto& id : rid) id = static_cast<int32_t>(rng() % tok->vocab_size());
      std::string whole = tok->decode(rid, false);
      StreamDecoder sd(*tok, false);
      std::string streamed;
      for (int32_t id : rid) streamed += sd.push(id);
      streamed += sd.flush();
      if (tok::utf8_valid_prefix(reinterpret_cast<const uint8_t*>(whole.data()), whole.size()) !=
          -1) {
        bool valid = true;
        for (size_t i = 0; i < whole.size() && valid;) {
          int n = tok::utf8_valid_prefix(reinterpret_cast<const uint8_t*>(whole.data()) + i,
                                         whole.size() - i);
          valid = n > 0;
          i += n > 0 ? static_cast<size_t>(n) : 0;
        }
        if (valid) EXPECT_EQ(streamed, whole) << rel;
      }
    }
  }
}

// encode() is const and safe to call from several threads at once (per-thread scratch/cache).
TEST(Tokenizer, ConcurrentEncodeMatchesSerial) {
  QLFT_NEED_SHARED(gguf, "tokenizer-vectors/ggml-vocab-gpt-2.gguf");
  QLFT_NEED_SHARED(inp, "tokenizer-vectors/ggml-vocab-gpt-2.gguf.inp");
  auto tok = Tokenizer::from_gguf_file(gguf);
  auto texts = vector_inputs("tokenizer-vectors/ggml-vocab-gpt-2.gguf.inp");
  std::vector<std::vector<int32_t>> serial;
  for (const auto& t : texts) serial.push_back(tok->encode(t, false, false, false));
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int th = 0; th < 4; ++th)
    threads.emplace_back([&, th] {
      for (int rep = 0; rep < 20; ++rep)
        for (size_t i = 0; i < texts.size(); ++i) {
          size_t k = (i + th * 7 + rep) % texts.size();
          if (tok->encode(texts[k], false, false, false) != serial[k]) ++mismatches;
        }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// Long runs of one character class (regex backtracking / JIT stack, merge queues on one huge
// word) encode and round-trip.
TEST(Tokenizer, LongRunsOfOneClass) {
  QLFT_NEED_SHARED(gpt2, "tokenizer-vectors/ggml-vocab-gpt-2.gguf");
  QLFT_NEED_SHARED(spm, "tokenizer-vectors/ggml-vocab-llama-spm.gguf");
  auto variant = Tokenizer::from_hf_json_file(
      qlft_test::fixture_path("tokenizer/gpt-2-llama3/tokenizer.json"));
  auto a = Tokenizer::from_gguf_file(gpt2);
  auto b = Tokenizer::from_gguf_file(spm);
  const size_t n = 100000;
  for (const std::string& s :
       {std::string(n, ' '), std::string(n, 'a'), std::string(n, '7'), std::string(n, '\n'),
        std::string(n / 2, ' ') + "x" + std::string(n / 2, '\t'), [&] {
          std::string r;
          while (r.size() < n) r += "\r\n \xC3\xA9";
          return r;
        }()}) {
    for (const Tokenizer* t : {a.get(), b.get(), variant.get()}) {
      auto ids = t->encode(s, false, false, false);
      EXPECT_FALSE(ids.empty());
      EXPECT_EQ(t->decode(ids), s);
    }
  }
}
