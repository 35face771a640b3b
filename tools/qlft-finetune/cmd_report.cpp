// qlft-finetune report RUN_DIR [--out FILE] [--watch SECONDS]
//
// Writes RUN_DIR/report.html (or FILE): the training report drawn from RUN_DIR/metrics.jsonl
// alone (qlft_report_write). It can be run while the run trains; --watch rewrites it every
// SECONDS until Ctrl-C, and the page then reloads itself at that pace (a meta refresh, no
// script).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cli.h"

namespace cli {

namespace {

volatile sig_atomic_t g_stop = 0;
void on_stop(int) {
  g_stop = 1;
}

}  // namespace

int cmd_report(int argc, char** argv) {
  Args a;
  std::string err;
  if (!parse_args(argc, argv, 2, {"out", "watch"}, {"help"}, &a, &err, /*max_positional=*/1) ||
      a.flags.count("help") || a.positional.size() != 1) {
    if (!err.empty()) std::fprintf(stderr, "qlft-finetune: %s\n", err.c_str());
    std::fprintf(stderr,
                 "usage: qlft-finetune report RUN_DIR [--out FILE] [--watch SECONDS]\n"
                 "  writes RUN_DIR/report.html (loss, learning rate, tokens/s, gradient norm, "
                 "memory per category against the planner) from RUN_DIR/metrics.jsonl; --watch "
                 "rewrites it every SECONDS until Ctrl-C\n");
    return a.flags.count("help") && err.empty() ? kOk : kUsage;
  }
  const std::string dir = a.positional[0];
  const std::string out = a.flags.count("out") ? a.flags["out"] : dir + "/report.html";
  long every = 0;
  if (a.flags.count("watch")) {
    const std::string w = a.flags["watch"];
    char* end = nullptr;
    every = std::strtol(w.c_str(), &end, 10);
    if (w.empty() || *end || every < 1 || every > 86400) {
      std::fprintf(stderr, "qlft-finetune: --watch wants seconds from 1 to 86400, got '%s'\n",
                   w.c_str());
      return kUsage;
    }
  }
  qlft_report_options o{};
  o.struct_size = sizeof o;
  o.output_path = out.c_str();
  o.refresh_seconds = static_cast<uint32_t>(every);
  if (every == 0) {
    if (int32_t st = qlft_report_write(dir.c_str(), &o); st != QLFT_OK) return fail("report", st);
    std::printf("%s\n", out.c_str());
    return kOk;
  }
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::fprintf(stderr, "report: %s, rewritten every %ld s (Ctrl-C stops)\n", out.c_str(), every);
  const std::string metrics = dir + "/metrics.jsonl";
  while (!g_stop) {
    // A run that has not written its metrics yet is waited for; any other failure (the report
    // cannot be written, a refused --out) stops the watch with its error.
    struct stat ms;
    const bool had_metrics = ::stat(metrics.c_str(), &ms) == 0;  // before: a run may create it
    if (int32_t st = qlft_report_write(dir.c_str(), &o); st != QLFT_OK)
      if (st != QLFT_ERR_IO || had_metrics) return fail("report", st);
    for (long i = 0; i < every * 10 && !g_stop; ++i) ::usleep(100000);
  }
  return kOk;
}

}  // namespace cli
