// Trainer::resume on arbitrary checkpoint bytes, with the stories260K model and a tiny dataset.
// A rejected checkpoint must leave the trainer usable: one step runs after every failed resume
// is too slow for fuzzing, so only the resume itself is exercised here (the unit tests cover the
// state-unchanged property).
#include <memory>

#include "config/config.h"
#include "data/dataset.h"
#include "data/tokenizer_encoder.h"
#include "fuzz_common.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "train/trainer.h"

namespace {
struct World {
  qlft::MemoryTracker tracker;
  std::unique_ptr<qlft::Model> model;
  std::unique_ptr<qlft::Tokenizer> tok;
  std::unique_ptr<qlft::data::TokenizerEncoder> enc;
  std::unique_ptr<qlft::data::Dataset> data;
  qlft::Config cfg;
  std::unique_ptr<qlft::Trainer> trainer;
  World() {
    qlft::LoadOptions lo;
    lo.quant_type = qlft::QuantType::Keep;
    model = qlft::load_model(&tracker, qlft_fuzz::shared_file("models/stories260K.gguf"), lo);
    tok = qlft::Tokenizer::from_gguf(*model->gguf);
    enc = std::make_unique<qlft::data::TokenizerEncoder>(*tok);
    std::string text;
    for (int i = 0; i < 40; ++i) text += "Once upon a time there was a little cat.\n\n";
    qlft::Config dc;
    dc.set("data.path", qlft_fuzz::write_scratch("train.txt", text));
    dc.set("data.seq_len", "32");
    dc.set("data.eval_fraction", "0");
    data = std::make_unique<qlft::data::Dataset>(
        qlft::data::Dataset::build(qlft::parse_run_spec(dc).data, *enc));
    cfg.set("lora.r", "2");
    cfg.set("lora.alpha", "4");
    cfg.set("train.micro_batch", "2");
    cfg.set("train.max_steps", "3");
    cfg.set("train.output_dir", qlft_fuzz::scratch_dir() + "/out");
    trainer =
        std::make_unique<qlft::Trainer>(*model, &tracker, data.get(), qlft::parse_run_spec(cfg));
    // A genuine checkpoint as a seed: written where make_seeds.sh / fuzz.sh can pick it up.
    if (const char* dump = std::getenv("QLFT_FUZZ_WRITE_CHECKPOINT")) {
      qlft::StepReport r;
      trainer->step(&r);
      trainer->save_checkpoint(dump);
      _exit(0);  // not exit(): libFuzzer counts an exit() inside a run as a crash
    }
  }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static World w;
  std::string path =
      qlft_fuzz::write_scratch("ck.safetensors", {reinterpret_cast<const char*>(data), size});
  qlft_fuzz::expect_only_qlft_errors([&] { w.trainer->resume(path); });
  return 0;
}
