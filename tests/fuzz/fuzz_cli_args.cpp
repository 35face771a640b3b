// The CLI's argument parser (tools/qlft-finetune/cli_common.cpp: parse_args, then make_config
// applying every --key value through the settings table) and its metrics.jsonl trimming
// (run_dir.cpp), on arbitrary words. The input is the argument list, NUL-separated; its first
// word picks the subcommand's flag set. Errors are reported, never crash.
#include <cstdint>
#include <string>
#include <vector>

#include "cli.h"
#include "run_dir.h"

namespace {
struct FlagSet {
  std::vector<std::string> known, bools;
  size_t positional;
};
const FlagSet kSets[] = {
    {{"model", "data", "config"}, {"resume", "overwrite", "help"}, 0},  // train
    {{"model", "adapter", "prompt", "max-tokens", "temperature", "top-k", "top-p", "seed",
      "config"},
     {"help"},
     0},                                                             // generate
    {{}, {"help"}, 1},                                               // inspect
    {{"model", "adapter", "format", "out", "config"}, {"help"}, 0},  // export
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string in(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> words;
  size_t pos = 0;
  while (pos <= in.size() && words.size() < 256) {
    size_t z = in.find('\0', pos);
    if (z == std::string::npos) z = in.size();
    words.push_back(in.substr(pos, z - pos));
    pos = z + 1;
  }
  std::vector<char*> argv = {const_cast<char*>("qlft-finetune")};
  for (auto& w : words) argv.push_back(w.data());
  const FlagSet& fs =
      kSets[words.empty() || words[0].empty() ? 0 : static_cast<unsigned char>(words[0][0]) % 4];
  cli::Args a;
  std::string err;
  if (cli::parse_args(static_cast<int>(argv.size()), argv.data(), 2, fs.known, fs.bools, &a, &err,
                      fs.positional)) {
    // Files named by the input are not opened: only the settings are applied.
    a.flags.erase("config");
    a.flags.erase("adapter");
    std::vector<std::pair<std::string, std::string>> settings;
    for (auto& kv : a.settings)
      if (kv.first != "lora.init_from") settings.push_back(kv);
    a.settings = settings;
    int code = 0;
    cli::ConfigPtr cfg = cli::make_config(a, &code);
    if (!cfg && code == 0) __builtin_trap();  // a failure must carry an exit code
  } else if (err.empty()) {
    __builtin_trap();  // a refusal must say why
  }
  (void)cli::metrics_records_before(in, words.size());
  (void)cli::json_number(static_cast<double>(size) / (words.size() - 1.0 + 1e-300));
  return 0;
}
