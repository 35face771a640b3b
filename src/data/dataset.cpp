#include "data/dataset.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/threads.h"

namespace qlft::data {

ChatTemplate resolve_template(TemplateKind requested, const TextEncoder& enc, std::string* source) {
  ChatTemplate t;
  t.bos = enc.bos_text();
  t.eos = enc.eos_text();
  std::string why;
  if (requested != TemplateKind::Auto) {
    t.kind = requested;
    why = "data.template";
    // A named chatml template still takes the model's default system prompt, if it has one.
    if (requested == TemplateKind::ChatML) detect_template(enc.chat_template(), &t.default_system);
  } else {
    std::string jinja = enc.chat_template();
    TemplateKind k = detect_template(jinja, &t.default_system);
    if (k != TemplateKind::Auto) {
      t.kind = k;
      why = "recognized in the model's chat template";
    } else {
      t.kind = TemplateKind::Alpaca;
      why = jinja.empty() ? "default: the model has no chat template"
                          : "default: the model's chat template was not recognized";
    }
  }
  // qlft's own templates (alpaca, none) start with BOS only where the model's tokenizer puts one
  // before a text (add_bos_token); the model templates spell bos_token where their Jinja does.
  if ((t.kind == TemplateKind::Alpaca || t.kind == TemplateKind::None) && !enc.wants_bos())
    t.bos.clear();
  if (source) *source = why;
  return t;
}

std::vector<int32_t> generation_prompt(const std::string& instruction, const ChatTemplate& t,
                                       const TextEncoder& enc) {
  Record r;
  r.format = DataFormat::Alpaca;
  r.instruction = instruction;
  r.where = "the prompt";
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;
  tokenize_record(r, t, TrainOn::Completion, enc, ids, trained);
  // The empty answer's first trained token is the end of the assistant's turn.
  size_t n = 0;
  while (n < ids.size() && !trained[n]) ++n;
  ids.resize(n);
  return ids;
}

void tokenize_record(const Record& r, const ChatTemplate& t, TrainOn train_on,
                     const TextEncoder& enc, std::vector<int32_t>& ids,
                     std::vector<uint8_t>& trained) {
  ids.clear();
  trained.clear();
  if (r.format == DataFormat::Text) {
    // Plain text: every token is a target. BOS where the model's tokenizer adds one
    // (add_bos_token), EOS always: it marks the document's end, so the model learns to stop
    // and packed documents stay apart.
    if (enc.wants_bos() && enc.bos_id() >= 0) ids.push_back(enc.bos_id());
    enc.encode(r.text, false, !ids.empty(), ids);
    if (enc.eos_id() >= 0) ids.push_back(enc.eos_id());
    trained.assign(ids.size(), 1);
    return;
  }
  std::vector<Segment> segs =
      r.format == DataFormat::Alpaca ? render_alpaca(t, r) : render_chat(t, r.messages);
  const bool all = train_on == TrainOn::All;

  // Preferred: tokenize the whole rendered text at once, exactly as inference (and Hugging
  // Face's apply_chat_template + tokenizer) will see it, then mark a token trained when its bytes
  // overlap a trained segment. Used unless the encoder cannot give token offsets or a special
  // token was found inside user/assistant content (content is never read as special tokens).
  std::string text = joined_text(segs);
  std::vector<uint32_t> starts;
  std::vector<uint8_t> special;
  if (enc.encode_offsets(text, ids, starts, special)) {
    // Byte -> segment flags.
    std::vector<uint8_t> byte_trained(text.size() + 1, 0), byte_content(text.size() + 1, 0);
    size_t pos = 0;
    for (const Segment& g : segs) {
      std::fill_n(byte_trained.begin() + static_cast<ptrdiff_t>(pos), g.text.size(),
                  g.trained ? 1 : 0);
      std::fill_n(byte_content.begin() + static_cast<ptrdiff_t>(pos), g.text.size(),
                  g.special ? 0 : 1);
      pos += g.text.size();
    }
    bool ok = true;
    trained.assign(ids.size(), 0);
    for (size_t i = 0; i < ids.size() && ok; ++i) {
      size_t b = starts[i], e = i + 1 < ids.size() ? starts[i + 1] : text.size();
      if (special[i] && byte_content[b]) ok = false;
      bool tr = all;
      for (size_t k = b; k < e && !tr; ++k) tr = byte_trained[k] != 0;
      trained[i] = tr ? 1 : 0;
    }
    if (ok) return;
  }
  // Fallback: segment by segment, so each token belongs to exactly one segment and takes its
  // flag; scaffolding parses special tokens, content does not. Whatever encode_offsets left in
  // ids (also when it returned false) goes.
  ids.clear();
  trained.clear();
  for (const Segment& s : segs) {
    size_t before = ids.size();
    enc.encode(s.text, s.special, before > 0, ids);
    trained.resize(ids.size(), all || s.trained ? 1 : 0);
  }
}

namespace {

void substitute(std::string& s, const std::vector<std::pair<std::string, std::string>>& vars) {
  if (s.find("{{") == std::string::npos) return;
  for (const auto& [k, v] : vars) {
    const std::string pat = "{{" + k + "}}";
    for (size_t p = s.find(pat); p != std::string::npos; p = s.find(pat, p + v.size()))
      s.replace(p, pat.size(), v);
  }
}

void substitute(Record& r, const std::vector<std::pair<std::string, std::string>>& vars) {
  for (std::string* f : {&r.text, &r.system, &r.instruction, &r.input, &r.output})
    substitute(*f, vars);
  for (Message& m : r.messages) substitute(m.content, vars);
}

struct Built {
  std::shared_ptr<TokenStore> store;
  std::vector<uint32_t> train_docs, eval_docs;
  DataStats stats;
};

Built build_docs(const DataOptions& opt, const TextEncoder& enc) {
  QLFT_CHECK_ARG(!opt.path.empty(), "data.path is not set");
  QLFT_CHECK_ARG(opt.seq_len >= 2, "data.seq_len must be at least 2, got %d", opt.seq_len);
  DropLog log;
  DataFormat fmt = DataFormat::Text;
  std::vector<Record> recs = read_records(opt.path, opt, log, &fmt);

  Built out;
  DataStats& st = out.stats;
  st.format = format_name(fmt);
  st.seq_len = opt.seq_len;
  ChatTemplate tmpl;
  if (fmt != DataFormat::Text) {
    tmpl = resolve_template(opt.chat_template, enc, &st.template_source);
    st.chat_template = template_name(tmpl.kind);
  } else {
    st.chat_template = "none";
    st.template_source = "text documents use no template";
  }

  out.store = std::make_shared<TokenStore>();
  TokenStore& store = *out.store;
  // Tokenize in parallel, a chunk of records at a time (the encoders are thread-safe), then keep
  // or drop the results in file order, so errors and the stored order never depend on threads.
  struct Tokenized {
    std::vector<int32_t> ids;
    std::vector<uint8_t> trained;
    std::string error;  // a QLFT_ERR_FORMAT from the template, without location
  };
  constexpr size_t kChunk = 4096;
  std::vector<Tokenized> out_chunk(std::min(kChunk, recs.size()));
  for (size_t c0 = 0; c0 < recs.size(); c0 += kChunk) {
    const size_t n = std::min(kChunk, recs.size() - c0);
    int32_t fail_status = QLFT_OK;
    std::string fail_msg;
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(dynamic, 16)
    for (size_t i = 0; i < n; ++i) {
      Record& r = recs[c0 + i];
      Tokenized& t = out_chunk[i];
      t.error.clear();
      try {
        if (!opt.vars.empty()) substitute(r, opt.vars);
        tokenize_record(r, tmpl, opt.train_on, enc, t.ids, t.trained);
      } catch (const Error& e) {
        if (e.status() == QLFT_ERR_FORMAT) {
          t.error = e.what();
          if (t.error.empty()) t.error = "template error";
        } else {
#pragma omp critical(qlft_data_tokenize)
          if (fail_status == QLFT_OK) fail_status = e.status(), fail_msg = e.what();
        }
      } catch (const std::exception& e) {
#pragma omp critical(qlft_data_tokenize)
        if (fail_status == QLFT_OK) fail_status = QLFT_ERR_INTERNAL, fail_msg = e.what();
      }
    }
    if (fail_status != QLFT_OK) throw Error(fail_status, fail_msg);
    for (size_t i = 0; i < n; ++i) {
      const Record& r = recs[c0 + i];
      Tokenized& t = out_chunk[i];
      if (!t.error.empty()) {
        bad_record(opt, log, "template", r.where, t.error);
        continue;
      }
      if (opt.overflow == Overflow::Reject && t.ids.size() > static_cast<size_t>(opt.seq_len) + 1) {
        bad_record(opt, log, "too_long", r.where,
                   strf("%zu tokens do not fit data.seq_len=%d (data.overflow=reject)",
                        t.ids.size(), opt.seq_len));
        continue;
      }
      if (t.ids.size() < 2) {
        log.add("too_short", r.where + ": fewer than 2 tokens");
        continue;
      }
      if (std::find(t.trained.begin() + 1, t.trained.end(), 1) == t.trained.end()) {
        // A chat without an assistant turn (an alpaca record without output): a bad record.
        bad_record(opt, log, "no_trained_tokens", r.where,
                   "no token to train on (no assistant turn or response)");
        continue;
      }
      store.add(t.ids, t.trained);
    }
  }
  recs.clear();
  recs.shrink_to_fit();

  // Statistics over the documents kept.
  const size_t D = store.docs();
  // Every record read is either kept or in the log exactly once.
  st.records = D + log.count;
  st.records_used = D;
  st.records_dropped = log.count;
  st.dropped_by_reason = log.by_reason;
  st.drop_examples = log.examples;
  st.tokens = store.ids.size();
  st.min_tokens = D ? UINT64_MAX : 0;
  std::map<uint64_t, uint64_t> buckets;
  for (size_t d = 0; d < D; ++d) {
    uint64_t n = store.doc_len(d);
    st.min_tokens = std::min(st.min_tokens, n);
    st.max_tokens = std::max(st.max_tokens, n);
    uint64_t lo = 1;
    while (lo * 2 <= n) lo *= 2;
    ++buckets[lo];
    for (uint64_t i = store.offsets[d] + 1; i < store.offsets[d + 1]; ++i)
      st.trained_tokens += store.trained[i];
  }
  st.mean_tokens = D ? double(st.tokens) / double(D) : 0.0;
  for (const auto& [lo, c] : buckets) st.length_histogram.push_back({lo, lo * 2, c});

  // Train/eval split at the document level, from the seed.
  std::vector<uint32_t> order(D);
  std::iota(order.begin(), order.end(), 0u);
  seeded_shuffle(order, opt.seed ^ 0x5eedda7aull);
  size_t n_eval = 0;
  if (opt.eval_fraction > 0 && D >= 2)
    n_eval = std::clamp<size_t>(static_cast<size_t>(std::llround(opt.eval_fraction * double(D))), 1,
                                D - 1);
  out.eval_docs.assign(order.begin(), order.begin() + static_cast<ptrdiff_t>(n_eval));
  out.train_docs.assign(order.begin() + static_cast<ptrdiff_t>(n_eval), order.end());
  st.train_docs = out.train_docs.size();
  st.eval_docs = out.eval_docs.size();
  if (out.train_docs.empty()) {
    // Why, not only how many: the drops by reason and the first of them with its line.
    std::string why;
    for (const auto& [reason, n] : st.dropped_by_reason)
      why += strf("%s%llu %s", why.empty() ? ": " : ", ", (unsigned long long)n, reason.c_str());
    if (!st.drop_examples.empty()) why += "; first: " + st.drop_examples.front();
    throw_error(QLFT_ERR_FORMAT, "%s: no usable training records (%llu read, %llu dropped%s)",
                opt.path.c_str(), (unsigned long long)st.records,
                (unsigned long long)st.records_dropped, why.c_str());
  }
  return out;
}

PackOptions pack_options(const DataOptions& opt, uint64_t salt) {
  PackOptions p;
  p.seq_len = opt.seq_len;
  p.pack = opt.pack;
  p.overflow = opt.overflow == Overflow::Reject ? Overflow::Split : opt.overflow;
  p.seed = opt.seed + salt;
  return p;
}

}  // namespace

Dataset Dataset::build(const DataOptions& opt, const TextEncoder& enc) {
  Built b = build_docs(opt, enc);
  Dataset ds;
  ds.opt_ = opt;
  ds.store_ = b.store;
  ds.stats_ = std::move(b.stats);
  ds.pad_id_ = enc.pad_id();
  PackCounts counts;
  ds.train_ = PackedSet(ds.store_, b.train_docs, pack_options(opt, 0), &counts);
  ds.eval_ = PackedSet(ds.store_, b.eval_docs, pack_options(opt, 1), &counts);
  ds.stats_.split_docs = counts.split_docs;
  ds.stats_.truncated_tokens = counts.truncated_tokens;
  ds.stats_.untrained_pieces = counts.untrained_pieces;
  ds.stats_.train_rows = ds.train_.rows();
  ds.stats_.eval_rows = ds.eval_.rows();
  ds.stats_.train_fill = ds.train_.fill();
  ds.stats_.eval_fill = ds.eval_.fill();
  if (ds.train_.rows() == 0)
    throw_error(QLFT_ERR_FORMAT, "%s: no training rows (every piece lacks trained tokens)",
                opt.path.c_str());
  return ds;
}

DataStats compute_data_stats(const DataOptions& opt, const TextEncoder& enc) {
  return Dataset::build(opt, enc).stats();
}

}  // namespace qlft::data
