#include "data/chat_template.h"

#include "core/error.h"

namespace qlft::data {

namespace {

bool has(const std::string& s, const char* needle) {
  return s.find(needle) != std::string::npos;
}

// Decodes the escapes a Jinja string literal may hold (\n, \t, \', \", \\).
std::string jinja_unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      char c = s[++i];
      out += c == 'n' ? '\n' : c == 't' ? '\t' : c;
    } else {
      out += s[i];
    }
  }
  return out;
}

// Length of the whitespace character (as Python's str.isspace sees it) that starts at s[i] /
// ends at s[e-1], 0 if none. Jinja's trim and Python's strip() remove these.
size_t space_at(const std::string& s, size_t i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return 1;
  auto u = [&](size_t k) { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0; };
  if (c == 0xc2 && (u(1) == 0x85 || u(1) == 0xa0)) return 2;
  if (c == 0xe1 && u(1) == 0x9a && u(2) == 0x80) return 3;  // U+1680
  if (c == 0xe2 && u(1) == 0x80 &&
      ((u(2) >= 0x80 && u(2) <= 0x8a) || u(2) == 0xa8 || u(2) == 0xa9 || u(2) == 0xaf))
    return 3;                                               // U+2000..200A, 2028, 2029, 202F
  if (c == 0xe2 && u(1) == 0x81 && u(2) == 0x9f) return 3;  // U+205F
  if (c == 0xe3 && u(1) == 0x80 && u(2) == 0x80) return 3;  // U+3000
  return 0;
}

std::string py_strip(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e) {
    size_t n = space_at(s, b);
    if (!n) break;
    b += n;
  }
  while (e > b) {
    // Step back to the start of the last UTF-8 character.
    size_t k = e - 1;
    while (k > b && (static_cast<unsigned char>(s[k]) & 0xc0) == 0x80) --k;
    size_t n = space_at(s, k);
    if (!n || k + n != e) break;
    e = k;
  }
  return s.substr(b, e - b);
}

// Collects segments, merging neighbours with the same flags (fewer boundaries means the
// segment-wise tokenization stays closer to tokenizing the whole text).
struct Builder {
  std::vector<Segment> segs;
  void add(const std::string& text, bool special, bool trained) {
    if (text.empty()) return;
    if (!segs.empty() && segs.back().special == special && segs.back().trained == trained) {
      segs.back().text += text;
      return;
    }
    segs.push_back({text, special, trained});
  }
};

[[noreturn]] void alternation_error() {
  throw_error(QLFT_ERR_FORMAT,
              "conversation roles must alternate user/assistant/user/assistant "
              "(after an optional first system message) for this chat template");
}

void render_chatml(const ChatTemplate& t, const std::vector<Message>& m, Builder& b) {
  if (!t.default_system.empty() && (m.empty() || m[0].role != "system")) {
    b.add("<|im_start|>system\n", true, false);
    b.add(t.default_system, false, false);
    b.add("<|im_end|>\n", true, false);
  }
  for (const Message& x : m) {
    bool a = x.role == "assistant";
    b.add("<|im_start|>" + x.role + "\n", true, false);
    b.add(x.content, false, a);
    b.add("<|im_end|>", true, a);
    b.add("\n", true, false);
  }
}

void render_llama3(const ChatTemplate& t, const std::vector<Message>& m, Builder& b) {
  for (size_t i = 0; i < m.size(); ++i) {
    bool a = m[i].role == "assistant";
    b.add((i == 0 ? t.bos : "") + "<|start_header_id|>" + m[i].role + "<|end_header_id|>\n\n", true,
          false);
    b.add(py_strip(m[i].content), false, a);
    b.add("<|eot_id|>", true, a);
  }
}

void render_llama2(const ChatTemplate& t, const std::vector<Message>& m, Builder& b) {
  size_t first = 0;
  const std::string* system = nullptr;
  if (!m.empty() && m[0].role == "system") {
    system = &m[0].content;
    first = 1;
  }
  for (size_t i = first; i < m.size(); ++i) {
    size_t k = i - first;
    if ((m[i].role == "user") != (k % 2 == 0)) alternation_error();
    std::string content = m[i].content;
    if (k == 0 && system) content = "<<SYS>>\n" + *system + "\n<</SYS>>\n\n" + content;
    if (m[i].role == "user") {
      b.add(t.bos, true, false);
      b.add("[INST] " + py_strip(content) + " [/INST]", false, false);
    } else if (m[i].role == "assistant") {
      b.add(" " + py_strip(content) + " ", false, true);
      b.add(t.eos, true, true);
    }
  }
}

void render_mistral(const ChatTemplate& t, const std::vector<Message>& m, Builder& b) {
  // The Mixtral/Mistral-v0.1 template has no system role; like later Mistral templates we put a
  // system prompt before the first user message, separated by a blank line.
  size_t first = 0;
  std::string system;
  if (!m.empty() && m[0].role == "system") {
    system = m[0].content;
    first = 1;
  }
  b.add(t.bos, true, false);
  for (size_t i = first; i < m.size(); ++i) {
    size_t k = i - first;
    if ((m[i].role == "user") != (k % 2 == 0)) alternation_error();
    if (m[i].role == "user") {
      b.add("[INST] " + (k == 0 && first ? system + "\n\n" : std::string()) + m[i].content +
                " [/INST]",
            false, false);
    } else if (m[i].role == "assistant") {
      b.add(m[i].content, false, true);
      b.add(t.eos, true, true);
    } else {
      throw_error(QLFT_ERR_FORMAT,
                  "the mistral template supports only user and assistant roles "
                  "after an optional first system message");
    }
  }
}

const char* kAlpacaPreamble =
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.";
const char* kAlpacaPreambleInput =
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.";

void render_alpaca_chat(const ChatTemplate& t, const std::vector<Message>& m, Builder& b) {
  size_t first = 0;
  b.add(t.bos, true, false);
  if (!m.empty() && m[0].role == "system") {
    b.add(m[0].content, false, false);
    first = 1;
  } else {
    b.add(kAlpacaPreamble, false, false);
  }
  for (size_t i = first; i < m.size(); ++i) {
    if (m[i].role == "user") {
      b.add("\n\n### Instruction:\n" + m[i].content, false, false);
    } else if (m[i].role == "assistant") {
      b.add("\n\n### Response:\n", false, false);
      b.add(m[i].content, false, true);
      b.add(t.eos, true, true);
    } else {
      throw_error(QLFT_ERR_FORMAT, "the alpaca template allows a system message only first");
    }
  }
}

void render_none(const ChatTemplate& t, const std::vector<Message>& m, Builder& b) {
  b.add(t.bos, true, false);
  for (size_t i = 0; i < m.size(); ++i) {
    bool a = m[i].role == "assistant";
    if (i) b.add("\n", false, false);
    b.add(m[i].content, false, a);
    if (a) b.add(t.eos, true, true);
  }
}

}  // namespace

TemplateKind detect_template(const std::string& j, std::string* default_system) {
  if (default_system) default_system->clear();
  if (has(j, "<|im_start|>")) {
    if (default_system) {
      // A literal system turn in the template ('<|im_start|>system\nYou are ...<|im_end|>') is
      // the prompt the template adds when a chat has no system message (Qwen2, Qwen2.5).
      for (const char* head : {"<|im_start|>system\\n", "<|im_start|>system\n"}) {
        size_t p = j.find(head);
        while (p != std::string::npos) {
          size_t b = p + std::string(head).size();
          size_t e = j.find("<|im_end|>", b);
          if (e != std::string::npos && e > b &&
              j.substr(b, e - b).find_first_of("'\"+{}") == std::string::npos) {
            *default_system = jinja_unescape(j.substr(b, e - b));
            return TemplateKind::ChatML;
          }
          p = j.find(head, b);
        }
      }
    }
    return TemplateKind::ChatML;
  }
  if (has(j, "<|start_header_id|>")) return TemplateKind::Llama3;
  if (has(j, "[INST]")) return has(j, "<<SYS>>") ? TemplateKind::Llama2 : TemplateKind::Mistral;
  if (has(j, "### Instruction") || has(j, "### Response")) return TemplateKind::Alpaca;
  return TemplateKind::Auto;
}

namespace {
// Each resolved template kind's renderer (Auto is resolved before rendering: none).
using Renderer = void (*)(const ChatTemplate&, const std::vector<Message>&, Builder&);
const struct {
  TemplateKind kind;
  Renderer render;
} kRenderers[] = {
    {TemplateKind::ChatML, render_chatml},      {TemplateKind::Llama3, render_llama3},
    {TemplateKind::Llama2, render_llama2},      {TemplateKind::Mistral, render_mistral},
    {TemplateKind::Alpaca, render_alpaca_chat}, {TemplateKind::None, render_none}};
}  // namespace

std::vector<Segment> render_chat(const ChatTemplate& t, const std::vector<Message>& messages) {
  for (const auto& r : kRenderers) {
    if (r.kind != t.kind) continue;
    Builder b;
    r.render(t, messages, b);
    return std::move(b.segs);
  }
  throw_error(QLFT_ERR_INTERNAL, "render_chat: template not resolved");
}

std::vector<Segment> render_alpaca(const ChatTemplate& t, const Record& r) {
  if (t.kind == TemplateKind::Alpaca) {
    // Stanford Alpaca's PROMPT_DICT (prompt_input / prompt_no_input), then output + eos.
    Builder b;
    b.add(t.bos, true, false);
    bool with_input = !r.input.empty();
    b.add(!r.system.empty() ? r.system
          : with_input      ? kAlpacaPreambleInput
                            : kAlpacaPreamble,
          false, false);
    b.add("\n\n### Instruction:\n" + r.instruction, false, false);
    if (with_input) b.add("\n\n### Input:\n" + r.input, false, false);
    b.add("\n\n### Response:\n", false, false);
    b.add(r.output, false, true);
    b.add(t.eos, true, true);
    return std::move(b.segs);
  }
  std::vector<Message> m;
  if (!r.system.empty()) m.push_back({"system", r.system});
  m.push_back({"user", r.input.empty() ? r.instruction : r.instruction + "\n\n" + r.input});
  m.push_back({"assistant", r.output});
  return render_chat(t, m);
}

std::string joined_text(const std::vector<Segment>& segs) {
  std::string s;
  for (const Segment& g : segs) s += g.text;
  return s;
}

}  // namespace qlft::data
