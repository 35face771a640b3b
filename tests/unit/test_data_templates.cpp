// Chat/instruction templates against transformers' apply_chat_template on real models' Jinja
// templates (fixture from tests/reference/gen_data_fixtures.py): the rendered text must be equal
// byte for byte, and the trained (loss) spans must equal the reference's assistant spans, first
// as characters, then as tokens after segment-wise tokenization.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/chat_template.h"
#include "data/dataset.h"
#include "data/model_template.h"
#include "data/text_encoder.h"
#include "data/tokenizer_encoder.h"
#include "formats/gguf.h"
#include "tokenizer/tokenizer.h"
#include "support/test_support.h"

using namespace qlft;
using namespace qlft::data;
using nlohmann::json;

namespace {

json load_cases() {
  auto bytes = qlft_test::read_file(qlft_test::fixture_path("data/templates.json"));
  return json::parse(bytes.begin(), bytes.end())["cases"];
}

Record record_of(const json& c) {
  Record r;
  if (c.contains("messages")) {
    r.format = DataFormat::Chat;
    for (const auto& m : c["messages"]) r.messages.push_back({m["role"], m["content"]});
  } else {
    r.format = DataFormat::Alpaca;
    r.instruction = c["record"]["instruction"];
    r.input = c["record"]["input"];
    r.output = c["record"]["output"];
  }
  return r;
}

ChatTemplate template_of(const json& c) {
  ChatTemplate t;
  t.kind = detect_template(c["jinja"].get<std::string>(), &t.default_system);
  t.bos = c["bos"];
  t.eos = c["eos"];
  return t;
}

std::vector<std::pair<size_t, size_t>> spans_of(const json& c) {
  std::vector<std::pair<size_t, size_t>> s;
  for (const auto& p : c["trained"]) s.push_back({p[0].get<size_t>(), p[1].get<size_t>()});
  return s;
}

// Trained byte spans of rendered segments (neighbouring trained segments joined).
std::vector<std::pair<size_t, size_t>> trained_spans(const std::vector<Segment>& segs) {
  std::vector<std::pair<size_t, size_t>> out;
  size_t pos = 0;
  for (const Segment& g : segs) {
    if (g.trained) {
      if (!out.empty() && out.back().second == pos)
        out.back().second += g.text.size();
      else
        out.push_back({pos, pos + g.text.size()});
    }
    pos += g.text.size();
  }
  return out;
}

bool inside(const std::vector<std::pair<size_t, size_t>>& spans, size_t b, size_t e) {
  for (auto [s0, s1] : spans)
    if (b >= s0 && e <= s1) return true;
  return false;
}

}  // namespace

TEST(DataTemplates, DetectsEveryReferenceTemplate) {
  json cases = load_cases();
  ASSERT_GT(cases.size(), 20u);
  for (const auto& c : cases) {
    std::string sys;
    TemplateKind k = detect_template(c["jinja"].get<std::string>(), &sys);
    EXPECT_STREQ(template_name(k), c["template"].get<std::string>().c_str()) << c["name"];
    std::string name = c["name"];
    EXPECT_EQ(sys, name.rfind("qwen2/", 0) == 0 ? "You are a helpful assistant." : "") << name;
  }
  EXPECT_EQ(detect_template("{{ messages }}"), TemplateKind::Auto);
  EXPECT_EQ(detect_template(""), TemplateKind::Auto);
}

TEST(DataTemplates, RenderedTextAndTrainedSpansMatchReference) {
  json cases = load_cases();
  for (const auto& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>());
    Record r = record_of(c);
    ChatTemplate t = template_of(c);
    std::vector<Segment> segs =
        r.format == DataFormat::Chat ? render_chat(t, r.messages) : render_alpaca(t, r);
    EXPECT_EQ(joined_text(segs), c["text"].get<std::string>());
    EXPECT_EQ(trained_spans(segs), spans_of(c));
  }
}

// Token level with a byte encoder that knows every special token of the templates: each token
// covers known bytes, so the mask can be checked against the reference spans token by token.
TEST(DataTemplates, TokenMaskCoversExactlyTheAssistantSpans) {
  ByteEncoder enc({"<s>", "</s>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>",
                   "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"});
  json cases = load_cases();
  for (const auto& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>());
    Record r = record_of(c);
    ChatTemplate t = template_of(c);
    std::vector<int32_t> ids;
    std::vector<uint8_t> trained;
    tokenize_record(r, t, TrainOn::Completion, enc, ids, trained);
    ASSERT_EQ(ids.size(), trained.size());
    const std::string text = c["text"];
    EXPECT_EQ(enc.decode(ids.data(), ids.size()), text);
    auto spans = spans_of(c);
    size_t pos = 0, n_trained = 0, n_special = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      size_t len = enc.decode(&ids[i], 1).size();
      EXPECT_EQ(trained[i] != 0, inside(spans, pos, pos + len)) << "token " << i << " at " << pos;
      n_trained += trained[i];
      n_special += ids[i] >= 256;
      pos += len;
    }
    EXPECT_GT(n_trained, 0u);
    // Template scaffolding became special tokens; the text has no literal spelling left over.
    if (!t.bos.empty() || t.kind == TemplateKind::ChatML) EXPECT_GT(n_special, 0u);

    tokenize_record(r, t, TrainOn::All, enc, ids, trained);
    for (uint8_t f : trained) EXPECT_EQ(f, 1);
  }
}

TEST(DataTemplates, UserContentNeverBecomesSpecialTokens) {
  ByteEncoder enc({"<s>", "</s>", "<|im_start|>", "<|im_end|>"});
  ChatTemplate t;
  t.kind = TemplateKind::ChatML;
  Record r;
  r.format = DataFormat::Chat;
  r.messages = {{"user", "<|im_end|>"}, {"assistant", "ok"}};
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;
  tokenize_record(r, t, TrainOn::Completion, enc, ids, trained);
  // <|im_start|>, "user\n", then the user's "<|im_end|>" as 10 bytes, then the real <|im_end|>.
  int specials = 0;
  for (int32_t id : ids) specials += id == enc.special_id("<|im_end|>");
  EXPECT_EQ(specials, 2);  // the two turn ends, not the user's text
}

// An encoder whose whole-text ids do not line up with the text (what TokenizerEncoder reports for
// a normalizer that rewrites text): encode_offsets fills ids and returns false.
class UnalignedEncoder final : public TextEncoder {
 public:
  explicit UnalignedEncoder(const ByteEncoder& b) : b_(b) {}
  void encode(std::string_view text, bool parse_special, bool continuation,
              std::vector<int32_t>& out) const override {
    b_.encode(text, parse_special, continuation, out);
  }
  bool encode_offsets(std::string_view text, std::vector<int32_t>& ids,
                      std::vector<uint32_t>& starts, std::vector<uint8_t>& special) const override {
    ids.clear();
    b_.encode(text, true, false, ids);
    starts.assign(ids.size(), 0);
    special.assign(ids.size(), 0);
    return false;
  }
  int32_t vocab_size() const override { return b_.vocab_size(); }
  int32_t bos_id() const override { return b_.bos_id(); }
  int32_t eos_id() const override { return b_.eos_id(); }
  std::string bos_text() const override { return b_.bos_text(); }
  std::string eos_text() const override { return b_.eos_text(); }

 private:
  const ByteEncoder& b_;
};

// When the whole-text offsets are unknown the record is tokenized segment by segment, and only
// that: bytes tokenize the same whole or in segments, so the ids and the mask equal the
// ByteEncoder's own (whose offsets line up).
TEST(DataTemplates, UnknownOffsetsFallBackToSegmentsAlone) {
  ByteEncoder bytes({"<s>", "</s>", "<|im_start|>", "<|im_end|>"});
  UnalignedEncoder unaligned(bytes);
  ChatTemplate t;
  t.kind = TemplateKind::ChatML;
  Record r;
  r.format = DataFormat::Chat;
  r.messages = {{"user", "hi"}, {"assistant", "ok"}};
  std::vector<int32_t> want_ids, ids;
  std::vector<uint8_t> want_trained, trained;
  tokenize_record(r, t, TrainOn::Completion, bytes, want_ids, want_trained);
  tokenize_record(r, t, TrainOn::Completion, unaligned, ids, trained);
  EXPECT_EQ(ids, want_ids);
  EXPECT_EQ(trained, want_trained);
}

TEST(DataTemplates, AlternationIsEnforcedLikeTheReference) {
  ChatTemplate t;
  t.bos = "<s>";
  t.eos = "</s>";
  std::vector<Message> bad = {{"user", "a"}, {"user", "b"}};
  for (TemplateKind k : {TemplateKind::Llama2, TemplateKind::Mistral}) {
    t.kind = k;
    try {
      render_chat(t, bad);
      ADD_FAILURE() << "no error for " << template_name(k);
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), QLFT_ERR_FORMAT);
      EXPECT_NE(std::string(e.what()).find("alternate"), std::string::npos);
    }
  }
  t.kind = TemplateKind::ChatML;
  EXPECT_NO_THROW(render_chat(t, bad));
}

TEST(DataTemplates, ResolveFallsBackToAlpaca) {
  std::string why;
  ByteEncoder none;
  EXPECT_EQ(resolve_template(TemplateKind::Auto, none, &why).kind, TemplateKind::Alpaca);
  EXPECT_NE(why.find("no chat template"), std::string::npos);
  ByteEncoder llama3({"<|begin_of_text|>", "<|eot_id|>"}, "...<|start_header_id|>...");
  ChatTemplate t = resolve_template(TemplateKind::Auto, llama3, &why);
  EXPECT_EQ(t.kind, TemplateKind::Llama3);
  EXPECT_EQ(t.bos, "<|begin_of_text|>");
  EXPECT_EQ(resolve_template(TemplateKind::Mistral, llama3, &why).kind, TemplateKind::Mistral);
}

// With real tokenizers (stories260K and Llama-2's SentencePiece vocabularies with byte fallback,
// GPT-2's byte-level BPE): the pipeline's ids are those of tokenizing the whole rendered text,
// and its loss mask equals the reference mask the fixture computed from the Hugging Face
// tokenizer's offsets.
TEST(DataTemplates, RealTokenizersTokensAndMaskMatchReference) {
  struct Vocab {
    const char* key;
    const char* gguf;
  } vocabs[] = {{"stories260k", "models/stories260K.gguf"},
                {"llama_spm", "tokenizer-vectors/ggml-vocab-llama-spm.gguf"},
                {"gpt2", "tokenizer-vectors/ggml-vocab-gpt-2.gguf"}};
  json cases = load_cases();
  int tested = 0;
  for (const Vocab& v : vocabs) {
    std::string path = qlft_test::shared_file(v.gguf);
    if (path.empty()) continue;
    auto tok = Tokenizer::from_gguf_file(path);
    TokenizerEncoder enc(*tok);
    for (const auto& c : cases) {
      SCOPED_TRACE(std::string(v.key) + " " + c["name"].get<std::string>());
      Record r = record_of(c);
      ChatTemplate t = template_of(c);
      std::vector<int32_t> ids;
      std::vector<uint8_t> trained;
      tokenize_record(r, t, TrainOn::Completion, enc, ids, trained);
      EXPECT_EQ(ids, c[v.key]["ids"].get<std::vector<int32_t>>());
      EXPECT_EQ(trained, c[v.key]["trained"].get<std::vector<uint8_t>>());
    }
    ++tested;
  }
  if (tested == 0) QLFT_SKIP("shared-missing") << "no shared vocabularies";
}

TEST(DataTemplates, ChatTemplateFromHfFiles) {
  std::string dir = qlft_test::temp_dir("data_hf_tmpl");
  auto put = [&](const std::string& name, const std::string& text) {
    qlft_test::write_file(dir + "/" + name, text.data(), text.size());
  };
  EXPECT_EQ(hf_chat_template(dir), "");
  put("tokenizer_config.json", "{\"chat_template\": \"{{ '<|im_start|>' }}\"}");
  EXPECT_EQ(hf_chat_template(dir), "{{ '<|im_start|>' }}");
  put("tokenizer_config.json",
      "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"x\"}, "
      "{\"name\": \"default\", \"template\": \"[INST]\"}]}");
  EXPECT_EQ(hf_chat_template(dir), "[INST]");
  put("tokenizer_config.json", "{\"chat_template\": ");
  EXPECT_EQ(hf_chat_template(dir), "");  // malformed: no template, no error
  put("chat_template.jinja", "<|start_header_id|>");
  EXPECT_EQ(hf_chat_template(dir), "<|start_header_id|>");
}

// generate.chat: the prompt of a chat (one user turn, then the assistant's header) is what
// transformers' apply_chat_template(add_generation_prompt=True) gives SmolLM2-135M-Instruct with
// the chat template its GGUF carries, default system prompt included (fixture from
// tests/reference/gen_chat_prompt_fixtures.py).
TEST(DataTemplates, GenerationPromptIsTransformersChatPrompt) {
  QLFT_NEED_SHARED(path, "models/smollm2-135m-instruct-q4_1.gguf");
  auto bytes = qlft_test::read_file(qlft_test::fixture_path("chat_prompt/prompts.json"));
  const json cases = json::parse(bytes.begin(), bytes.end())["cases"];
  ASSERT_GE(cases.size(), 5u);
  auto tok = Tokenizer::from_gguf_file(path);
  auto gguf = GgufFile::open(path);
  TokenizerEncoder enc(*tok, gguf->get_string("tokenizer.chat_template"));
  std::string source;
  const ChatTemplate t = resolve_template(TemplateKind::Auto, enc, &source);
  EXPECT_EQ(t.kind, TemplateKind::ChatML) << source;
  for (const auto& c : cases) {
    SCOPED_TRACE(c["prompt"].get<std::string>());
    EXPECT_EQ(generation_prompt(c["prompt"], t, enc), c["ids"].get<std::vector<int32_t>>());
  }
}
