// qlft-finetune train --model M --data D [--config run.yaml] [--resume] [--setting value ...]
//
// Trains a LoRA adapter and writes, under train.output_dir (a locked unit, see run_dir.h):
// checkpoint.safetensors (every train.save_every steps, at the end and on Ctrl-C), metrics.jsonl
// (one record per step, checked writes; a resumed run rewrites the steps after its checkpoint),
// adapter/ (PEFT, replaced whole) and adapter.gguf (llama.cpp). Evaluates before and after
// training, prints both and logs both in metrics.jsonl (evaluation records), so the report shows
// them. A failed write stops the run keeping the last checkpoint; a diverged run exits 6
// (QLFT_ERR_NUMERICAL) keeping the last finite checkpoint.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cli.h"
#include "report_fields.h"
#include "../../src/formats/output_guard.h"
#include "run_dir.h"

namespace cli {

namespace {

std::atomic<qlft_trainer*> g_trainer{nullptr};

void on_sigint(int) {
  qlft_trainer* t = g_trainer.load();
  if (t) qlft_trainer_cancel(t);  // async-signal-safe by contract
}

struct Progress {
  qlft_trainer* trainer = nullptr;
  bool tty = false;
  bool quiet = false;  // a rank other than 0 of a distributed run: rank 0 reports
  bool distributed = false;
  // metrics.jsonl: opened at the first step, keeping the records before it (a resumed run
  // rewrites the steps after its checkpoint).
  std::string metrics_path;
  MetricsLog metrics;
  // Checkpoints every save_every steps, written here after the step's metrics record (so a
  // checkpoint never runs ahead of metrics.jsonl).
  std::string ckpt;
  int64_t save_every = 0;
  uint64_t last_saved = 0;  // step of the last checkpoint written (0: none this run)
  uint64_t steps = 0, skipped = 0, last_step = 0;
  std::string run_members;  // the first record's "run" object (report_fields.h)
  // The evaluation before training, logged as the first record (after the step it follows:
  // 0, or the checkpoint's step on --resume) when the first step's record is written.
  qlft_eval_result eval_before{};
  bool have_eval_before = false;
  // The last step that evaluated (train.eval_every) and its loss: the evaluation after
  // training is not repeated for it.
  uint64_t last_eval_step = 0;
  double last_eval_loss = NAN;
  bool last_loss_finite = true;
  // Set when a write failed: the run stops and says so.
  std::string failure;
  int32_t failure_status = QLFT_OK;
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

// A preference objective's step: the library filled the preference fields (older libraries
// lack them) and the step logged them (NaN on sft steps).
bool has_preference(const qlft_step_stats* s) {
  return s->struct_size >= offsetof(qlft_step_stats, kl) + sizeof(s->kl) &&
         !std::isnan(s->logps_chosen + s->logps_rejected);
}

// The step line's preference part: the reward margin and the share of pairs it ranks right
// (KTO logs no accuracy).
std::string pref_line(const qlft_step_stats* s) {
  char b[96];
  if (std::isnan(s->rewards_accuracies))
    std::snprintf(b, sizeof b, " margin %.4f", s->rewards_margins);
  else
    std::snprintf(b, sizeof b, " margin %.4f acc %.2f", s->rewards_margins, s->rewards_accuracies);
  return b;
}

// One metrics.jsonl record. JSON has no NaN or infinity: such a value is null and the record
// says "nonfinite": true.
std::string metrics_record(const qlft_step_stats* s, const std::string& report_fields) {
  const bool nonfinite = !std::isfinite(s->loss) || !std::isfinite(s->grad_norm) ||
                         !std::isfinite(s->learning_rate) ||
                         (!std::isnan(s->eval_loss) && !std::isfinite(s->eval_loss));
  char head[64];
  std::snprintf(head, sizeof head, "{\"step\": %llu", static_cast<unsigned long long>(s->step));
  std::string r = head;
  r += ", \"loss\": " + json_number(s->loss, "%.6f");
  r += ", \"lr\": " + json_number(s->learning_rate, "%.6g");
  r += ", \"grad_norm\": " + json_number(s->grad_norm, "%.6g");
  r += ", \"loss_scale\": " + json_number(s->loss_scale, "%g");
  char rest[256];
  std::snprintf(rest, sizeof rest,
                ", \"skipped\": %u, \"tokens\": %llu, \"tokens_per_s\": %.1f, \"elapsed_s\": "
                "%.3f, \"memory_bytes\": %llu, \"memory_peak_bytes\": %llu",
                s->skipped, static_cast<unsigned long long>(s->tokens), s->tokens_per_second,
                s->elapsed_seconds, static_cast<unsigned long long>(s->memory_reserved),
                static_cast<unsigned long long>(s->memory_peak));
  r += rest;
  if (!std::isnan(s->eval_loss)) r += ", \"eval_loss\": " + json_number(s->eval_loss, "%.6f");
  // Device backends: the step's host<->device traffic (older libraries leave the fields out).
  if (s->struct_size >= offsetof(qlft_step_stats, device_syncs) + sizeof(s->device_syncs) &&
      s->host_to_device_bytes + s->device_to_host_bytes + s->device_syncs > 0) {
    std::snprintf(rest, sizeof rest,
                  ", \"h2d_bytes\": %llu, \"d2h_bytes\": %llu, \"device_syncs\": %llu",
                  static_cast<unsigned long long>(s->host_to_device_bytes),
                  static_cast<unsigned long long>(s->device_to_host_bytes),
                  static_cast<unsigned long long>(s->device_syncs));
    r += rest;
  }
  // The step's device launches (kernels and cuBLASLt matmuls, cuda/src/launch_count.h).
  if (s->struct_size >= offsetof(qlft_step_stats, device_launches) + sizeof(s->device_launches) &&
      s->device_launches > 0)
    r += ", \"launches\": " + std::to_string(s->device_launches);
  // Preference objectives: TRL's logged values under its names ("rewards/chosen" ->
  // "rewards_chosen"); a value the objective does not log (NaN) is left out.
  if (has_preference(s)) {
    const std::pair<const char*, double> pref[] = {{"rewards_chosen", s->rewards_chosen},
                                                   {"rewards_rejected", s->rewards_rejected},
                                                   {"rewards_margins", s->rewards_margins},
                                                   {"rewards_accuracies", s->rewards_accuracies},
                                                   {"logps_chosen", s->logps_chosen},
                                                   {"logps_rejected", s->logps_rejected},
                                                   {"nll_loss", s->nll_loss},
                                                   {"kl", s->kl}};
    for (const auto& [key, v] : pref)
      if (!std::isnan(v)) r += std::string(", \"") + key + "\": " + json_number(v, "%.17g");
  }
  if (nonfinite) r += ", \"nonfinite\": true";
  r += report_fields;
  r += "}";
  return r;
}

// An evaluation made outside a step: the held-out loss with the weights after `step`
// (metrics_series.h: a record with "eval_loss" and no "loss").
std::string eval_record(uint64_t step, const qlft_eval_result& e) {
  return "{\"step\": " + std::to_string(step) + ", \"eval_loss\": " + json_number(e.loss, "%.6f") +
         ", \"eval_tokens\": " + std::to_string(e.tokens) + "}";
}

int32_t on_progress(const qlft_step_stats* s, void* user) {
  Progress* p = static_cast<Progress*>(user);
  ++p->steps;
  p->skipped += s->skipped ? 1 : 0;
  p->last_step = s->step;
  bool metrics_ok = true;
  if (!p->quiet) {
    std::string err;
    if (!p->metrics.is_open() &&
        (!p->metrics.open(p->metrics_path, s->step, &err) ||
         (p->have_eval_before &&
          !p->metrics.append(eval_record(s->step - 1, p->eval_before), &err)))) {
      metrics_ok = false;
    } else if (!p->metrics.append(
                   metrics_record(s, report_step_fields(p->trainer, s, &p->run_members)), &err)) {
      metrics_ok = false;
    }
    if (!metrics_ok) {
      p->failure = err;
      p->failure_status = QLFT_ERR_IO;
    }
  }
  // A step whose loss is not finite has diverged: its state is not checkpointed (the last
  // good checkpoint stays; every rank sees the same loss, so they skip the collective alike).
  p->last_loss_finite = std::isfinite(s->loss);
  if (!std::isnan(s->eval_loss)) p->last_eval_step = s->step, p->last_eval_loss = s->eval_loss;
  if (p->save_every > 0 && s->step % static_cast<uint64_t>(p->save_every) == 0 &&
      p->last_loss_finite &&
      (metrics_ok || p->distributed)) {  // (the save is collective: every rank joins it)
    int32_t st = qlft_trainer_save_checkpoint(p->trainer, p->ckpt.c_str());
    if (st == QLFT_OK) {
      p->last_saved = s->step;
    } else if (p->failure.empty()) {
      p->failure = std::string(p->ckpt) + ": " + qlft_last_error();
      p->failure_status = st;
    }
  }
  if (!p->failure.empty()) return 1;  // stop after this step
  if (p->quiet) return 0;
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
    if (has_preference(s)) std::fprintf(stderr, "%s", pref_line(s).c_str());
    if (!std::isnan(s->eval_loss)) std::fprintf(stderr, "\n  eval loss %.4f\n", s->eval_loss);
  } else {
    std::fprintf(stderr, "step %llu/%llu loss %.4f%s lr %.3g grad_norm %.3g tok/s %.0f mem %s%s\n",
                 static_cast<unsigned long long>(s->step),
                 static_cast<unsigned long long>(s->total_steps), s->loss,
                 has_preference(s) ? pref_line(s).c_str() : "", s->learning_rate, s->grad_norm,
                 s->tokens_per_second, human_bytes(s->memory_reserved).c_str(),
                 s->skipped ? " (skipped: non-finite gradients)" : "");
    if (!std::isnan(s->eval_loss)) std::fprintf(stderr, "eval loss %.4f\n", s->eval_loss);
  }
  return 0;
}

// The rank this process will have in a distributed run, from the launcher's environment (the
// trainer confirms it later): only rank 0 owns the run directory.
int launcher_rank(const qlft_run_settings& rs) {
  if (!rs.distributed) return 0;
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK"})
    if (const char* r = std::getenv(v)) return std::atoi(r);
  return 0;
}

// A run whose planned peak is over memory.limit is refused before the model loads, with the
// planner's figures per category (per rank under a launcher: ZeRO-3 across more ranks may fit).
// train.micro_batch=auto picks what fits instead; a model the planner cannot read is left to
// the load to report.
int refuse_over_limit(const std::string& model, qlft_config* cfg, const qlft_run_settings& rs) {
  if (rs.memory_limit == 0 || rs.micro_batch_auto) return kOk;
  qlft_memory_estimate e{};
  e.struct_size = sizeof e;
  if (qlft_estimate_memory(nullptr, model.c_str(), cfg, &e) != QLFT_OK) return kOk;
  // The planner's own judgement against memory.limit (the host's bytes, or the device's with
  // backend=cuda): the largest micro-batch that fits.
  if (e.micro_batch <= e.max_micro_batch) return kOk;
  const uint64_t need = e.device_train_peak ? e.device_train_peak : e.total_peak;
  std::fprintf(stderr,
               "qlft-finetune: %s: the memory planner predicts a peak of %s%s%s (loading %s, "
               "training step %s) for micro-batch %u, over memory.limit %s; nothing was "
               "loaded:\n",
               model.c_str(), human_bytes(need).c_str(),
               e.device_train_peak ? " of device memory" : "", rs.distributed ? " per rank" : "",
               human_bytes(e.load_peak).c_str(), human_bytes(e.train_peak).c_str(), e.micro_batch,
               setting(cfg, "memory.limit").c_str());
  print_memory_table(stderr, e, nullptr);
  std::fprintf(stderr,
               "lower train.micro_batch or data.seq_len, set train.micro_batch=auto, enable "
               "train.grad_checkpointing, offload, shard across ranks (mpirun -np N ... "
               "--dist.backend mpi --dist.zero_stage 3), or raise memory.limit "
               "(QLFT_ERR_OUT_OF_MEMORY)\n");
  return exit_code_for(QLFT_ERR_OUT_OF_MEMORY);
}

}  // namespace

int cmd_train(int argc, char** argv) {
  Args a;
  std::string err;
  if (!parse_args(argc, argv, 2, {"model", "data", "config"}, {"resume", "overwrite", "help"}, &a,
                  &err) ||
      a.flags.count("help") || !a.flags.count("model") || !a.flags.count("data")) {
    if (!err.empty()) std::fprintf(stderr, "qlft-finetune: %s\n", err.c_str());
    std::fprintf(stderr,
                 "usage: qlft-finetune train --model MODEL --data FILE [--config run.yaml] "
                 "[--resume | --overwrite] [--key value ...]\n");
    return a.flags.count("help") && err.empty() ? kOk : kUsage;
  }
  const bool resume = a.flags.count("resume") != 0;
  int code = kOk;
  ConfigPtr cfg = make_config(a, &code);
  if (!cfg) return code;
  qlft_run_settings rs;
  if (int32_t st = run_settings(cfg.get(), &rs)) return fail("settings", st);

  // The run directory is made ready (created, locked, writable, no run of another kind in it)
  // before the model loads, so a bad train.output_dir costs seconds, not a whole run.
  const std::string outdir = setting(cfg.get(), "train.output_dir");
  const std::string data = a.flags["data"];
  if (same_file(data, outdir)) {  // a data directory is read without its subdirectories
    std::fprintf(stderr,
                 "qlft-finetune: --data %s is train.output_dir: the run's own files "
                 "(metrics.jsonl) would be read as data; choose another train.output_dir\n",
                 data.c_str());
    return kUsage;
  }
  // Nothing the run writes (or --overwrite deletes) may be an input: metrics.jsonl is rewritten in
  // place, so a hard link to the data would be truncated (formats/output_guard.h).
  {
    qlft::OutputGuard guard;
    guard.add_input(a.flags["model"], "the --model");
    guard.add_input(data, "the --data");
    guard.add_input(setting(cfg.get(), "lora.init_from"), "the adapter of lora.init_from");
    for (const char* f : {kMetricsFile, kCheckpointFile, kAdapterGguf, kAdapterDir}) {
      const std::string why = guard.refusal(outdir + "/" + f, "train", f == kAdapterDir);
      if (!why.empty()) {
        std::fprintf(stderr, "qlft-finetune: %s\n", why.c_str());
        return kUsage;
      }
    }
  }
  RunDir run;
  if (launcher_rank(rs) == 0) {
    RunDirOptions ro;
    ro.resume = resume;
    ro.overwrite = a.flags.count("overwrite") != 0;
    if (!run.open(outdir, ro, &err)) {
      std::fprintf(stderr, "qlft-finetune: %s\n", err.c_str());
      return run.refused() ? kUsage : kIo;
    }
    for (const std::string& r : run.removed())
      std::fprintf(stderr, "removed %s (left by a run that died)\n", r.c_str());
  }
  const std::string ckpt = outdir + "/" + kCheckpointFile;
  // Checkpoints every train.save_every steps are written by on_progress, after the step's
  // metrics record; the library's own periodic save is turned off.
  const int64_t save_every = rs.save_every;
  qlft_config_set(cfg.get(), "train.save_every", "0");

  if (int rc = refuse_over_limit(a.flags["model"], cfg.get(), rs)) return rc;
  TrainSession s;
  if (int rc = open_session(a, cfg.get(), &s, /*need_data=*/true)) return rc;

  qlft_model_details md{};
  md.struct_size = sizeof md;
  const long long seq_len = rs.seq_len;
  if (qlft_model_info(s.model.get(), &md) == QLFT_OK && md.context_length > 0 &&
      seq_len > static_cast<long long>(md.context_length))
    std::fprintf(stderr,
                 "warning: data.seq_len %lld is longer than the model's context (%llu tokens): "
                 "positions past it were never trained\n",
                 seq_len, static_cast<unsigned long long>(md.context_length));

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

  if (resume) {
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
  p.trainer = s.trainer.get();
  p.tty = ::isatty(STDERR_FILENO);
  p.quiet = !writer;
  p.distributed = world > 1;
  p.metrics_path = outdir + "/" + kMetricsFile;
  p.ckpt = ckpt;
  p.save_every = save_every;
  p.run_members = report_run_members(cfg.get(), s.model.get(), s.data.get(), a.flags["model"],
                                     have_plan ? &predicted : nullptr);
  p.eval_before = before;
  p.have_eval_before = have_eval;
  if (writer)
    std::fprintf(stderr, "report: `qlft-finetune report %s [--watch 10]` draws it while training\n",
                 outdir.c_str());

  g_trainer.store(s.trainer.get());
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  // A closed terminal or ssh session (SIGHUP) stops the run like Ctrl-C and kill: a checkpoint,
  // exit 130. Its stderr may be gone by then: from here on a write to it fails (EPIPE) instead
  // of killing the run before its checkpoint.
  struct sigaction old_int {
  }, old_term{}, old_hup{};
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  sigaction(SIGHUP, &sa, &old_hup);
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  sigaction(SIGPIPE, &ign, nullptr);
  int32_t st = qlft_trainer_train(s.trainer.get(), on_progress, &p);
  const std::string train_error = st != QLFT_OK ? qlft_last_error() : "";
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGHUP, &old_hup, nullptr);
  g_trainer.store(nullptr);
  if (p.tty && writer) std::fprintf(stderr, "\n");
  // The evaluation after training (of a run that finished and did not diverge), logged before
  // the report is drawn. Every rank evaluates (under ZeRO-3 evaluation gathers weights, a
  // collective). A last step that evaluated (train.eval_every) already logged it.
  const bool diverged = p.steps > 0 && (p.skipped == p.steps || !p.last_loss_finite);
  qlft_eval_result after{};
  after.struct_size = sizeof after;
  bool have_after = false;
  if (have_eval && st == QLFT_OK && p.failure.empty() && !diverged) {
    if (p.steps > 0 && p.last_eval_step == p.last_step && std::isfinite(p.last_eval_loss)) {
      after.loss = p.last_eval_loss;
      after.perplexity = std::exp(after.loss);
      have_after = true;
    } else {
      have_after = qlft_trainer_evaluate(s.trainer.get(), nullptr, &after) == QLFT_OK;
      std::string werr;
      if (have_after && writer && p.metrics.is_open() &&
          !p.metrics.append(eval_record(p.last_step, after), &werr))
        std::fprintf(stderr, "warning: the evaluation after training is not in %s: %s\n",
                     p.metrics_path.c_str(), werr.c_str());
    }
  }
  p.metrics.close();
  if (writer && p.steps)  // the training report, of a cancelled or stopped run too
    write_run_report(outdir, !p.failure.empty()         ? "stopped"
                             : st == QLFT_OK            ? "finished"
                             : st == QLFT_ERR_CANCELLED ? "cancelled"
                                                        : "stopped");

  auto kept = [&]() -> std::string {
    if (p.last_saved) return "the checkpoint of step " + std::to_string(p.last_saved) + " is kept";
    if (file_exists(ckpt)) return "the checkpoint written before this run stopped is kept";
    return "no checkpoint was written";
  };
  // A write that failed (disk full, I/O error) stopped the run: nothing more is written.
  if (!p.failure.empty()) {
    std::fprintf(stderr,
                 "qlft-finetune: stopped after step %llu: %s\n  %s in %s; free space or fix the "
                 "cause and continue with --resume\n",
                 static_cast<unsigned long long>(p.last_step), p.failure.c_str(), kept().c_str(),
                 outdir.c_str());
    return exit_code_for(p.failure_status);
  }
  if (st == QLFT_ERR_NUMERICAL) {
    std::fprintf(stderr, "qlft-finetune: training: %s (%s)\n  %s\n", train_error.c_str(),
                 qlft_status_string(st), kept().c_str());
    return kNumerical;
  }
  if (st != QLFT_OK && st != QLFT_ERR_CANCELLED) {
    std::fprintf(stderr, "qlft-finetune: training: %s (%s)\n", train_error.c_str(),
                 qlft_status_string(st));
    return exit_code_for(st);
  }
  // A run that learned nothing (every step skipped) or ended diverged (the last step's loss is
  // not finite) is a failure, not a result: no checkpoint or adapter of it is written.
  if (diverged) {
    std::fprintf(stderr,
                 "qlft-finetune: training diverged: %s (train.on_nonfinite=skip skipped %llu of "
                 "%llu steps); lower optim.lr or use train.precision=bf16 (%s)\n  %s\n",
                 p.skipped == p.steps ? "every step had non-finite gradients"
                                      : "the last step's loss is not finite",
                 static_cast<unsigned long long>(p.skipped),
                 static_cast<unsigned long long>(p.steps), qlft_status_string(QLFT_ERR_NUMERICAL),
                 kept().c_str());
    return kNumerical;
  }
  // A checkpoint at the end and on cancel, so --resume continues from here. A diverged adapter
  // is refused (QLFT_ERR_NUMERICAL) and the last finite checkpoint stays.
  int32_t cst = qlft_trainer_save_checkpoint(s.trainer.get(), ckpt.c_str());
  if (cst == QLFT_ERR_NUMERICAL) {
    std::fprintf(stderr, "qlft-finetune: %s (%s)\n  %s\n", qlft_last_error(),
                 qlft_status_string(cst), kept().c_str());
    return kNumerical;
  }
  if (cst != QLFT_OK) return fail(ckpt.c_str(), cst);
  if (st == QLFT_ERR_CANCELLED) {
    if (writer)
      std::fprintf(stderr, "cancelled; checkpoint written to %s (continue with --resume)\n",
                   ckpt.c_str());
    return kCancelled;
  }
  if (have_after && writer)
    std::printf("eval loss after:  %.4f (perplexity %.2f)\n", after.loss, after.perplexity);
  // A sharded adapter (dist.zero3_shard_adapter) is gathered for the write: every rank calls
  // it and rank 0 writes.
  const bool sharded = world > 1 && rs.zero3_shard_adapter;
  if (!writer && !sharded) return kOk;
  std::string peft = outdir + "/" + kAdapterDir;
  std::string gguf = outdir + "/" + kAdapterGguf;
  if ((st = qlft_trainer_save_adapter(s.trainer.get(), peft.c_str(), "peft")) != QLFT_OK)
    return fail(peft.c_str(), st);
  // An adapter llama.cpp cannot take (DoRA: no magnitude in its format) is said, not an error:
  // the PEFT adapter and a merged export carry it.
  st = qlft_trainer_save_adapter(s.trainer.get(), gguf.c_str(), "gguf");
  const bool gguf_ok = st == QLFT_OK;
  if (!gguf_ok && st != QLFT_ERR_UNSUPPORTED) return fail(gguf.c_str(), st);
  if (!writer) return kOk;
  if (gguf_ok)
    std::printf("adapter: %s (PEFT), %s (llama.cpp)\n", peft.c_str(), gguf.c_str());
  else
    std::printf("adapter: %s (PEFT); no llama.cpp adapter: %s\n", peft.c_str(), qlft_last_error());
  qlft_memory_report mem{};
  mem.struct_size = sizeof mem;
  if (have_plan && qlft_trainer_memory_report(s.trainer.get(), &mem) == QLFT_OK) {
    print_memory_table(stdout, predicted, &mem);
    std::printf("process peak RSS %s\n", human_bytes(mem.process_peak_rss).c_str());
  }
  return kOk;
}

}  // namespace cli
