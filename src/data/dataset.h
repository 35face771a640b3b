// The dataset pipeline: files -> records -> rendered, masked token documents -> train/eval split
// -> packed rows -> batches. Settings come from the data.* keys (DataSpec, config/run_spec.h).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/batches.h"
#include "data/chat_template.h"
#include "data/packing.h"
#include "data/records.h"
#include "data/text_encoder.h"

namespace qlft::data {

// The data.* settings (config/run_spec.h).
using DataOptions = DataSpec;

struct LengthBucket {
  uint64_t lo, hi;  // document lengths in tokens, [lo, hi)
  uint64_t count;
};

struct DataStats {
  std::string format;           // text | alpaca | chat (as read or detected)
  std::string chat_template;    // the template used for alpaca/chat records
  std::string template_source;  // why that template
  uint64_t records = 0;         // records read (good and bad)
  uint64_t records_used = 0;    // documents that made it into the training or eval set
  uint64_t records_dropped = 0;
  std::map<std::string, uint64_t> dropped_by_reason;
  std::vector<std::string> drop_examples;
  uint64_t tokens = 0;          // tokens of the used documents
  uint64_t trained_tokens = 0;  // of those, loss targets (after masking)
  uint64_t min_tokens = 0, max_tokens = 0;
  double mean_tokens = 0;
  std::vector<LengthBucket> length_histogram;  // power-of-two buckets, empty ones left out
  uint64_t split_docs = 0, truncated_tokens = 0, untrained_pieces = 0;
  uint64_t train_docs = 0, eval_docs = 0;
  uint64_t train_rows = 0, eval_rows = 0;
  int seq_len = 0;
  double train_fill = 0, eval_fill = 0;  // fraction of token slots holding data
};

// One record as token ids plus per-token "is a loss target" flags; throws QLFT_ERR_FORMAT
// (without location) when the record does not fit the template. Alpaca/chat records are rendered
// to segments and the whole text is tokenized at once (the ids inference and Hugging Face see);
// a token is trained when its bytes overlap a trained segment. When the encoder cannot give
// token offsets, or a special-token spelling sits inside user/assistant content, the segments
// are tokenized one by one instead (content then never becomes special tokens).
void tokenize_record(const Record& r, const ChatTemplate& t, TrainOn train_on,
                     const TextEncoder& enc, std::vector<int32_t>& ids,
                     std::vector<uint8_t>& trained);

// The ids a model reads before answering `instruction` as a chat: the alpaca record
// {instruction, output ""} tokenized as training tokenizes it, up to its first trained token
// (the template's user turn and the assistant's header; apply_chat_template with
// add_generation_prompt=True).
std::vector<int32_t> generation_prompt(const std::string& instruction, const ChatTemplate& t,
                                       const TextEncoder& enc);

// The template for alpaca/chat records: the named one, or the one recognized in the model's
// chat template, else alpaca (it needs no special tokens). *source says which.
ChatTemplate resolve_template(TemplateKind requested, const TextEncoder& enc, std::string* source);

class Dataset {
 public:
  static Dataset build(const DataOptions& opt, const TextEncoder& enc);

  const PackedSet& train() const { return train_; }
  const PackedSet& eval() const { return eval_; }
  const DataStats& stats() const { return stats_; }
  const DataOptions& options() const { return opt_; }
  const TokenStore& store() const { return *store_; }

  BatchIterator train_batches(int micro_batch) const {
    return BatchIterator(train_, micro_batch, opt_.epochs, opt_.seed, true, pad_id_);
  }
  BatchIterator eval_batches(int micro_batch) const {
    return BatchIterator(eval_, micro_batch, 1, opt_.seed, false, pad_id_);
  }

 private:
  DataOptions opt_;
  std::shared_ptr<TokenStore> store_;
  PackedSet train_, eval_;
  DataStats stats_;
  int32_t pad_id_ = 0;
};

// Statistics without keeping the batches (what `qlft-finetune data-stats` reports).
DataStats compute_data_stats(const DataOptions& opt, const TextEncoder& enc);

}  // namespace qlft::data
