// Loading by weight groups (model.h WeightGroupSource, LoadOptions::deferred): every group loaded
// again from the file holds the bytes load_model made (GGUF f32 kept and NF4, a Hugging Face
// model), and a deferred model (no weights resident; read through its FileUnitStream) trains
// and generates exactly as the resident one, on one process (the ZeRO-3 side is
// tests/dist/zero3_memory.sh and eval_rank0.sh).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "support/settings.h"
#include "backend/backend.h"
#include "config/config.h"
#include "core/error.h"
#include "core/threads.h"
#include "data/dataset.h"
#include "data/tokenizer_encoder.h"
#include "model/file_unit_stream.h"
#include "model/generate.h"
#include "model/model.h"
#include "quant/qweight.h"
#include "support/test_support.h"
#include "tokenizer/tokenizer.h"
#include "train/trainer.h"

using namespace qlft;

namespace {

// Every storage Buffer of group g, in for_each_weight_buffer's order.
std::vector<std::vector<uint8_t>> group_bytes(Model& m, int g) {
  std::vector<std::vector<uint8_t>> out;
  for_each_weight_buffer(m, [&](int bg, Buffer& b) {
    if (bg != g) return;
    const auto* p = b.empty() ? nullptr : b.as<const uint8_t>();
    out.emplace_back(p, p ? p + b.size() : p);
  });
  return out;
}

// path loaded whole and deferred (LoadOptions::deferred) with quant.type = quant.
struct FullAndDeferred {
  std::unique_ptr<Model> full, lazy;
  FullAndDeferred(MemoryTracker& tracker, const std::string& path, const char* quant) {
    LoadOptions lo;
    lo.quant_type = qlft_test::quant_type(quant);
    full = load_model(&tracker, path, lo);
    lo.deferred = true;
    lazy = load_model(&tracker, path, lo);
  }
};

void expect_groups_reload_alike(const std::string& path, const char* quant) {
  SCOPED_TRACE(std::string(path) + " quant.type=" + quant);
  MemoryTracker tracker;
  auto [full, lazy] = FullAndDeferred(tracker, path, quant);
  ASSERT_TRUE(lazy->stream);
  EXPECT_EQ(lazy->weight_bytes(), full->weight_bytes());
  EXPECT_EQ(lazy->quant_summary, full->quant_summary);
  const int G = full->cfg.n_layers + 2;
  for (int g = 0; g < G; ++g)
    for (const auto& b : group_bytes(*lazy, g)) EXPECT_TRUE(b.empty()) << "group " << g;
  auto src = WeightGroupSource::open(&tracker, *lazy);
  for (int g = 0; g < G; ++g) {
    src->load(*lazy, g, /*with_head=*/true);
    EXPECT_EQ(group_bytes(*lazy, g), group_bytes(*full, g)) << "group " << g;
  }
}

}  // namespace

TEST(WeightGroups, GroupsLoadedAgainEqualTheFullLoad) {
  QLFT_NEED_SHARED(gguf, "models/stories260K.gguf");
  set_num_threads(1);
  expect_groups_reload_alike(gguf, "keep");
  expect_groups_reload_alike(gguf, "nf4");
}

// Rows read straight from the file as stored (ZeRO-3's row shards: WeightGroupSource::stored_rows
// and load_rows), dequantized, equal the rows load_model makes: the embedding, and the untied
// head (f32 and Q8_0 files). A deferred load keeps an untied head's shape alone, and the last
// group loaded without the head holds the final norm and no head bytes.
TEST(WeightGroups, RowsReadAsStoredEqualTheFullLoad) {
  for (const char* name : {"syn_llama.gguf", "syn_llama_q8_0.gguf"}) {
    const std::string path = qlft_test::fixture_path(std::string("model/") + name);
    SCOPED_TRACE(path);
    MemoryTracker tracker;
    auto [full, lazy] = FullAndDeferred(tracker, path, "keep");
    ASSERT_FALSE(full->cfg.tied_embeddings);
    EXPECT_EQ(lazy->weight_bytes(), full->weight_bytes());
    EXPECT_EQ(lazy->output.rows, full->output.rows);
    EXPECT_EQ(lazy->output.cols, full->output.cols);
    EXPECT_TRUE(lazy->output.data.empty());
    auto src = WeightGroupSource::open(&tracker, *lazy);
    const int last = full->cfg.n_layers + 1;
    src->load(*lazy, last, /*with_head=*/false);
    EXPECT_TRUE(lazy->output.data.empty());
    ASSERT_EQ(lazy->output_norm.size(), full->output_norm.size());
    EXPECT_EQ(0, std::memcmp(lazy->output_norm.data(), full->output_norm.data(),
                             lazy->output_norm.size()));
    for (bool head : {false, true}) {
      const QWeight& want = head ? full->output : full->tok_embd;
      QWeight rows = src->stored_rows(head);
      ASSERT_EQ(rows.rows, want.rows);
      ASSERT_EQ(rows.cols, want.cols);
      // Rows 3..3+n: an unaligned run, not from the start.
      const int64_t r0 = 3, n = want.rows - 5;
      rows.rows = n;
      rows.data =
          Buffer(&tracker, MemCategory::Weights, size_t(n * stored_row_bytes(rows)), "rows");
      src->load_rows(head, r0, n, rows.data.data());
      std::vector<float> got(size_t(n * want.cols)), ref(got.size());
      rows.dequantize_rows(0, n, got.data());
      want.dequantize_rows(r0, n, ref.data());
      EXPECT_EQ(got, ref) << (head ? "head" : "embedding");
    }
  }
}

// Groups the file stores as the model keeps them (GGUF f32, blocks with quant.type=keep) are
// read by byte range (ZeRO-3's slices, WeightGroupSource::stored_group / read_stored) and never
// read for the deferred load's shapes: every range read equals the bytes of the Buffer a full
// load made, the list has the full load's Buffer sizes (0 where it has none), and the bytes
// counted are the bytes asked for. A group quantized on load (NF4) has no list and is read whole,
// once, for its shapes.
TEST(WeightGroups, StoredGroupsReadByRangeEqualTheFullLoad) {
  QLFT_NEED_SHARED(stories, "models/stories260K.gguf");
  const std::string q8 = qlft_test::fixture_path("model/syn_llama_q8_0.gguf");
  for (const std::string& path : {stories, q8}) {
    SCOPED_TRACE(path);
    MemoryTracker tracker;
    auto [full, lazy] = FullAndDeferred(tracker, path, "keep");
    EXPECT_EQ(lazy->deferred_groups_read, 0);
    EXPECT_EQ(lazy->weight_bytes(), full->weight_bytes());
    auto src = WeightGroupSource::open(&tracker, *lazy);
    uint64_t asked = 0;
    const int G = full->cfg.n_layers + 2;
    for (int g = 0; g < G; ++g) {
      SCOPED_TRACE("group " + std::to_string(g));
      const auto want = group_bytes(*full, g);
      const std::vector<size_t> sizes = src->stored_group(g, /*with_head=*/true);
      // The Q8_0 embedding and head are dequantized to f32 on load: their groups are not
      // stored as kept (ZeRO-3 reads them by rows); without the head the final norm is.
      const bool made_on_load = path == q8 && (g == 0 || g == G - 1);
      if (made_on_load) {
        EXPECT_TRUE(sizes.empty());
        if (g == G - 1) EXPECT_EQ(src->stored_group(g, /*with_head=*/false).size(), want.size());
        continue;
      }
      ASSERT_EQ(sizes.size(), want.size());
      for (size_t i = 0; i < sizes.size(); ++i) {
        ASSERT_EQ(sizes[i], want[i].size()) << "Buffer " << i;
        if (!sizes[i]) continue;
        // The whole Buffer, then ranges that start and end off any alignment, and an empty one.
        const size_t n = sizes[i];
        const std::pair<size_t, size_t> ranges[] = {
            {0, n}, {1, n - 2}, {n / 2 + 3, n / 4}, {n / 3, 0}};
        for (auto [off, len] : ranges) {
          if (n < 8) break;
          std::vector<uint8_t> got(len + 1, 0xA5);
          src->read_stored(i, off, len, got.data());
          asked += len;
          EXPECT_EQ(0, std::memcmp(got.data(), want[i].data() + off, len))
              << "Buffer " << i << " bytes [" << off << ", " << off + len << ")";
          EXPECT_EQ(got[len], 0xA5) << "wrote past the range";
        }
      }
    }
    EXPECT_EQ(src->bytes_read_by_range(), asked);
    EXPECT_EQ(src->groups_loaded(), 0);
    // A range past a Buffer's end is refused, not read.
    const std::vector<size_t> sizes = src->stored_group(1, true);
    std::vector<uint8_t> sink(sizes[0] + 1);
    EXPECT_THROW(src->read_stored(0, 1, sizes[0], sink.data()), qlft::Error);
  }
  // Quantized on load: no list; the deferred load read each layer once for its shapes (the
  // final norm group, f32 as stored, was not read).
  MemoryTracker tracker;
  LoadOptions lo;
  lo.quant_type = qlft::QuantType::NF4;
  lo.deferred = true;
  auto lazy = load_model(&tracker, stories, lo);
  EXPECT_EQ(lazy->deferred_groups_read, lazy->cfg.n_layers);
  auto src = WeightGroupSource::open(&tracker, *lazy);
  EXPECT_TRUE(src->stored_group(1, true).empty());
  EXPECT_FALSE(src->stored_group(lazy->cfg.n_layers + 1, true).empty());
}

TEST(WeightGroups, DeferredModelTrainsAndGeneratesAsTheResidentOne) {
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  QLFT_NEED_SHARED(text, "data/tinyshakespeare.txt");
  set_num_threads(1);
  std::vector<double> loss[2];
  std::vector<int32_t> ids[2];
  for (int deferred = 0; deferred < 2; ++deferred) {
    MemoryTracker tracker;
    LoadOptions lo;
    lo.quant_type = qlft::QuantType::NF4;
    lo.deferred = deferred == 1;
    auto model = load_model(&tracker, model_path, lo);
    auto tok = Tokenizer::from_gguf(*model->gguf);
    data::TokenizerEncoder enc(*tok);
    Config c;
    c.set("data.path", text);
    c.set("data.seq_len", "32");
    c.set("lora.r", "4");
    c.set("optim.lr", "3e-3");
    c.set("train.micro_batch", "2");
    c.set("train.max_steps", "3");
    auto ds =
        std::make_unique<data::Dataset>(data::Dataset::build(qlft::parse_run_spec(c).data, enc));
    Trainer t(*model, &tracker, ds.get(), qlft::parse_run_spec(c));
    StepReport r;
    while (t.step(&r)) loss[deferred].push_back(r.loss);
    auto be = make_cpu_backend(&tracker);
    Generator gen(*model, *be, &t.lora());
    GenerateOptions go;
    go.max_tokens = 8;
    ids[deferred] = gen.generate(tok->encode_as_model("Once upon", false), go);
    if (deferred) {
      // Nothing stays resident between uses.
      for (int g = 0; g < model->cfg.n_layers + 2; ++g)
        for (const auto& b : group_bytes(*model, g)) EXPECT_TRUE(b.empty()) << "group " << g;
    }
  }
  ASSERT_EQ(loss[0].size(), 3u);
  EXPECT_EQ(loss[1], loss[0]);
  EXPECT_EQ(ids[1], ids[0]);
}
