// qlft-finetune train --model M --data D [--config run.yaml] [--resume] [--setting value ...]
//
// Trains a LoRA adapter and writes, under train.output_dir: checkpoint.safetensors (every
// train.save_every steps, at the end and on Ctrl-C), metrics.jsonl (one record per step),
// adapter/ (PEFT) and adapter.gguf (llama.cpp). Prints eval loss before and after.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "cli.h"

namespace cli {

namespace {

std::atomic<qlft_trainer*> g_trainer{nullptr};

void on_sigint(int) {
  qlft_trainer* t = g_trainer.load();
  if (t) qlft_trainer_cancel(t);  // async-signal-safe by contract
}

struct Progress {
  FILE* metrics = nullptr;
  bool tty = false;
  bool quiet = false;  // a rank other than 0 of a distributed run: rank 0 reports
};

std::string fmt_duration(double s) {
  char buf[32];
  long t = static_cast<long>(s);
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else
    std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  return buf;
}

int32_t on_progress(const qlft_step_stats* s, void* user) {
  Progress* p = static_cast<Progress*>(user);
  if (p->quiet) return 0;
  if (p->metrics) {
    std::fprintf(p->metrics,
                 "{\"step\": %llu, \"loss\": %.6f, \"lr\": %.6g, \"grad_norm\": %.6g, "
                 "\"loss_scale\": %g, \"skipped\": %u, \"tokens\": %llu, \"tokens_per_s\": %.1f, "
                 "\"elapsed_s\": %.3f, \"memory_bytes\": %llu, \"memory_peak_bytes\": %llu",
                 static_cast<unsigned long long>(s->step), s->loss, s->learning_rate, s->grad_norm,
                 s->loss_scale, s->skipped, static_cast<unsigned long long>(s->tokens),
                 s->tokens_per_second, s->elapsed_seconds,
                 static_cast<unsigned long long>(s->memory_reserved),
                 static_cast<unsigned long long>(s->memory_peak));
    if (!std::isnan(s->eval_loss)) std::fprintf(p->metrics, ", \"eval_loss\": %.6f", s->eval_loss);
    std::fprintf(p->metrics, "}\n");
    std::fflush(p->metrics);
  }
  if (p->tty) {
    int width = 24;
    int done = s->total_steps ? static_cast<int>(width * s->step / s->total_steps) : 0;
    std::string bar(done, '#');
    bar.resize(width, '.');
    std::fprintf(stderr, "\r[%s] step %llu/%llu loss %.4f lr %.2e %.0f tok/s mem %s eta %s   ",
                 bar.c_str(), static_cast<unsigned long long>(s->step),
                 static_cast<unsigned long long>(s->total_steps), s->loss, s->learning_rate,
                 s->tokens_per_second, human_bytes(s->memory_reserved).c_str(),
                 fmt_duration(s->eta_seconds).c_str());
    if (!std::isnan(s->eval_loss)) std::fprintf(stderr, "\n  eval loss %.4f\n", s->eval_loss);
  } else {
    std::fprintf(stderr, "step %llu/%llu loss %.4f lr %.3g grad_norm %.3g tok/s %.0f mem %s%s\n",
                 static_cast<unsigned long long>(s->step),
                 static_cast<unsigned long long>(s->total_steps), s->loss, s->learning_rate,
                 s->grad_norm, s->tokens_per_second, human_bytes(s->memory_reserved).c_str(),
                 s->skipped ? " (skipped: non-finite gradients)" : "");
    if (!std::isnan(s->eval_loss)) std::fprintf(stderr, "eval loss %.4f\n", s->eval_loss);
  }
  return 0;
}

bool file_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

}  // namespace

int cmd_train(int argc, char** argv) {
  Args a;
  std::string err;
  if (!parse_args(argc, argv, 2, {"model", "data", "config"}, {"resume", "help"}, &a, &err) ||
      a.flags.count("help") || !a.flags.count("model") || !a.flags.count("data")) {
    if (!err.empty()) std::fprintf(stderr, "qlft-finetune: %s\n", err.c_str());
    std::fprintf(stderr,
                 "usage: qlft-finetune train --model MODEL --data FILE [--config run.yaml] "
                 "[--resume] [--key value ...]\n");
    return a.flags.count("help") && err.empty() ? kOk : kUsage;
  }
  int code = kOk;
  ConfigPtr cfg = make_config(a, &code);
  if (!cfg) return code;
  TrainSession s;
  if (int rc = open_session(a, cfg.get(), &s, /*need_data=*/true)) return rc;

  // The memory planner's prediction for the batch shape in use (train.micro_batch=auto has
  // chosen it by now); the tracker's measurement is printed beside it at the end.
  qlft_memory_estimate predicted{};
  predicted.struct_size = sizeof predicted;
  uint32_t micro = 0, accum = 0;
  if (qlft_trainer_batch_shape(s.trainer.get(), &micro, &accum) == QLFT_OK) {
    qlft_config_set(cfg.get(), "train.micro_batch", std::to_string(micro).c_str());
    qlft_config_set(cfg.get(), "train.accumulation", std::to_string(accum).c_str());
  }
  const bool have_plan =
      qlft_estimate_memory(s.model.get(), nullptr, cfg.get(), &predicted) == QLFT_OK;
  if (have_plan)
    std::printf(
        "micro_batch %u x accumulation %u; predicted memory peak %s (activations %s, "
        "workspace %s)\n",
        micro, accum, human_bytes(predicted.total_peak).c_str(),
        human_bytes(predicted.peak[QLFT_MEM_ACTIVATIONS]).c_str(),
        human_bytes(predicted.peak[QLFT_MEM_WORKSPACE]).c_str());

  // Distributed runs (dist.backend, under mpirun): every rank trains and joins the checkpoint
  // (a collective); only rank 0 prints, writes metrics and writes adapters.
  int32_t rank = 0, world = 1;
  qlft_trainer_dist_info(s.trainer.get(), &rank, &world);
  const bool writer = rank == 0;
  if (writer && world > 1) std::printf("distributed: %d ranks\n", world);

  char outdir[4096];
  size_t need = 0;
  qlft_config_get(cfg.get(), "train.output_dir", outdir, sizeof outdir, &need);
  ::mkdir(outdir, 0755);
  const std::string ckpt = std::string(outdir) + "/checkpoint.safetensors";

  if (a.flags.count("resume")) {
    if (file_exists(ckpt)) {
      int32_t st = qlft_trainer_resume(s.trainer.get(), ckpt.c_str());
      if (st != QLFT_OK) return fail(ckpt.c_str(), st);
      if (writer) std::fprintf(stderr, "resumed from %s\n", ckpt.c_str());
    } else {
      std::fprintf(stderr, "no checkpoint at %s: starting from the beginning\n", ckpt.c_str());
    }
  }

  qlft_eval_result before{};
  before.struct_size = sizeof before;
  bool have_eval = qlft_trainer_evaluate(s.trainer.get(), nullptr, &before) == QLFT_OK;
  if (have_eval && writer)
    std::printf("eval loss before: %.4f (perplexity %.2f, %llu tokens)\n", before.loss,
                before.perplexity, static_cast<unsigned long long>(before.tokens));
  std::fflush(stdout);

  Progress p;
  p.tty = ::isatty(STDERR_FILENO);
  p.quiet = !writer;
  std::string metrics = std::string(outdir) + "/metrics.jsonl";
  if (writer) p.metrics = std::fopen(metrics.c_str(), a.flags.count("resume") ? "a" : "w");
  if (writer && !p.metrics)
    std::fprintf(stderr, "qlft-finetune: cannot write %s\n", metrics.c_str());

  g_trainer.store(s.trainer.get());
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int {
  }, old_term{};
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  int32_t st = qlft_trainer_train(s.trainer.get(), on_progress, &p);
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  g_trainer.store(nullptr);
  if (p.tty && writer) std::fprintf(stderr, "\n");
  if (p.metrics) std::fclose(p.metrics);

  // A checkpoint at the end and on cancel, so --resume continues from here.
  int32_t cst = qlft_trainer_save_checkpoint(s.trainer.get(), ckpt.c_str());
  if (cst != QLFT_OK) return fail(ckpt.c_str(), cst);
  if (st == QLFT_ERR_CANCELLED) {
    if (writer)
      std::fprintf(stderr, "cancelled; checkpoint written to %s (continue with --resume)\n",
                   ckpt.c_str());
    return kCancelled;
  }
  if (st != QLFT_OK) return fail("training", st);
  // Every rank evaluates (under ZeRO-3 evaluation gathers weights, a collective); rank 0
  // prints and writes the adapters.
  if (have_eval) {
    qlft_eval_result after{};
    after.struct_size = sizeof after;
    if (qlft_trainer_evaluate(s.trainer.get(), nullptr, &after) == QLFT_OK && writer)
      std::printf("eval loss after:  %.4f (perplexity %.2f)\n", after.loss, after.perplexity);
  }
  if (!writer) return kOk;
  std::string peft = std::string(outdir) + "/adapter";
  std::string gguf = std::string(outdir) + "/adapter.gguf";
  if ((st = qlft_trainer_save_adapter(s.trainer.get(), peft.c_str(), "peft")) != QLFT_OK)
    return fail(peft.c_str(), st);
  if ((st = qlft_trainer_save_adapter(s.trainer.get(), gguf.c_str(), "gguf")) != QLFT_OK)
    return fail(gguf.c_str(), st);
  std::printf("adapter: %s (PEFT), %s (llama.cpp)\n", peft.c_str(), gguf.c_str());
  qlft_memory_report mem{};
  mem.struct_size = sizeof mem;
  if (have_plan && qlft_trainer_memory_report(s.trainer.get(), &mem) == QLFT_OK) {
    print_memory_table(stdout, predicted, &mem);
    std::printf("process peak RSS %s\n", human_bytes(mem.process_peak_rss).c_str());
  }
  return kOk;
}

}  // namespace cli
