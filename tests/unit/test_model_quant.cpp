// Quantized base weights end to end: logits of the synthetic llama model whose linear weights
// are NF4 (bitsandbytes codes, double quant), INT8 (row-wise absmax), or kept as GGUF Q8_0/Q4_0
// blocks, against a PyTorch model holding the same codes dequantized
// (tests/reference/gen_model_fixtures.py: bitsandbytes quantize_4bit / int8_vectorwise_quant and
// the gguf package's quantize/dequantize).
#include <gtest/gtest.h>

#include "support/settings.h"
#include "test_model_util.h"

using namespace qlft;
using namespace model_test;
using qlft_test::max_rel_error;

namespace {

void check_quant(const std::string& model_rel, const char* quant_type, const char* ref_name,
                 const char* expect_type) {
  MemoryTracker tr;
  LoadOptions o;
  o.quant_type = qlft_test::quant_type(quant_type);
  o.double_quant = true;
  o.blocksize = 64;
  // Every quantization here is implemented: QLFT_ERR_UNSUPPORTED (or any error) fails the test.
  auto model = load_model(&tr, model_fixture(model_rel), o);
  EXPECT_EQ(model->quant_summary, expect_type);
  Fixture f(model_fixture("syn_llama.quant.safetensors"));
  auto be = make_cpu_backend(&tr);
  LlamaRunner run(*model, *be, nullptr);
  std::vector<int32_t> tok = f.i32("tokens");
  TokenBatch b;
  b.batch = 2;
  b.seq = static_cast<int>(tok.size() / 2);
  b.tokens = tok.data();
  const int V = model->cfg.vocab;
  std::vector<float> logits(b.rows() * V);
  run.logits(b, MatF(logits.data(), b.rows(), V));
  std::vector<float> ref = f.f32(ref_name);
  ASSERT_EQ(ref.size(), logits.size());
  double e = max_rel_error(logits.data(), ref.data(), ref.size());
  std::printf("[quant] %s: normalized max error %.2e\n", ref_name, e);
  EXPECT_LT(e, 1e-4);
  // And the quantization matters: the fp32 base model's logits differ clearly.
  Fixture base(model_fixture("syn_llama.lora.safetensors"));
  std::vector<float> fp = base.f32("base_logits");
  EXPECT_GT(max_rel_error(fp.data(), ref.data(), ref.size()), 1e-3);
}

}  // namespace

TEST(ModelQuant, Nf4DoubleQuantFromSafetensors) {
  check_quant("syn_llama", "nf4", "nf4", "nf4");
}
TEST(ModelQuant, Int8FromSafetensors) {
  check_quant("syn_llama", "int8", "int8", "int8");
}
TEST(ModelQuant, GgufQ8_0Kept) {
  check_quant("syn_llama_q8_0.gguf", "keep", "q8_0", "q8_0");
}
TEST(ModelQuant, GgufQ4_0Kept) {
  check_quant("syn_llama_q4_0.gguf", "keep", "q4_0", "q4_0");
}
