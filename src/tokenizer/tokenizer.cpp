// Encoding and decoding; the loaders (tokenizer_gguf.cpp, tokenizer_hf.cpp) fill the vocabulary
// and options and call finalize().
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/regex_split.h"
#include "tokenizer/utf8.h"

namespace qlft {

namespace {

// Scratch buffers reused across calls on one thread, so long texts do not allocate per word.
struct BpeEntry {
  int32_t rank, left, right, lid, rid, merged;
};
struct SpmEntry {
  float score;
  int32_t left, right, size, merged;
};
struct Scratch {
  std::vector<int32_t> ids, prev, next;
  std::vector<uint32_t> start, len;
  std::vector<BpeEntry> bpe_heap;
  std::vector<SpmEntry> spm_heap;
  std::string norm;

  // The n symbols being merged as a doubly linked list (-1 ends it both ways): a merge unlinks
  // the right symbol in O(1).
  void link(int32_t n) {
    prev.resize(n);
    next.resize(n);
    for (int32_t i = 0; i < n; ++i) {
      prev[i] = i - 1;
      next[i] = i + 1 < n ? i + 1 : -1;
    }
  }
};
thread_local Scratch t_scratch;

// Per-thread cache of BPE results for short pre-tokenized words (natural text repeats its words;
// Hugging Face's BPE keeps a similar cache). Bounded: cleared when full, and when a different
// tokenizer uses this thread.
struct WordCache {
  static constexpr size_t kMaxWords = 1 << 16;
  static constexpr size_t kMaxWordBytes = 48;
  uint64_t owner = 0;
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>> index;  // -> arena span
  std::vector<int32_t> arena;
  std::string key;
};
thread_local WordCache t_cache;
std::atomic<uint64_t> g_serial{1};

// Min-heap order for BPE (lowest rank, then leftmost) and max-heap order for SPM (highest score,
// then leftmost): std heaps put the "largest" element first, so these say "a comes after b".
struct BpeAfter {
  bool operator()(const BpeEntry& a, const BpeEntry& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};
struct SpmAfter {
  bool operator()(const SpmEntry& a, const SpmEntry& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};
}  // namespace

Tokenizer::Tokenizer() : serial_(g_serial.fetch_add(1)) {
  std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
}
Tokenizer::~Tokenizer() = default;

void Tokenizer::finalize() {
  // The loaders' tokens move into the compact tables, one string at a time.
  const int32_t n = static_cast<int32_t>(tokens_.size());
  texts_.clear();
  types_.assign(n, 0);
  scores_.assign(algo_ == Algo::SpmScores ? n : 0, 0.f);
  for (int32_t i = 0; i < n; ++i) {
    Token& t = tokens_[i];
    QLFT_CHECK_FORMAT(texts_.push(t.text),
                      "tokenizer: the vocabulary's texts pass 4 GiB at token %d", i);
    types_[i] = static_cast<uint8_t>(t.type);
    if (!scores_.empty()) scores_[i] = t.score;
    std::string().swap(t.text);
  }
  std::vector<Token>().swap(tokens_);
  texts_.shrink_to_fit();
  text_to_id_.clear();
  for (int32_t i = 0; i < n; ++i) {
    if (type_of(i) == TokenType::Unused && texts_.at(i).empty()) continue;  // a hole
    // A repeated spelling resolves to its last id (llama.cpp).
    text_to_id_.insert(texts_, i, i, /*replace=*/true);
  }
  for (int32_t* id : {&bos_, &eos_, &pad_, &unk_})
    if (*id < 0 || *id >= n) *id = -1;

  // Token for each byte: the byte-level alphabet, or <0xNN> (then a one-byte token) otherwise.
  for (int b = 0; b < 256; ++b) {
    byte_ids_[b] = -1;
    std::string key;
    if (byte_level_) {
      tok::utf8_append(key, tok::byte_to_cp(static_cast<uint8_t>(b)));
    } else {
      char buf[8];
      snprintf(buf, sizeof(buf), "<0x%02X>", b);
      key = buf;
    }
    int32_t id = id_of(key);
    if (id < 0 && !byte_level_ && algo_ == Algo::SpmScores)
      id = id_of(std::string(1, static_cast<char>(b)));
    byte_ids_[b] = id;
  }

  pairs_ = tok::PairMap();
  if (algo_ == Algo::Bpe) {
    for (size_t r = 0; r < merges_.size(); ++r) {
      const auto& [a, b] = merges_[r];
      int32_t ia = id_of(a), ib = id_of(b), im = id_of(a + b);
      // A merge whose parts or result are not tokens can never apply (Hugging Face rejects such
      // files; llama.cpp would produce an unknown symbol): skip it.
      if (ia < 0 || ib < 0 || im < 0) continue;
      pairs_.insert(ia, ib, {static_cast<int32_t>(r), im});
    }
  } else {
    // Every way to cut a token into two tokens is a merge candidate; SPM picks among them by the
    // merged token's score. Symbols not in the vocabulary fall back to a text lookup.
    text_to_id_.for_each([&](int32_t key, int32_t id) {
      std::string_view text = texts_.at(key);
      for (size_t k = 1; k < text.size(); ++k) {
        int32_t ia = id_of(text.substr(0, k));
        if (ia < 0) continue;
        int32_t ib = id_of(text.substr(k));
        if (ib < 0) continue;
        pairs_.insert(ia, ib, {0, id});
      }
    });
  }

  // Isolated characters: ASCII characters that have a token (or byte token) of their own, appear
  // in no longer token, and (BPE) whose byte token takes part in no merge.
  has_isolated_ = false;
  std::fill(std::begin(isolated_), std::end(isolated_), false);
  if (!byte_level_) {
    bool ok[128];
    std::fill(std::begin(ok), std::end(ok), true);
    text_to_id_.for_each([&](int32_t key, int32_t) {
      std::string_view text = texts_.at(key);
      if (text.size() > 1)
        for (char ch : text)
          if (static_cast<uint8_t>(ch) < 128) ok[static_cast<uint8_t>(ch)] = false;
    });
    if (algo_ == Algo::Bpe)
      for (const auto& [a, b] : merges_)
        for (const std::string* part : {&a, &b})
          if (int v = tok::parse_byte_token(*part); v >= 0 && v < 128) ok[v] = false;
    for (int ch = 0; ch < 128; ++ch) {
      bool has_token = byte_ids_[ch] >= 0 || id_of(std::string(1, static_cast<char>(ch))) >= 0;
      isolated_[ch] = ok[ch] && has_token;
      has_isolated_ = has_isolated_ || isolated_[ch];
    }
  }

  // The merge texts served only to build pairs_ (3 MiB of strings for SmolLM2's 49k merges).
  std::vector<std::pair<std::string, std::string>>().swap(merges_);

  pieces_.clear();
  for (int32_t i = 0; i < n; ++i)
    QLFT_CHECK_FORMAT(pieces_.push(piece_of(i)),
                      "tokenizer: the vocabulary's pieces pass 4 GiB at token %d", i);
  pieces_.shrink_to_fit();
  raw_to_id_.clear();
  if (byte_level_ && ignore_merges_) {
    for (int32_t i = 0; i < n; ++i) {
      int32_t id = type_of(i) == TokenType::Normal ? id_of(texts_.at(i)) : -1;
      if (id >= 0) raw_to_id_.insert(pieces_, i, id, /*replace=*/false);
    }
  }

  specials_.clear();
  for (auto& v : special_first_) v.clear();
  for (int32_t i = 0; i < n; ++i) {
    std::string_view text = texts_.at(i);
    TokenType type = type_of(i);
    if (text.empty()) continue;
    if (type == TokenType::Control || type == TokenType::Unknown)
      specials_.push_back({std::string(text), i, false});
    else if (type == TokenType::UserDefined)
      specials_.push_back({std::string(text), i, true});
  }
  std::stable_sort(specials_.begin(), specials_.end(), [](const Special& a, const Special& b) {
    return a.text.size() > b.text.size();
  });
  for (size_t k = 0; k < specials_.size(); ++k)
    special_first_[static_cast<uint8_t>(specials_[k].text[0])].push_back(static_cast<uint32_t>(k));
}

std::string Tokenizer::piece_of(int32_t id) const {
  const std::string_view text = texts_.at(id);
  switch (type_of(id)) {
    case TokenType::Byte: {
      int b = tok::parse_byte_token(text);
      if (b >= 0) return std::string(1, static_cast<char>(b));
      break;
    }
    case TokenType::Control:
    case TokenType::Unknown:
    case TokenType::UserDefined:
      return std::string(text);
    default:
      break;
  }
  if (byte_level_) {
    std::string out;
    for (size_t i = 0; i < text.size();) {
      size_t at = i;
      uint32_t cp = tok::utf8_next(text, i);
      int b = tok::cp_to_byte(cp);
      if (b >= 0)
        out.push_back(static_cast<char>(b));
      else
        out.append(text.substr(at, i - at));  // not in the byte alphabet: keep as written
    }
    return out;
  }
  if (decode_space_.empty()) return std::string(text);
  std::string out;
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, decode_space_.size(), decode_space_) == 0) {
      out.push_back(' ');
      i += decode_space_.size();
    } else {
      out.push_back(text[i++]);
    }
  }
  return out;
}

// ---- encoding ----

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos, bool add_eos,
                                       bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && bos_ >= 0) out.push_back(bos_);
  encode_append(text, parse_special, out);
  if (add_eos && eos_ >= 0) out.push_back(eos_);
  return out;
}

void Tokenizer::encode_append(std::string_view text, bool parse_special, std::vector<int32_t>& out,
                              bool continuation) const {
  // Cut the text at special tokens (leftmost, longest first); encode the pieces between.
  size_t start = 0, i = 0;
  while (i < text.size()) {
    const auto& cands = special_first_[static_cast<uint8_t>(text[i])];
    const Special* hit = nullptr;
    for (uint32_t k : cands) {
      const Special& s = specials_[k];
      if (!s.always && !parse_special) continue;
      if (s.text.size() <= text.size() - i &&
          std::memcmp(s.text.data(), text.data() + i, s.text.size()) == 0) {
        hit = &s;
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    if (i > start)
      encode_fragment(text.substr(start, i - start), start == 0 && !continuation,
                      start == 0 && continuation, out);
    out.push_back(hit->id);
    i += hit->text.size();
    start = i;
  }
  if (start < text.size())
    encode_fragment(text.substr(start), start == 0 && !continuation, start == 0 && continuation,
                    out);
}

void Tokenizer::encode_fragment(std::string_view text, bool at_start, bool no_prefix,
                                std::vector<int32_t>& out) const {
  // Normalizer: prefix (llama.cpp's " " / HF Prepend("▁") / ByteLevel add_prefix_space), then
  // spaces -> "▁" for SentencePiece vocabularies.
  std::string_view s = text;
  std::string& norm = t_scratch.norm;
  const bool blp = byte_level_prefix_space_ && text[0] != ' ' && !no_prefix;
  const bool prepend = prefix_ == Prefix::Always && !no_prefix;
  if (prepend || blp || !space_char_.empty()) {
    norm.clear();
    if (prepend) norm = prefix_text_;
    if (blp) norm.push_back(' ');
    if (space_char_.empty()) {
      norm.append(text);
    } else {
      size_t from = 0;
      for (size_t i = 0; i < norm.size();) {  // the prefix may itself be a space
        if (norm[i] == ' ') {
          norm.replace(i, 1, space_char_);
          i += space_char_.size();
        } else {
          ++i;
        }
      }
      for (size_t i = 0; i < text.size(); ++i) {
        if (text[i] == ' ') {
          norm.append(text.data() + from, i - from);
          norm.append(space_char_);
          from = i + 1;
        }
      }
      norm.append(text.data() + from, text.size() - from);
    }
    s = norm;
  }
  pre_tokenize(0, s, at_start, out);
}

void Tokenizer::pre_tokenize(size_t step, std::string_view piece, bool at_start,
                             std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (step == pre_.size()) {
    encode_word(piece, out);
    return;
  }
  const PreStep& p = pre_[step];
  if (!p.metaspace) {
    p.regex->split(piece, [&](std::string_view sub) {
      pre_tokenize(step + 1, sub, at_start && sub.data() == piece.data(), out);
    });
    return;
  }
  // Metaspace: spaces become the replacement, an optional prefix, then an optional split before
  // every replacement character (each word keeps its leading "▁").
  const std::string& r = meta_repl_;
  std::string m;
  m.reserve(piece.size() + r.size());
  for (char c : piece) {
    if (c == ' ')
      m.append(r);
    else
      m.push_back(c);
  }
  bool starts = m.compare(0, r.size(), r) == 0;
  if (!starts && (prefix_ == Prefix::MetaAlways || (prefix_ == Prefix::MetaFirst && at_start)))
    m.insert(0, r);
  if (!metaspace_split_ || r.empty()) {
    pre_tokenize(step + 1, m, at_start, out);
    return;
  }
  size_t begin = 0;
  for (size_t pos = m.find(r, r.size()); pos != std::string::npos;
       pos = m.find(r, pos + r.size())) {
    if (pos == begin) continue;
    pre_tokenize(step + 1, std::string_view(m).substr(begin, pos - begin), at_start && begin == 0,
                 out);
    begin = pos;
  }
  pre_tokenize(step + 1, std::string_view(m).substr(begin), at_start && begin == 0, out);
}

void Tokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (!has_isolated_) {
    encode_cached(word, out);
    return;
  }
  // No token longer than one character contains an isolated character (finalize() checks), so
  // no merge can cross one: encoding the pieces around it separately gives the same ids, and
  // keeps the merge queue small on long texts (SentencePiece text is one word).
  size_t start = 0;
  for (size_t i = 0; i < word.size(); ++i) {
    uint8_t c = static_cast<uint8_t>(word[i]);
    if (c < 128 && isolated_[c]) {
      if (i > start) encode_cached(word.substr(start, i - start), out);
      encode_cached(word.substr(i, 1), out);
      start = i + 1;
    }
  }
  if (start < word.size()) encode_cached(word.substr(start), out);
}

void Tokenizer::push_bytes(std::string_view s, std::vector<int32_t>& out) const {
  // A symbol with no token: its byte tokens, or (when the vocabulary lacks one of them) a single
  // unknown token for the whole symbol; nothing if there is no unknown token either.
  bool all = true;
  for (char c : s) all = all && byte_ids_[static_cast<uint8_t>(c)] >= 0;
  if (all) {
    for (char c : s) out.push_back(byte_ids_[static_cast<uint8_t>(c)]);
  } else if (unk_ >= 0 && (!fuse_unk_ || out.empty() || out.back() != unk_)) {
    out.push_back(unk_);
  }
}

void Tokenizer::encode_cached(std::string_view word, std::vector<int32_t>& out) const {
  WordCache& c = t_cache;
  const bool cacheable = word.size() <= WordCache::kMaxWordBytes;
  if (cacheable) {
    if (c.owner != serial_ || c.index.size() >= WordCache::kMaxWords) {
      c.index.clear();
      c.arena.clear();
      c.owner = serial_;
    }
    c.key.assign(word);
    auto it = c.index.find(c.key);
    if (it != c.index.end()) {
      out.insert(out.end(), c.arena.begin() + it->second.first,
                 c.arena.begin() + it->second.first + it->second.second);
      return;
    }
  }
  const size_t before = out.size();
  if (algo_ == Algo::SpmScores)
    spm_encode(word, out);
  else
    bpe_encode(word, out);
  if (cacheable) {
    c.index.emplace(c.key, std::make_pair(static_cast<uint32_t>(c.arena.size()),
                                          static_cast<uint32_t>(out.size() - before)));
    c.arena.insert(c.arena.end(), out.begin() + before, out.end());
  }
}

void Tokenizer::bpe_encode(std::string_view word, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    int32_t id = byte_level_ ? raw_to_id_.find(pieces_, word) : id_of(word);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  std::vector<int32_t>& ids = t_scratch.ids;
  ids.clear();
  if (byte_level_) {
    for (char c : word) {
      int32_t id = byte_ids_[static_cast<uint8_t>(c)];
      if (id >= 0)
        ids.push_back(id);
      else if (unk_ >= 0 && (!fuse_unk_ || ids.empty() || ids.back() != unk_))
        ids.push_back(unk_);
    }
  } else {
    // Characters in the vocabulary, else their <0xNN> tokens (all of them or none, as Hugging
    // Face does), else the unknown token.
    for (size_t i = 0; i < word.size();) {
      size_t len = tok::utf8_char_len(word.data() + i, word.size() - i);
      std::string_view ch = word.substr(i, len);
      i += len;
      if (int32_t id = id_of(ch); id >= 0) {
        ids.push_back(id);
        continue;
      }
      if (byte_fallback_) {
        bool all = true;
        for (char c : ch) all = all && byte_ids_[static_cast<uint8_t>(c)] >= 0;
        if (all) {
          for (char c : ch) ids.push_back(byte_ids_[static_cast<uint8_t>(c)]);
          continue;
        }
      }
      if (unk_ >= 0 && (!fuse_unk_ || ids.empty() || ids.back() != unk_)) ids.push_back(unk_);
    }
  }
  bpe_merge(ids, out);
}

void Tokenizer::bpe_merge(std::vector<int32_t>& ids, std::vector<int32_t>& out) const {
  const int32_t n = static_cast<int32_t>(ids.size());
  if (n <= 1) {
    if (n == 1) out.push_back(ids[0]);
    return;
  }
  Scratch& s = t_scratch;
  s.link(n);
  auto& heap = s.bpe_heap;
  heap.clear();
  auto add = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const tok::PairValue* v = pairs_.find(ids[l], ids[r]);
    if (!v) return;
    heap.push_back({v->rank, l, r, ids[l], ids[r], v->merged});
    std::push_heap(heap.begin(), heap.end(), BpeAfter{});
  };
  for (int32_t i = 0; i + 1 < n; ++i) {
    const tok::PairValue* v = pairs_.find(ids[i], ids[i + 1]);
    if (v) heap.push_back({v->rank, i, i + 1, ids[i], ids[i + 1], v->merged});
  }
  std::make_heap(heap.begin(), heap.end(), BpeAfter{});
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), BpeAfter{});
    BpeEntry e = heap.back();
    heap.pop_back();
    // Stale entries: a side was merged away or changed since the entry was queued.
    if (ids[e.left] != e.lid || s.next[e.left] != e.right || ids[e.right] != e.rid) continue;
    ids[e.left] = e.merged;
    ids[e.right] = -1;
    int32_t nn = s.next[e.right];
    s.next[e.left] = nn;
    if (nn >= 0) s.prev[nn] = e.left;
    add(s.prev[e.left], e.left);
    add(e.left, nn);
  }
  for (int32_t i = 0; i >= 0; i = s.next[i]) out.push_back(ids[i]);
}

void Tokenizer::spm_encode(std::string_view text, std::vector<int32_t>& out) const {
  // llama.cpp's llm_tokenizer_spm: start from UTF-8 characters (an invalid byte is a symbol of
  // its own; llama.cpp would let it swallow the following bytes), repeatedly merge the adjacent
  // pair whose concatenation is the highest-scoring token (leftmost on ties), then emit each
  // symbol's token or, failing that, its bytes.
  Scratch& s = t_scratch;
  s.ids.clear();
  s.start.clear();
  s.len.clear();
  for (size_t i = 0; i < text.size();) {
    size_t len = tok::utf8_char_len(text.data() + i, text.size() - i);
    s.ids.push_back(id_of(text.substr(i, len)));
    s.start.push_back(static_cast<uint32_t>(i));
    s.len.push_back(static_cast<uint32_t>(len));
    i += len;
  }
  const int32_t n = static_cast<int32_t>(s.ids.size());
  if (n == 0) return;
  s.link(n);
  auto& heap = s.spm_heap;
  heap.clear();
  auto lookup = [&](int32_t l, int32_t r) -> int32_t {
    if (s.ids[l] >= 0 && s.ids[r] >= 0) {
      const tok::PairValue* v = pairs_.find(s.ids[l], s.ids[r]);
      return v ? v->merged : -1;
    }
    return id_of(text.substr(s.start[l], s.len[l] + s.len[r]));
  };
  auto add = [&](int32_t l, int32_t r, bool keep_heap) {
    if (l < 0 || r < 0) return;
    int32_t m = lookup(l, r);
    if (m < 0) return;
    heap.push_back({scores_[m], l, r, static_cast<int32_t>(s.len[l] + s.len[r]), m});
    if (keep_heap) std::push_heap(heap.begin(), heap.end(), SpmAfter{});
  };
  for (int32_t i = 0; i + 1 < n; ++i) add(i, i + 1, false);
  std::make_heap(heap.begin(), heap.end(), SpmAfter{});
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), SpmAfter{});
    SpmEntry e = heap.back();
    heap.pop_back();
    if (s.len[e.left] == 0 || s.len[e.right] == 0 ||
        s.len[e.left] + s.len[e.right] != static_cast<uint32_t>(e.size))
      continue;
    s.len[e.left] += s.len[e.right];
    s.len[e.right] = 0;
    s.ids[e.left] = e.merged;
    int32_t nn = s.next[e.right];
    s.next[e.left] = nn;
    if (nn >= 0) s.prev[nn] = e.left;
    add(s.prev[e.left], e.left, true);
    add(e.left, nn, true);
  }
  for (int32_t i = 0; i >= 0; i = s.next[i]) {
    if (s.ids[i] >= 0)
      out.push_back(s.ids[i]);
    else
      push_bytes(text.substr(s.start[i], s.len[i]), out);
  }
}

// ---- decoding and lookups ----

std::string Tokenizer::decode(const int32_t* ids, size_t n, bool skip_special) const {
  std::string out;
  bool strip = strip_leading_space_;
  for (size_t k = 0; k < n; ++k) {
    int32_t id = ids[k];
    QLFT_CHECK_ARG(id >= 0 && id < vocab_size(),
                   "decode: token id %d at position %zu is outside "
                   "the vocabulary (size %d)",
                   id, k, vocab_size());
    if (skip_special && is_special(id)) continue;
    std::string_view p = pieces_.at(id);
    if (strip && !p.empty() && p[0] == ' ') p.remove_prefix(1);
    out.append(p);
    strip = false;
  }
  return out;
}

std::string Tokenizer::token_to_piece(int32_t id, bool special) const {
  QLFT_CHECK_ARG(id >= 0 && id < vocab_size(), "token id %d is outside the vocabulary (size %d)",
                 id, vocab_size());
  if (!special && is_special(id)) return std::string();
  return std::string(pieces_.at(id));
}

std::string_view Tokenizer::token_text(int32_t id) const {
  QLFT_CHECK_ARG(id >= 0 && id < vocab_size(), "token id %d is outside the vocabulary (size %d)",
                 id, vocab_size());
  return texts_.at(id);
}

TokenType Tokenizer::token_type(int32_t id) const {
  QLFT_CHECK_ARG(id >= 0 && id < vocab_size(), "token id %d is outside the vocabulary (size %d)",
                 id, vocab_size());
  return type_of(id);
}

bool Tokenizer::is_special(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return false;
  TokenType t = type_of(id);
  return t == TokenType::Control || t == TokenType::Unknown;
}

int32_t Tokenizer::token_id(std::string_view text) const {
  return id_of(text);
}

}  // namespace qlft
