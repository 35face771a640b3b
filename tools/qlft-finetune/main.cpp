// qlft-finetune: train, evaluate and export LoRA adapters; inspect models. Uses only qlft.h.
#include <cstdio>
#include <cstring>
#include <string>

#include "cli.h"

namespace {
void usage(FILE* f) {
  std::fprintf(
      f,
      "usage: qlft-finetune COMMAND [args] [--setting value ...]\n\n"
      "commands:\n"
      "  train             fine-tune a LoRA adapter: --model M --data FILE [--config Y]\n"
      "  inspect MODEL     architecture, shapes, quantization and memory of a model\n"
      "  generate          --model M [--adapter DIR] --prompt TEXT [--max-tokens N ...]\n"
      "  tokenize          --model M [--text T | --file F] [--no-bos] [--ids]\n"
      "  data-stats        --model M --data FILE: records, tokens, lengths\n"
      "  eval              --model M --data FILE [--adapter DIR]: loss and perplexity\n"
      "  export            --model M --adapter DIR --format peft|gguf|merged-safetensors|\n"
      "                    merged-gguf-f16|merged-gguf-bf16 --out PATH\n"
      "  estimate          --model M [--config Y]: predicted memory per category\n"
      "  report RUN_DIR    write RUN_DIR/report.html from metrics.jsonl [--watch SECONDS]\n"
      "  config-doc        print the settings reference (docs/CONFIG.md)\n"
      "  version           print the version and build information\n\n"
      "Settings are the keys of docs/CONFIG.md, given as --key value.\n");
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return cli::kUsage;
  }
  std::string cmd = argv[1];
  // Commands that take no argument refuse one ("version extra" is a typo, not a version).
  auto no_args = [&]() {
    if (argc <= 2) return true;
    std::fprintf(stderr, "qlft-finetune: %s takes no arguments, got '%s'\n", cmd.c_str(), argv[2]);
    return false;
  };
  if (cmd == "inspect") return cli::cmd_inspect(argc, argv);
  if (cmd == "train") return cli::cmd_train(argc, argv);
  if (cmd == "tokenize") return cli::cmd_tokenize(argc, argv);
  if (cmd == "generate") return cli::cmd_generate(argc, argv);
  if (cmd == "data-stats") return cli::cmd_data_stats(argc, argv);
  if (cmd == "config-doc") return no_args() ? cli::cmd_config_doc(argc, argv) : cli::kUsage;
  if (cmd == "eval") return cli::cmd_eval(argc, argv);
  if (cmd == "export") return cli::cmd_export(argc, argv);
  if (cmd == "estimate") return cli::cmd_estimate(argc, argv);
  if (cmd == "report") return cli::cmd_report(argc, argv);
  if (cmd == "version" || cmd == "--version") {
    if (!no_args()) return cli::kUsage;
    std::printf("%s\n", qlft_build_info());
    return cli::kOk;
  }
  if (cmd == "help" || cmd == "--help" || cmd == "-h") {
    usage(stdout);
    return cli::kOk;
  }
  std::fprintf(stderr, "qlft-finetune: unknown command '%s'\n", cmd.c_str());
  usage(stderr);
  return cli::kUsage;
}
