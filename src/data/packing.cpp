#include "data/packing.h"

#include <algorithm>
#include <set>

#include "core/error.h"

namespace qlft::data {

void TokenStore::add(const std::vector<int32_t>& doc_ids, const std::vector<uint8_t>& doc_trained) {
  ids.insert(ids.end(), doc_ids.begin(), doc_ids.end());
  trained.insert(trained.end(), doc_trained.begin(), doc_trained.end());
  offsets.push_back(ids.size());
}

uint64_t SplitMix64::next() {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

namespace {

uint64_t fnv(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

PackedSet::PackedSet(std::shared_ptr<const TokenStore> store, const std::vector<uint32_t>& docs,
                     const PackOptions& opt, PackCounts* counts)
    : store_(std::move(store)), seq_len_(opt.seq_len) {
  QLFT_CHECK_ARG(opt.seq_len >= 1, "data.seq_len must be positive, got %d", opt.seq_len);
  const TokenStore& st = *store_;
  PackCounts local;
  PackCounts& cnt = counts ? *counts : local;
  const uint32_t S = static_cast<uint32_t>(opt.seq_len);

  // Cut documents into pieces of at most S slots; drop pieces with nothing to learn.
  std::vector<Piece> pieces;
  for (uint32_t d : docs) {
    QLFT_CHECK_ARG(d < st.docs(), "document %u out of range", d);
    uint64_t n = st.doc_len(d);
    if (n < 2) continue;
    uint64_t slots = n - 1;
    if (slots > S) {
      if (opt.overflow == Overflow::Truncate) {
        cnt.truncated_tokens += slots - S;
        slots = S;
      } else {
        ++cnt.split_docs;
      }
    }
    const uint8_t* tr = st.trained.data() + st.offsets[d];
    for (uint64_t b = 0; b < slots; b += S) {
      uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(S, slots - b));
      bool any = false;
      for (uint64_t t = b + 1; t <= b + len && !any; ++t) any = tr[t] != 0;
      if (!any) {
        ++cnt.untrained_pieces;
        continue;
      }
      pieces.push_back({d, static_cast<uint32_t>(b), len});
    }
  }

  std::vector<std::vector<Piece>> rows;
  if (!opt.pack) {
    for (const Piece& p : pieces) rows.push_back({p});
  } else {
    // Best-fit decreasing: longest piece first into the fullest row it still fits. Equal lengths
    // keep the (seeded) document order, so the seed changes which pieces share a row.
    std::stable_sort(pieces.begin(), pieces.end(),
                     [](const Piece& a, const Piece& b) { return a.len > b.len; });
    std::set<std::pair<uint32_t, uint64_t>> open;  // (free slots, row)
    for (const Piece& p : pieces) {
      auto it = open.lower_bound({p.len, 0});
      uint64_t r;
      uint32_t free_slots;
      if (it == open.end()) {
        r = rows.size();
        rows.emplace_back();
        free_slots = S;
      } else {
        r = it->second;
        free_slots = it->first;
        open.erase(it);
      }
      rows[r].push_back(p);
      free_slots -= p.len;
      if (free_slots > 0) open.insert({free_slots, r});
    }
  }

  uint64_t h = 0xcbf29ce484222325ull;
  h = fnv(h, S);
  for (const auto& row : rows) {
    for (const Piece& p : row) {
      pieces_.push_back(p);
      slots_used_ += p.len;
      const uint64_t off = st.offsets[p.doc] + p.begin;
      for (uint32_t t = 0; t < p.len; ++t) {
        trained_slots_ += st.trained[off + t + 1];
        h = fnv(h, (uint64_t(uint32_t(st.ids[off + t])) << 1) | st.trained[off + t + 1]);
      }
      h = fnv(h, 0xfffffffffull);
    }
    row_offsets_.push_back(pieces_.size());
    h = fnv(h, 0xeeeeeeeeeull);
  }
  fingerprint_ = h;
}

const Piece* PackedSet::row_pieces(uint64_t r, size_t* n) const {
  QLFT_CHECK_ARG(r < rows(), "row %llu out of range (%llu rows)", (unsigned long long)r,
                 (unsigned long long)rows());
  *n = row_offsets_[r + 1] - row_offsets_[r];
  return pieces_.data() + row_offsets_[r];
}

void PackedSet::fill_row(uint64_t r, int32_t pad_id, int32_t* tokens, int32_t* targets,
                         int32_t* positions, int32_t* doc_ids) const {
  size_t n = 0;
  const Piece* ps = row_pieces(r, &n);
  const TokenStore& st = *store_;
  int32_t k = 0;
  for (size_t j = 0; j < n; ++j) {
    const Piece& p = ps[j];
    const uint64_t off = st.offsets[p.doc] + p.begin;
    for (uint32_t t = 0; t < p.len; ++t, ++k) {
      tokens[k] = st.ids[off + t];
      targets[k] = st.trained[off + t + 1] ? st.ids[off + t + 1] : kIgnoreIndex;
      positions[k] = static_cast<int32_t>(t);
      doc_ids[k] = static_cast<int32_t>(j);
    }
  }
  for (int32_t pk = 0; k < seq_len_; ++k, ++pk) {
    tokens[k] = pad_id;
    targets[k] = kIgnoreIndex;
    positions[k] = pk;
    doc_ids[k] = static_cast<int32_t>(n);  // padding is a block of its own
  }
}

}  // namespace qlft::data
