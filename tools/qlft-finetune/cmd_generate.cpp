// qlft-finetune generate --model M [--adapter DIR] --prompt TEXT [--chat] [--max-tokens N]
//   [--temperature T] [--top-k K] [--top-p P] [--seed S]
// Prints only the generated text on stdout (streamed as it is produced). --chat
// (generate.chat) answers the prompt as a user turn of the model's chat template.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cli.h"

namespace cli {

namespace {
int32_t print_text(const char* text, void*) {
  std::fputs(text, stdout);
  std::fflush(stdout);
  return 0;
}
}  // namespace

int cmd_generate(int argc, char** argv) {
  Args a;
  std::string err;
  const std::vector<std::string> flags = {"model", "adapter", "prompt", "max-tokens", "temperature",
                                          "top-k", "top-p",   "seed",   "config"};
  if (!parse_args(argc, argv, 2, flags, {"help", "chat"}, &a, &err) || a.flags.count("help") ||
      !a.flags.count("model")) {
    if (!err.empty()) std::fprintf(stderr, "qlft-finetune: %s\n", err.c_str());
    std::fprintf(
        stderr,
        "usage: qlft-finetune generate --model MODEL [--adapter PEFT_DIR] [--prompt TEXT] "
        "[--chat]\n"
        "         [--max-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
        "  --chat: the prompt is a user turn of the model's chat template (generate.chat)\n");
    return a.flags.count("help") && err.empty() ? kOk : kUsage;
  }
  // The short flags are the generate.* settings under their CLI names.
  const char* map[][2] = {{"max-tokens", "generate.max_tokens"},
                          {"temperature", "generate.temperature"},
                          {"top-k", "generate.top_k"},
                          {"top-p", "generate.top_p"},
                          {"seed", "generate.seed"},
                          {"adapter", "lora.init_from"}};
  for (auto& m : map)
    if (a.flags.count(m[0])) a.settings.emplace_back(m[1], a.flags[m[0]]);
  if (a.flags.count("chat")) a.settings.emplace_back("generate.chat", a.flags["chat"]);
  int code = kOk;
  ConfigPtr cfg = make_config(a, &code);
  if (!cfg) return code;
  TrainSession s;
  if (int rc = open_model(a.flags["model"], cfg.get(), &s)) return rc;
  qlft_model* m = s.model.get();
  int32_t st = QLFT_OK;
  if (a.flags.count("adapter")) {
    qlft_trainer* t = nullptr;
    st = qlft_trainer_create(m, nullptr, cfg.get(), &t);
    if (st != QLFT_OK) return fail(a.flags["adapter"].c_str(), st);
    s.trainer.reset(t);
    // Under a launcher with dist.* settings (ZeRO-3 shards the base weights), rank 0 alone
    // generates and prints: it reads the weights it lacks from the model file, no peer needed.
    int32_t rank = 0, world = 1;
    qlft_trainer_dist_info(t, &rank, &world);
    if (rank != 0) return kOk;
  }
  std::string prompt = a.flags.count("prompt") ? a.flags["prompt"] : "";
  // qlft_generate stops at the model's context: say so before, not by a silent cut. The prompt is
  // counted as qlft_generate encodes it (the model's own BOS/EOS rule, special spellings as text).
  qlft_model_details md{};
  md.struct_size = sizeof md;
  size_t n_prompt = 0;
  char max_tokens[32] = "";
  size_t need = 0;
  if (qlft_model_info(m, &md) == QLFT_OK && md.context_length > 0 &&
      qlft_tokenize(m, prompt.data(), prompt.size(), QLFT_ADD_SPECIAL_AS_MODEL, 0, nullptr, 0,
                    &n_prompt) == QLFT_OK &&
      qlft_config_get(cfg.get(), "generate.max_tokens", max_tokens, sizeof max_tokens, &need) ==
          QLFT_OK &&
      n_prompt + std::strtoull(max_tokens, nullptr, 10) > md.context_length)
    std::fprintf(stderr,
                 "warning: generation stops at the model's context (%u tokens): the prompt has "
                 "%zu, so at most %llu of generate.max_tokens %s are generated\n",
                 md.context_length, n_prompt,
                 static_cast<unsigned long long>(
                     n_prompt < md.context_length ? md.context_length - n_prompt : 0),
                 max_tokens);
  st = qlft_generate(m, s.trainer.get(), prompt.c_str(), cfg.get(), print_text, nullptr);
  std::printf("\n");
  if (st != QLFT_OK) return fail("generate", st);
  return kOk;
}

}  // namespace cli
