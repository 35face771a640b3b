// The reference log-probabilities of a preference set computed once (TRL's
// precompute_ref_log_probs, pref.precompute_ref) and kept in a file beside the data, so that a
// resumed run, a second epoch or a second run on the same model and data does not run the
// reference pass again.
//
// A row's reference log-probability is the frozen base's (adapter off) sum over its answer
// tokens; it depends on the model, how its weights are stored, the backend and precision, and
// the row's tokens, which the cache's key covers. Paired objectives (DPO, IPO) keep the chosen
// and the rejected row's per example; KTO its row's (its KL rows pair an example with its
// neighbour in the micro-batch, so they are measured live).
//
// File: "<data.path>.qlft-ref-<key as 16 hex digits>.bin": the magic "QLFTREF1", the key (u64),
// the number of values (u64), then the values (f64, little-endian), written atomically. A file
// that does not match is ignored and made again; an unwritable place keeps the values in memory
// (logged).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/llama.h"
#include "train/preference.h"

namespace qlft {

class PrefRefCache {
 public:
  // model: what identifies the model as stored (path, file size and time, quant.*, backend,
  // precision), hashed with every example's tokens and the objective into the key.
  static uint64_t key_of(const PrefSet& set, Objective o, const std::string& model);
  static std::string path_of(const std::string& data_path, uint64_t key);

  // The cache at path when its key and size match; else every example's values computed with
  // runner (adapter off) in micro-batches of `batch` examples in the set's order, and written to
  // path. *loaded says which.
  static PrefRefCache make(LlamaRunner& runner, const PrefSet& set, Objective o, int batch,
                           const std::string& path, uint64_t key, bool* loaded);

  // b.ref for a batch that make_pref_batch made of ex (pointers into set.examples), in its row
  // order: every chosen row, then every rejected one (KTO: each example's row).
  void fill(const std::vector<const data::PrefExample*>& ex, const PrefSet& set,
            PrefBatch& b) const;
  size_t size() const { return values_.size(); }

 private:
  std::vector<double> values_;  // per example: chosen, rejected (paired) or its row (KTO)
  int per_example_ = 2;
};

}  // namespace qlft
