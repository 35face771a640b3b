// qlft-finetune export --model M --adapter PEFT_DIR --format FMT --out PATH
//   FMT: peft | gguf (llama.cpp LoRA adapter) | merged-safetensors (HF directory) |
//        merged-gguf-f16 | merged-gguf-bf16
// Converts a trained PEFT adapter for the ecosystem, or merges it into the base model.
#include <cstdio>
#include <string>

#include "../../src/formats/output_guard.h"
#include "cli.h"
#include "run_dir.h"

namespace cli {

int cmd_export(int argc, char** argv) {
  Args a;
  std::string err;
  const bool ok = parse_args(argc, argv, 2, {"model", "adapter", "format", "out", "config"},
                             {"help"}, &a, &err);
  if (!ok || a.flags.count("help") || !a.flags.count("model") || !a.flags.count("adapter") ||
      !a.flags.count("format") || !a.flags.count("out")) {
    if (!err.empty()) std::fprintf(stderr, "qlft-finetune: %s\n", err.c_str());
    std::fprintf(
        stderr,
        "usage: qlft-finetune export --model MODEL --adapter PEFT_DIR --out PATH\n"
        "         --format peft|gguf|merged-safetensors|merged-gguf-f16|merged-gguf-bf16\n");
    return a.flags.count("help") && err.empty() ? kOk : kUsage;
  }
  const std::string fmt = a.flags["format"];
  const bool merged = fmt.rfind("merged-", 0) == 0;
  const std::string merged_fmt = merged ? fmt.substr(7) : "";
  if (fmt != "peft" && fmt != "gguf" && merged_fmt != "safetensors" && merged_fmt != "gguf-f16" &&
      merged_fmt != "gguf-bf16") {
    std::fprintf(stderr, "qlft-finetune: unknown --format '%s'\n", fmt.c_str());
    return kUsage;
  }
  const std::string out = a.flags["out"];
  // The output must not replace what this command reads (the library's rule, checked here
  // before the model loads; the library checks again when it writes).
  qlft::OutputGuard guard;
  guard.add_input(a.flags["model"], "the --model");
  guard.add_input(a.flags["adapter"], "the --adapter");
  std::string why = guard.refusal(out, "export", fmt == "peft");
  if (why.empty() && merged_fmt == "safetensors")
    for (const char* f : {"/model.safetensors", "/config.json"})
      if (why.empty()) why = guard.refusal(out + f, "export");
  if (!why.empty()) {
    std::fprintf(stderr, "qlft-finetune: %s\n", why.c_str());
    return kUsage;
  }
  const std::string adapter = a.flags["adapter"];
  a.settings.emplace_back("lora.init_from", adapter);
  a.flags.erase("adapter");
  // The base as stored while the adapter trained (its qlft_base_config.json, read by
  // make_config); an adapter without that record merges into the weights as stored in the file
  // (the usual QLoRA merge into the original base). --quant.type overrides both.
  bool quant_set = false;
  for (const auto& kv : a.settings) quant_set |= kv.first == "quant.type";
  if (!quant_set && !file_exists(adapter + "/qlft_base_config.json"))
    a.settings.emplace_back("quant.type", "keep");
  int code = kOk;
  ConfigPtr cfg = make_config(a, &code);
  if (!cfg) return code;
  TrainSession s;
  if ((code = open_session(a, cfg.get(), &s, false)) != kOk) return code;
  int32_t st = merged ? qlft_trainer_export_merged(s.trainer.get(), out.c_str(), merged_fmt.c_str())
                      : qlft_trainer_save_adapter(s.trainer.get(), out.c_str(), fmt.c_str());
  if (st != QLFT_OK) return fail(out.c_str(), st);
  std::fprintf(stderr, "wrote %s (%s)\n", out.c_str(), fmt.c_str());
  return kOk;
}

}  // namespace cli
