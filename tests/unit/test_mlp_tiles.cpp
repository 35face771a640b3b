// The MLP tiled along the sequence on the CPU backend (model/llama_mlp_tiles.cpp): a training
// step's loss and LoRA gradients equal the untiled step's (every layer checkpointed both ways),
// in fp32 and with bf16 activation storage, with LoRA dropout (each tile draws the batch's
// mask), over tiles that do not divide the batch; the tiles' buffers really are smaller.
#include <gtest/gtest.h>

#include "mlp_tiles_check.h"

using namespace qlft;
using namespace model_test;
using qlft_test::max_rel_error;

namespace {

void expect_tiles_equal_whole(Precision prec) {
  MemoryTracker tr;
  auto m = load_model(&tr, model_fixture("syn_llama"), keep());
  BackendSpec spec;
  spec.precision = prec;
  auto be = make_cpu_backend(&tr, spec);
  const DType acts = activation_dtype(prec);
  const auto whole = mlp_tiles_check::step(*m, *be, &tr, 0, acts, 0.1f);
  ASSERT_EQ(whole.tile, 0);
  for (int64_t tile : {5, 16}) {
    const auto t = mlp_tiles_check::step(*m, *be, &tr, tile, acts, 0.1f);
    EXPECT_EQ(t.tile, tile);
    EXPECT_NEAR(t.loss, whole.loss, 1e-6 * std::fabs(whole.loss)) << "tile " << tile;
    ASSERT_EQ(t.grads.size(), whole.grads.size());
    const double err = max_rel_error(t.grads.data(), whole.grads.data(), whole.grads.size());
    std::printf("[tiles] %s tile %lld: loss %.9g vs %.9g, gradients' worst relative error %.2e\n",
                prec == Precision::BF16 ? "bf16" : "fp32", static_cast<long long>(tile), t.loss,
                whole.loss, err);
    EXPECT_LT(err, 1e-5) << "tile " << tile;
    // gate / up / activation and dh / dgate / dup hold a tile, not all 32 rows.
    EXPECT_LT(t.act_peak, whole.act_peak);
    // The workspace peak may be another kernel's at this size (most backward temporaries
    // live in dead tensors: model/llama_internal.h grads_owned), never more than whole; the
    // temporaries the runner holds after backward are smaller.
    EXPECT_LE(t.ws_peak, whole.ws_peak);
    EXPECT_LT(t.ws_held, whole.ws_held);
    // The planner's activations (LlamaRunner::footprint with the tile) are the tracker's.
    const RunnerFootprint f =
        LlamaRunner::footprint(m->shapes, 4, kProjCount, 32, true, false, acts, nullptr, tile);
    EXPECT_EQ(f.activations(0, m->cfg.n_layers), t.act_peak) << "tile " << tile;
  }
}

}  // namespace

TEST(MlpTiles, TiledStepEqualsWholeFp32) {
  expect_tiles_equal_whole(Precision::FP32);
}

TEST(MlpTiles, TiledStepEqualsWholeBf16) {
  expect_tiles_equal_whole(Precision::BF16);
}

// Tiles engage only with every layer checkpointed and a batch longer than one tile.
TEST(MlpTiles, EngagedOnlyWhereTheRuleSays) {
  MemoryTracker tr;
  auto m = load_model(&tr, model_fixture("syn_llama"), keep());
  EXPECT_EQ(mlp_tile_for(m->shapes, 8, 32, true), 8);
  EXPECT_EQ(mlp_tile_for(m->shapes, 8, 32, false), 0);
  EXPECT_EQ(mlp_tile_for(m->shapes, 32, 32, true), 0);
  EXPECT_EQ(mlp_tile_for(m->shapes, 0, 32, true), 0);
  auto be = make_cpu_backend(&tr);
  LlamaRunner run(*m, *be, nullptr);
  EXPECT_THROW(run.set_mlp_tile_rows(-1), Error);
}
