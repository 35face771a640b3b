// Chat and instruction templates, rendered as text segments that each know whether they are
// template scaffolding (special tokens parsed) and whether they are trained on.
//
// The renderers reproduce these Jinja templates exactly (checked against transformers'
// apply_chat_template by tests/reference/gen_data_fixtures.py):
//   chatml  <|im_start|>role\ncontent<|im_end|>\n (and Qwen2's default system prompt, taken from
//           the model's template when it has one)
//   llama3  Meta-Llama-3-Instruct: bos, <|start_header_id|>role<|end_header_id|>\n\n
//           content|trim <|eot_id|>
//   llama2  Llama-2-chat: <s>[INST] <<SYS>>\nsys\n<</SYS>>\n\nuser [/INST] answer </s>
//   mistral Mistral/Mixtral-Instruct-v0.1: <s>[INST] user [/INST]answer</s>
//   alpaca  Stanford Alpaca's prompt ("Below is an instruction ... ### Instruction: ...
//           ### Response:") with eos after each response
//   none    the contents joined by "\n", eos after each assistant turn
//
// Loss-mask rule (what PEFT/TRL users expect from "assistant only" training): an assistant turn
// trains on its content AND the token that ends the turn (<|im_end|>, <|eot_id|>, </s>), so the
// model learns to stop; never on the role header before it nor on the "\n" after the end marker.
// For llama2 the space that the template puts before the answer is part of the trained span
// (SentencePiece merges it into the first answer token). At the token level a token is trained
// when any of its bytes is (see tokenize_record in dataset.h).
#pragma once

#include <string>
#include <vector>

#include "data/records.h"

namespace qlft::data {

struct ChatTemplate {
  TemplateKind kind = TemplateKind::Alpaca;
  std::string default_system;  // chatml: system turn added when the chat has none
  std::string bos, eos;        // how the model spells its BOS/EOS tokens
};

// Recognizes a Jinja chat template by its markers; Auto when none match. For ChatML templates
// with a built-in system prompt (Qwen2) it also returns that prompt.
TemplateKind detect_template(const std::string& jinja, std::string* default_system = nullptr);

struct Segment {
  std::string text;
  bool special = false;  // scaffolding: special-token spellings become special tokens
  bool trained = false;  // counted in the loss when training on completions only
};

// Throws QLFT_ERR_FORMAT (message without location; the caller adds it) when the messages do not
// fit the template (e.g. llama2/mistral need alternating user/assistant turns).
std::vector<Segment> render_chat(const ChatTemplate& t, const std::vector<Message>& messages);
// An alpaca record: the Alpaca prompt for kind Alpaca, else a user turn (instruction, plus
// "\n\n" + input when input is not empty) and an assistant turn (output), after the record's
// optional system prompt.
std::vector<Segment> render_alpaca(const ChatTemplate& t, const Record& r);

std::string joined_text(const std::vector<Segment>& segs);

}  // namespace qlft::data
