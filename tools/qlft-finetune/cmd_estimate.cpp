// qlft-finetune estimate --model M [--world N] [--config run.yaml] [--key value ...]
//
// Predicts the memory a training run will hold, per category, without loading the weights
// (qlft_estimate_memory on the model file: GGUF header or config.json + safetensors headers).
// With several ranks (dist.backend under mpirun, or --world N) it is the memory of the rank that
// needs the most (ZeRO shards the optimizer state and, at stage 3, the base weights).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cli.h"

namespace cli {

// The predicted-vs-measured table shared with train (measured may be NULL: prediction only).
void print_memory_table(FILE* f, const qlft_memory_estimate& e, const qlft_memory_report* m) {
  if (m)
    std::fprintf(f, "%-14s %12s %12s\n", "memory", "predicted", "measured");
  else
    std::fprintf(f, "%-14s %12s\n", "memory", "predicted");
  for (int c = 0; c < QLFT_MEM_CATEGORY_COUNT; ++c) {
    if (c == QLFT_MEM_COMMUNICATION && e.peak[c] == 0 && (!m || m->peak[c] == 0)) continue;
    if (m)
      std::fprintf(f, "%-14s %12s %12s\n", qlft_memory_category_name(c),
                   human_bytes(e.peak[c]).c_str(), human_bytes(m->peak[c]).c_str());
    else
      std::fprintf(f, "%-14s %12s\n", qlft_memory_category_name(c), human_bytes(e.peak[c]).c_str());
  }
  if (m)
    std::fprintf(f, "%-14s %12s %12s\n", "total peak", human_bytes(e.total_peak).c_str(),
                 human_bytes(m->total_peak).c_str());
  else
    std::fprintf(f, "%-14s %12s\n", "total peak", human_bytes(e.total_peak).c_str());
  // The process beside the categories (library pages, tokenizer, MPI, allocator slack) and the
  // resident set it gives: predicted from what this process held untracked when it planned;
  // measured as the OS's peak, less the tracked peak for the untracked row.
  const uint64_t untracked = e.process_peak_rss - std::min(e.process_peak_rss, e.total_peak);
  if (m && m->process_peak_rss) {
    // (backend=cuda: the tracked peak holds device bytes too, so this row is then too low.)
    const uint64_t rss = m->process_peak_rss;
    std::fprintf(f, "%-14s %12s %12s\n", "untracked", human_bytes(untracked).c_str(),
                 human_bytes(rss - std::min(rss, m->total_peak)).c_str());
    std::fprintf(f, "%-14s %12s %12s\n", "peak RSS", human_bytes(e.process_peak_rss).c_str(),
                 human_bytes(m->process_peak_rss).c_str());
  } else if (!m) {
    std::fprintf(f, "%-14s %12s  (this process now + the first step's: a lower bound)\n",
                 "untracked", human_bytes(untracked).c_str());
    std::fprintf(f, "%-14s %12s\n", "peak RSS", human_bytes(e.process_peak_rss).c_str());
  }
}

int cmd_estimate(int argc, char** argv) {
  Args a;
  std::string err;
  if (!parse_args(argc, argv, 2, {"model", "config", "world"}, {"help"}, &a, &err) ||
      a.flags.count("help") || !a.flags.count("model")) {
    if (!err.empty()) std::fprintf(stderr, "qlft-finetune: %s\n", err.c_str());
    std::fprintf(stderr,
                 "usage: qlft-finetune estimate --model MODEL [--world N] [--config run.yaml] "
                 "[--key value ...]\n  predicts per-category memory of training (train.precision, "
                 "train.grad_checkpointing, data.seq_len, train.micro_batch, optim.name, lora.*, "
                 "quant.*, dist.zero_stage, offload.*, memory.limit) without loading the weights; "
                 "--world N: for one of N ranks (as under mpirun with dist.backend=mpi; the rank "
                 "that needs the most)\n");
    return a.flags.count("help") && err.empty() ? kOk : kUsage;
  }
  int code = kOk;
  ConfigPtr cfg = make_config(a, &code);
  if (!cfg) return code;
  qlft_run_settings rs;
  if (int32_t st = run_settings(cfg.get(), &rs)) return fail("settings", st);
  if (a.flags.count("world")) {
    // The planner reads the world from the launcher's environment, as a training rank would.
    const std::string w = a.flags["world"];
    char* end = nullptr;
    const long n = std::strtol(w.c_str(), &end, 10);
    if (w.empty() || *end || n < 1 || n > 1 << 20) {
      std::fprintf(stderr, "qlft-finetune: --world wants a positive rank count, got '%s'\n",
                   w.c_str());
      return kUsage;
    }
    if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE")) {
      std::fprintf(stderr, "qlft-finetune: --world: already started by mpirun (its world wins)\n");
      return kUsage;
    }
    ::setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
    ::setenv("RANK", "0", 1);
    if (!rs.distributed && n > 1) {
      qlft_config_set(cfg.get(), "dist.backend", "mpi");
      run_settings(cfg.get(), &rs);
    }
  }
  const std::string model = a.flags["model"];
  qlft_memory_estimate e{};
  e.struct_size = sizeof e;
  int32_t st = qlft_estimate_memory(nullptr, model.c_str(), cfg.get(), &e);
  if (st != QLFT_OK) return fail(model.c_str(), st);
  const qlft_config* c = cfg.get();
  std::printf(
      "%s: precision %s, seq_len %s, micro_batch %u (accumulation %s), "
      "grad_checkpointing %s, optim %s, lora r %s on %s, quant %s\n",
      model.c_str(), setting(c, "train.precision").c_str(), setting(c, "data.seq_len").c_str(),
      e.micro_batch, setting(c, "train.accumulation").c_str(),
      setting(c, "train.grad_checkpointing").c_str(), setting(c, "optim.name").c_str(),
      setting(c, "lora.r").c_str(), setting(c, "lora.target_modules").c_str(),
      setting(c, "quant.type").c_str());
  if (rs.distributed)
    std::printf(
        "per rank (dist.zero_stage %s, offload.params %s, offload.optimizer %s; the rank "
        "that needs the most)\n",
        setting(c, "dist.zero_stage").c_str(), setting(c, "offload.params").c_str(),
        setting(c, "offload.optimizer").c_str());
  if (e.text_model_only)
    std::printf(
        "the text model of an image-text checkpoint: its vision tower and projector are "
        "not loaded or counted\n");
  print_memory_table(stdout, e, nullptr);
  const std::string offload = setting(c, "train.offload_checkpoints");
  if (e.offload_checkpoints)
    std::printf(
        "checkpointed layer inputs in pinned host memory (train.offload_checkpoints %s%s)\n",
        offload.c_str(), offload == "auto" ? ": the step exceeds memory.limit without" : "");
  std::printf("%-14s %12s\n%-14s %12s\n", "training step", human_bytes(e.train_peak).c_str(),
              "loading", human_bytes(e.load_peak).c_str());
  if (e.device_train_peak) {
    // backend=cuda: the device's share of the training step (what memory.limit budgets there).
    std::printf("%-14s %12s\n", "device memory", "predicted");
    for (int k = 0; k < QLFT_MEM_CATEGORY_COUNT; ++k)
      if (e.device_train[k])
        std::printf("%-14s %12s\n", qlft_memory_category_name(k),
                    human_bytes(e.device_train[k]).c_str());
    std::printf("%-14s %12s\n%-14s %12s\n", "device step", human_bytes(e.device_train_peak).c_str(),
                "host step", human_bytes(e.train_peak - e.device_train_peak).c_str());
  }
  if (e.max_micro_batch)
    std::printf("largest micro-batch within memory.limit %s%s: %u\n",
                setting(c, "memory.limit").c_str(), e.device_train_peak ? " (device)" : "",
                e.max_micro_batch);
  else if (rs.memory_limit != 0)
    std::printf("not even micro-batch 1 fits memory.limit %s\n",
                setting(c, "memory.limit").c_str());
  if (e.max_seq_len) {
    // The host memory that context needs: the same plan at that length (the last use of cfg).
    const std::string limit = setting(c, "memory.limit");
    qlft_config_set(cfg.get(), "data.seq_len", std::to_string(e.max_seq_len).c_str());
    qlft_config_set(cfg.get(), "train.micro_batch", "1");
    qlft_memory_estimate at{};
    at.struct_size = sizeof at;
    st = qlft_estimate_memory(nullptr, model.c_str(), cfg.get(), &at);
    if (st != QLFT_OK) return fail(model.c_str(), st);
    std::printf(
        "largest context within memory.limit %s%s at micro-batch 1: %u tokens, "
        "needing %s of host memory (peak RSS)%s\n",
        limit.c_str(), at.device_train_peak ? " (device)" : "", e.max_seq_len,
        human_bytes(at.process_peak_rss).c_str(),
        at.offload_checkpoints ? ", checkpointed layer inputs offloaded to it" : "");
  }
  return kOk;
}

}  // namespace cli
