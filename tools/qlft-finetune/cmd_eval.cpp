// qlft-finetune eval --model M --data FILE [--adapter PEFT_DIR] [--setting value ...]
// Prints the mean token loss and perplexity on the data's held-out split (data.eval_fraction,
// the same split `train` holds out with the same settings), or on all of it when the split is
// empty. With --adapter the PEFT adapter is applied (its r / alpha / targets are read from it).
#include <cstdio>
#include <string>

#include "cli.h"

namespace cli {

int cmd_eval(int argc, char** argv) {
  Args a;
  std::string err;
  if (!parse_args(argc, argv, 2, {"model", "data", "adapter", "config"}, {"help"}, &a, &err) ||
      a.flags.count("help") || !a.flags.count("model") || !a.flags.count("data")) {
    if (!err.empty()) std::fprintf(stderr, "qlft-finetune: %s\n", err.c_str());
    std::fprintf(stderr,
                 "usage: qlft-finetune eval --model MODEL --data FILE [--adapter PEFT_DIR]\n"
                 "         [--config run.yaml] [--setting value ...]\n");
    return a.flags.count("help") && err.empty() ? kOk : kUsage;
  }
  // The adapter builds the trainer's LoRA from its own adapter_config.json.
  if (a.flags.count("adapter")) {
    a.settings.emplace_back("lora.init_from", a.flags["adapter"]);
    a.flags.erase("adapter");
  }
  int code = kOk;
  ConfigPtr cfg = make_config(a, &code);
  if (!cfg) return code;
  TrainSession s;
  if ((code = open_session(a, cfg.get(), &s, true)) != kOk) return code;
  qlft_eval_result r{};
  r.struct_size = sizeof r;
  int32_t st = qlft_trainer_evaluate(s.trainer.get(), s.data.get(), &r);
  if (st != QLFT_OK) return fail("eval", st);
  // Under a launcher with dist.* settings every rank evaluates (needed over NCCL ZeRO-3, whose
  // evaluation gathers weights; elsewhere each rank reads its own); rank 0 alone prints.
  int32_t rank = 0, world = 1;
  qlft_trainer_dist_info(s.trainer.get(), &rank, &world);
  if (rank != 0) return kOk;
  qlft_dataset_stats ds{};
  ds.struct_size = sizeof ds;
  const bool held_out = qlft_dataset_get_stats(s.data.get(), &ds) == QLFT_OK && ds.eval_sequences;
  std::printf("eval loss %.6f perplexity %.4f tokens %llu (%s)\n", r.loss, r.perplexity,
              static_cast<unsigned long long>(r.tokens), held_out ? "held-out split" : "all data");
  return kOk;
}

}  // namespace cli
