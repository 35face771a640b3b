// The MLP tiled along the sequence on the CUDA backend (the emulator in the cuda-emu build):
// the tiles' loss and LoRA gradients equal the whole MLP's on the same backend (every layer
// checkpointed both ways, LoRA dropout drawn per tile from the batch's mask by the device
// kernels), in fp32 and bf16, and the tiles' device buffers are smaller
// (tests/unit/mlp_tiles_check.h; the CPU backend's twin is test_mlp_tiles).
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "unit/mlp_tiles_check.h"

using namespace qlft;
using qlft_test::max_rel_error;

namespace {

void expect_tiles_equal_whole(Precision prec) {
  MemoryTracker tr;
  auto m = load_model(&tr, model_test::model_fixture("syn_llama"), model_test::keep());
  CudaBackendOptions o;
  o.spec.precision = prec;
  auto be = make_cuda_backend(&tr, o);
  const DType acts = activation_dtype(prec);
  const auto whole = mlp_tiles_check::step(*m, *be, &tr, 0, acts, 0.1f);
  const auto t = mlp_tiles_check::step(*m, *be, &tr, 5, acts, 0.1f);
  EXPECT_EQ(t.tile, 5);
  EXPECT_NEAR(t.loss, whole.loss, 1e-6 * std::fabs(whole.loss));
  ASSERT_EQ(t.grads.size(), whole.grads.size());
  const double err = max_rel_error(t.grads.data(), whole.grads.data(), whole.grads.size());
  std::printf("[tiles] cuda %s tile 5: loss %.9g vs %.9g, gradients' worst relative error %.2e\n",
              prec == Precision::BF16 ? "bf16" : "fp32", t.loss, whole.loss, err);
  EXPECT_LT(err, 1e-5);
  EXPECT_LT(t.act_peak, whole.act_peak);
  EXPECT_LE(t.ws_peak, whole.ws_peak);  // (may be another kernel's peak at this size)
  EXPECT_LT(t.ws_held, whole.ws_held);  // dh, dgate, dup: a tile
}

}  // namespace

TEST(CudaMlpTiles, TiledStepEqualsWholeFp32) {
  QLFT_NEED_GPU();
  expect_tiles_equal_whole(Precision::FP32);
}

TEST(CudaMlpTiles, TiledStepEqualsWholeBf16) {
  QLFT_NEED_GPU();
  expect_tiles_equal_whole(Precision::BF16);
}
