// Preference data (train.objective dpo | ipo | orpo | simpo | kto): JSON lines records read and
// tokenized as TRL 1.16's DPOTrainer / KTOTrainer tokenize their non-conversational form.
//
// Paired records {"prompt", "chosen", "rejected"} (strings); KTO's unpaired records
// {"prompt", "completion", "label": true|false}. The conversational form (TRL's): "prompt" a
// list of {"role", "content"} messages and each answer a list of messages (an assistant turn),
// rendered through the chat template (data.template) as a chat record. A bad record is a
// QLFT_ERR_FORMAT naming the file and line (data.on_error=skip counts it instead).
//
// Tokenization (TRL's tokenize_fn): EOS is appended to each answer as text; prompt and
// prompt + answer are tokenized whole (BOS first when the model wants it), and the answer starts
// where the two token sequences diverge (the smaller of the chosen / rejected divergence
// points), so a token merging across the boundary goes to the answer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/chat_template.h"
#include "data/records.h"
#include "data/text_encoder.h"

namespace qlft::data {

struct PrefRecord {
  std::string prompt, chosen, rejected;  // paired
  std::string completion;                // KTO
  bool label = true;                     // KTO: desirable
  bool chat = false;                     // conversational: the messages below instead
  std::vector<Message> prompt_msgs, chosen_msgs, rejected_msgs;  // KTO: completion in chosen
  std::string where;                                             // "file.jsonl:12"
};

// kto: the unpaired form. Reads a .jsonl file (or a .json file of JSON lines).
std::vector<PrefRecord> read_preference_records(const std::string& path, bool kto,
                                                const ReadOptions& opt, DropLog& log);

// A record as token ids: the prompt, then the answer(s) that follow it.
struct PrefExample {
  std::vector<int32_t> prompt, chosen, rejected;  // KTO: its completion in chosen
  bool desirable = true;
  std::string where;
};

// chat: the template of conversational records (rendered as tokenize_record renders a chat
// record; the answer is the conversation's last trained run of tokens and what follows it,
// TRL's tokens after the generation prompt); may be null when no record is conversational.
PrefExample tokenize_preference(const PrefRecord& r, bool kto, const TextEncoder& enc,
                                const ChatTemplate* chat = nullptr);

}  // namespace qlft::data
