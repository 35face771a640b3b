// Packed rows through the model: attention never crosses a document boundary. Each document's
// loss inside a packed row of the data pipeline (identity.json, stories260K's tokenizer and
// model) equals its loss when it runs alone; without the doc ids / restarted positions the
// later documents' losses change, so the comparison can fail.
#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>

#include "backend/backend.h"
#include "data/dataset.h"
#include "data/tokenizer_encoder.h"
#include "model/llama.h"
#include "model/model.h"
#include "support/test_support.h"
#include "tokenizer/tokenizer.h"

using namespace qlft;

TEST(DataModel, PackedDocumentsHaveTheLossTheyHaveAlone) {
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  QLFT_NEED_SHARED(data_path, "data/identity.json");
  omp_set_num_threads(1);  // a 64-wide model: threads only add waiting on a busy machine
  MemoryTracker tr;
  LoadOptions lo;
  lo.quant_type = qlft::QuantType::Keep;
  auto model = load_model(&tr, model_path, lo);
  auto be = make_cpu_backend(&tr);
  LlamaRunner run(*model, *be, nullptr);
  auto tok = Tokenizer::from_gguf_file(model_path);
  data::TokenizerEncoder enc(*tok);
  data::DataOptions o;
  o.path = data_path;
  o.seq_len = 512;
  data::Dataset ds = data::Dataset::build(o, enc);
  auto it = ds.train_batches(1);
  data::Batch b;
  int checked = 0, changed_without_docs = 0;
  for (int row = 0; row < 4 && it.next(b); ++row) {
    const int S = b.seq_len;
    int32_t n_docs = 0;
    for (int k = 0; k < S; ++k)
      if (b.targets[k] != data::kIgnoreIndex) n_docs = std::max(n_docs, b.doc_ids[k] + 1);
    for (int32_t d = 0; d < n_docs; ++d) {
      // The packed row with only document d's targets counted.
      std::vector<int32_t> tgt(b.targets);
      int first = -1, len = 0;
      for (int k = 0; k < S; ++k) {
        if (b.doc_ids[k] != d) {
          tgt[k] = kIgnoreIndex;
        } else {
          if (first < 0) first = k;
          ++len;
        }
      }
      TokenBatch packed;
      packed.seq = S;
      packed.tokens = b.tokens.data();
      packed.targets = tgt.data();
      packed.positions = b.positions.data();
      packed.doc_ids = b.doc_ids.data();
      LossResult lp = run.eval_loss(packed);

      TokenBatch alone;
      alone.seq = len;
      alone.tokens = b.tokens.data() + first;
      alone.targets = b.targets.data() + first;
      LossResult la = run.eval_loss(alone);
      ASSERT_EQ(lp.count, la.count);
      ASSERT_GT(la.count, 0);
      EXPECT_NEAR(lp.loss_sum, la.loss_sum, 1e-4 * std::fabs(la.loss_sum))
          << "row " << row << " doc " << d;
      ++checked;

      // Control: plain causal attention over the packed row with running positions.
      TokenBatch leaky = packed;
      leaky.positions = nullptr;
      leaky.doc_ids = nullptr;
      LossResult ll = run.eval_loss(leaky);
      if (first > 0 && std::fabs(ll.loss_sum - la.loss_sum) > 1e-3 * std::fabs(la.loss_sum))
        ++changed_without_docs;
    }
  }
  EXPECT_GE(checked, 6);
  EXPECT_GT(changed_without_docs, 0);
}
