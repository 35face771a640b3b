// qlft_dataset and qlft_trainer: the training half of the C ABI.
#include <cmath>
#include <cstring>
#include <string>

#include "api/api_outputs.h"
#include "api/handles.h"
#include "config/config.h"
#include "core/error.h"
#include "core/log.h"
#include "data/dataset.h"
#include "data/model_template.h"
#include "data/tokenizer_encoder.h"
#include "train/adapter_io.h"
#include "train/trainer.h"
#include "core/threads.h"

using qlft::guard;

qlft_dataset::~qlft_dataset() = default;
qlft_trainer::~qlft_trainer() = default;

namespace {

using qlft::copy_out;

void fill_stats(const qlft_trainer* t, const qlft::StepReport& r, qlft_step_stats* s,
                double elapsed) {
  qlft_step_stats full{};
  full.struct_size = sizeof(full);
  full.step = static_cast<uint64_t>(r.step);
  full.total_steps = static_cast<uint64_t>(t->trainer->total_steps());
  full.loss = static_cast<float>(r.loss);
  full.learning_rate = static_cast<float>(r.lr);
  full.grad_norm = static_cast<float>(r.grad_norm);
  full.loss_scale = r.loss_scale;
  full.skipped = r.skipped ? 1 : 0;
  full.tokens = static_cast<uint64_t>(r.tokens);
  full.tokens_per_second = r.seconds > 0 ? r.tokens / r.seconds : 0;
  full.elapsed_seconds = elapsed;
  int64_t left = t->trainer->total_steps() - r.step;
  full.eta_seconds = r.step > 0 && left > 0 ? elapsed / r.step * left : 0;
  qlft::MemorySnapshot m = t->trainer->tracker()->snapshot();
  full.memory_reserved = m.total_reserved;
  full.memory_peak = m.total_peak;
  full.eval_loss = NAN;
  full.host_to_device_bytes = r.moved.host_to_device;
  full.device_to_host_bytes = r.moved.device_to_host;
  full.device_syncs = r.moved.syncs;
  full.device_launches = r.moved.launches;
  const qlft::PrefMetrics& p = r.pref;
  const qlft::Objective o = t->trainer->pref().objective;
  const bool pref = r.preference;
  full.rewards_chosen = pref ? p.rewards_chosen : NAN;
  full.rewards_rejected = pref ? p.rewards_rejected : NAN;
  full.rewards_margins = pref ? p.rewards_margins : NAN;
  full.rewards_accuracies = pref ? p.rewards_accuracies : NAN;
  full.logps_chosen = pref ? p.logps_chosen : NAN;
  full.logps_rejected = pref ? p.logps_rejected : NAN;
  // TRL logs nll_loss for ORPO and CPO / SimPO, kl for KTO (PrefMetrics holds 0 otherwise).
  full.nll_loss =
      pref && (o == qlft::Objective::Orpo || o == qlft::Objective::Simpo) ? p.nll_loss : NAN;
  full.kl = pref && o == qlft::Objective::Kto ? p.kl : NAN;
  copy_out(full, s);
}

// The trainer whose qlft_trainer_train is running its progress callback on this thread (the
// callback runs on the thread that called qlft_trainer_train). The step is complete then, so
// saving, evaluating, exporting, generating and the queries are fine (the CLI checkpoints from
// its callback), but calls that step or replace the state under the running loop (step, train,
// load_adapter, resume) are refused, and qlft_trainer_free is deferred to the loop's end.
struct InProgress {
  const qlft_trainer* trainer = nullptr;
  bool free_requested = false;
};
thread_local InProgress t_in_progress;

void refuse_reentry(const qlft_trainer* t, const char* fn) {
  if (t && t == t_in_progress.trainer)
    qlft::throw_error(QLFT_ERR_INVALID_ARGUMENT,
                      "%s: called from the trainer's own progress callback (inside "
                      "qlft_trainer_train), where the trainer may be saved, evaluated or "
                      "cancelled but not stepped, trained, loaded or resumed",
                      fn);
}

// The public stats of preference examples: records only.
qlft_dataset_stats pref_stats(const qlft::PrefSet& p) {
  qlft_dataset_stats f{};
  f.records = p.examples.size();
  f.dropped_records = p.dropped;
  f.train_sequences = p.examples.size();
  return f;
}

// Non-padding token slots over all slots of the packed or padded rows.
double fill_ratio(const qlft::data::DataStats& s) {
  const uint64_t slots = (s.train_rows + s.eval_rows) * static_cast<uint64_t>(s.seq_len);
  return slots ? (s.train_fill * s.train_rows + s.eval_fill * s.eval_rows) /
                     static_cast<double>(s.train_rows + s.eval_rows)
               : 0.0;
}

qlft_dataset_stats data_stats(const qlft::data::DataStats& s) {
  // Fixed-width buckets over [0, seq_len]; the last also takes longer records.
  const uint32_t width =
      s.seq_len > 0 ? (s.seq_len + QLFT_HISTOGRAM_BUCKETS - 1) / QLFT_HISTOGRAM_BUCKETS : 1;
  qlft_dataset_stats f{.struct_size = sizeof(qlft_dataset_stats),
                       .records = s.records_used,
                       .dropped_records = s.records_dropped,
                       .tokens = s.tokens,
                       .trained_tokens = s.trained_tokens,
                       .train_sequences = s.train_rows,
                       .eval_sequences = s.eval_rows,
                       .fill_ratio = fill_ratio(s),
                       .histogram_bucket_width = width,
                       .length_histogram = {}};
  for (const auto& b : s.length_histogram) {
    uint64_t idx = b.lo / width;
    if (idx >= QLFT_HISTOGRAM_BUCKETS) idx = QLFT_HISTOGRAM_BUCKETS - 1;
    f.length_histogram[idx] += b.count;
  }
  return f;
}

}  // namespace

extern "C" {

int32_t qlft_dataset_load(const qlft_model* model, const char* path, const qlft_config* config,
                          qlft_dataset** out) {
  return guard([&] {
    QLFT_CHECK_ARG(out, "qlft_dataset_load: out is NULL");
    *out = nullptr;
    QLFT_CHECK_ARG(model && path && *path, "qlft_dataset_load: model and path must be given");
    qlft::Config c = qlft::config_or_default(config);
    c.set("data.path", path);
    qlft::ThreadScope threads(model->runtime->threads);  // tokenizing runs on the runtime's threads
    auto d = std::make_unique<qlft_dataset>();
    d->model = model;
    d->path = path;
    d->encoder = std::make_unique<qlft::data::TokenizerEncoder>(
        model->need_tokenizer(), qlft::data::model_chat_template(*model->model));
    const qlft::RunSpec spec = qlft::parse_run_spec(c);
    if (spec.pref.objective != qlft::Objective::Sft)  // preference records
      d->pref = std::make_unique<qlft::PrefSet>(
          qlft::PrefSet::load(spec.data, spec.pref.objective, *d->encoder));
    else
      d->data =
          std::make_unique<qlft::data::Dataset>(qlft::data::Dataset::build(spec.data, *d->encoder));
    *out = d.release();
  });
}

void qlft_dataset_free(qlft_dataset* dataset) {
  delete dataset;
}

int32_t qlft_dataset_get_stats(const qlft_dataset* dataset, qlft_dataset_stats* out) {
  return guard([&] {
    QLFT_CHECK_ARG(dataset, "qlft_dataset_get_stats: dataset is NULL");
    QLFT_CHECK_STRUCT("qlft_dataset_get_stats", out, qlft_dataset_stats);
    copy_out(dataset->pref ? pref_stats(*dataset->pref) : data_stats(dataset->data->stats()), out);
  });
}

int32_t qlft_trainer_create(qlft_model* model, qlft_dataset* train_data, const qlft_config* config,
                            qlft_trainer** out) {
  return guard([&] {
    QLFT_CHECK_ARG(out, "qlft_trainer_create: out is NULL");
    *out = nullptr;
    QLFT_CHECK_ARG(model, "qlft_trainer_create: model is NULL");
    QLFT_CHECK_ARG(!train_data || train_data->model == model,
                   "qlft_trainer_create: the dataset was loaded for a different model");
    auto t = std::make_unique<qlft_trainer>();
    t->model = model;
    t->data = train_data;
    t->spec = qlft::parse_run_spec(qlft::config_or_default(config));
    qlft::ThreadScope threads(model->runtime->threads);
    QLFT_CHECK_ARG(
        !train_data || !train_data->pref == (t->spec.pref.objective == qlft::Objective::Sft),
        "qlft_trainer_create: the dataset was loaded for train.objective=%s, the trainer "
        "has train.objective=%s",
        train_data && train_data->pref ? "a preference objective" : "sft",
        qlft::name_of(t->spec.pref.objective));
    t->trainer = std::make_unique<qlft::Trainer>(
        *model->model, &model->runtime->tracker, train_data ? train_data->data.get() : nullptr,
        t->spec, train_data ? train_data->pref.get() : nullptr);
    *out = t.release();
  });
}

void qlft_trainer_free(qlft_trainer* trainer) {
  if (trainer && trainer == t_in_progress.trainer) {  // freed when qlft_trainer_train returns
    t_in_progress.free_requested = true;
    trainer->trainer->cancel();
    return;
  }
  delete trainer;
}

int32_t qlft_trainer_step(qlft_trainer* trainer, qlft_step_stats* out) {
  return guard([&] {
    QLFT_CHECK_ARG(trainer, "qlft_trainer_step: trainer is NULL");
    refuse_reentry(trainer, "qlft_trainer_step");
    QLFT_CHECK_ARG(trainer->data,
                   "qlft_trainer_step: the trainer has no training data (qlft_trainer_create "
                   "was given none; such a trainer evaluates, generates and exports)");
    qlft::ThreadScope threads(trainer->model->runtime->threads);
    trainer->trainer->clear_cancel();  // a cancel sent while idle does not outlive the idle time
    qlft::StepReport r;
    if (!trainer->trainer->step(&r))
      qlft::throw_error(QLFT_ERR_INVALID_ARGUMENT,
                        "qlft_trainer_step: training is complete (%lld steps)",
                        static_cast<long long>(trainer->trainer->steps_done()));
    trainer->last_launches = r.launches;
    if (out) fill_stats(trainer, r, out, r.seconds);
  });
}

int32_t qlft_trainer_step_launches(const qlft_trainer* trainer, char* buf, size_t buf_size,
                                   size_t* needed) {
  return guard([&] {
    QLFT_CHECK_ARG(trainer, "qlft_trainer_step_launches: trainer is NULL");
    std::string s = "{";
    for (const qlft::KernelLaunches& k : trainer->last_launches) {
      if (s.size() > 1) s += ", ";
      s += "\"";
      for (char ch : k.name)  // (C++ names hold no control characters; quotes escaped anyway)
        s += ch == '"' || ch == '\\' ? std::string("\\") + ch : std::string(1, ch);
      s += "\": " + std::to_string(k.count);
    }
    s += "}";
    if (needed) *needed = s.size() + 1;
    if (!buf && buf_size == 0) return;
    QLFT_CHECK_ARG(buf && buf_size > s.size(),
                   "qlft_trainer_step_launches: %zu bytes do not fit the buffer of %zu",
                   s.size() + 1, buf_size);
    std::memcpy(buf, s.c_str(), s.size() + 1);
  });
}

int32_t qlft_trainer_train(qlft_trainer* trainer, qlft_progress_fn progress, void* user_data) {
  return guard([&] {
    QLFT_CHECK_ARG(trainer, "qlft_trainer_train: trainer is NULL");
    refuse_reentry(trainer, "qlft_trainer_train");
    qlft::ThreadScope threads(trainer->model->runtime->threads);
    QLFT_CHECK_ARG(trainer->data,
                   "qlft_trainer_train: the trainer has no training data (qlft_trainer_create "
                   "was given none; such a trainer evaluates, generates and exports)");
    qlft::Trainer& t = *trainer->trainer;
    t.clear_cancel();  // only a cancel sent while this call runs stops it
    const qlft::TrainSettings& ts = t.settings();
    double elapsed = 0;
    qlft::StepReport r;
    while (!t.done()) {
      if (!t.step(&r)) break;
      elapsed += r.seconds;
      qlft_step_stats s{};
      s.struct_size = sizeof(s);
      trainer->last_launches = r.launches;
      fill_stats(trainer, r, &s, elapsed);
      if (ts.eval_every > 0 && r.step % ts.eval_every == 0 && trainer->data &&
          trainer->data->data && trainer->data->data->eval().rows() > 0)
        s.eval_loss = static_cast<float>(t.evaluate(*trainer->data->data).loss);
      if (ts.save_every > 0 && r.step % ts.save_every == 0)
        t.save_checkpoint(ts.output_dir + "/checkpoint.safetensors");
      if (progress) {
        InProgress saved = t_in_progress;
        t_in_progress = {trainer, false};
        int32_t stop = progress(&s, user_data);
        bool free_requested = t_in_progress.free_requested;
        t_in_progress = saved;
        if (free_requested) {  // qlft_trainer_free from the callback: free it now, on the way out
          delete trainer;
          qlft::throw_error(QLFT_ERR_CANCELLED,
                            "training stopped after step %lld: the progress callback freed the "
                            "trainer",
                            static_cast<long long>(r.step));
        }
        if (stop != 0) t.cancel();
      }
      if (t.cancel_requested()) {
        t.clear_cancel();
        qlft::throw_error(QLFT_ERR_CANCELLED, "training cancelled after step %lld",
                          static_cast<long long>(r.step));
      }
    }
  });
}

void qlft_trainer_cancel(qlft_trainer* trainer) {
  if (trainer && trainer->trainer) trainer->trainer->cancel();
}

int32_t qlft_trainer_evaluate(qlft_trainer* trainer, qlft_dataset* data, qlft_eval_result* out) {
  return guard([&] {
    QLFT_CHECK_ARG(trainer, "qlft_trainer_evaluate: trainer is NULL");
    QLFT_CHECK_STRUCT("qlft_trainer_evaluate", out, qlft_eval_result);
    qlft_dataset* d = data ? data : trainer->data;
    QLFT_CHECK_ARG(d, "qlft_trainer_evaluate: no dataset given and the trainer has none");
    QLFT_CHECK_ARG(d->data, "qlft_trainer_evaluate: preference data has no token-loss evaluation");
    qlft::ThreadScope threads(trainer->model->runtime->threads);
    bool eval_split = data == nullptr;
    if (eval_split)
      QLFT_CHECK_ARG(d->data->eval().rows() > 0,
                     "qlft_trainer_evaluate: the training data has no held-out split (set "
                     "data.eval_fraction > 0)");
    qlft::EvalReport e =
        trainer->trainer->evaluate(*d->data, eval_split || d->data->eval().rows() > 0);
    qlft_eval_result f{};
    f.struct_size = sizeof(f);
    f.loss = e.loss;
    f.perplexity = std::exp(e.loss);
    f.tokens = static_cast<uint64_t>(e.tokens);
    copy_out(f, out);
  });
}

int32_t qlft_trainer_save_adapter(qlft_trainer* trainer, const char* path, const char* format) {
  return guard([&] {
    QLFT_CHECK_ARG(trainer && path && *path,
                   "qlft_trainer_save_adapter: trainer and path must be given");
    qlft::ThreadScope threads(trainer->model->runtime->threads);
    std::string f = format ? format : "peft";
    QLFT_CHECK_ARG(f == "peft" || f == "gguf",
                   "qlft_trainer_save_adapter: format must be \"peft\" or \"gguf\", got '%s'",
                   f.c_str());
    qlft::check_trainer_output(*trainer, path, "qlft_trainer_save_adapter",
                               f == "peft" ? "adapter" : "adapter.gguf", f == "peft");
    // (a collective with dist.zero3_shard_adapter: Trainer::write_adapter)
    trainer->trainer->write_adapter([&](const qlft::LoraAdapter& lora) {
      if (f == "peft")
        qlft::save_peft_adapter(
            lora, path, trainer->model->model->path,
            qlft::BaseStorage{qlft::name_of(trainer->spec.quant.type),
                              trainer->spec.quant.double_quant, trainer->spec.quant.blocksize});
      else
        qlft::save_gguf_lora_adapter(lora, path);
    });
  });
}

int32_t qlft_trainer_load_adapter(qlft_trainer* trainer, const char* path) {
  return guard([&] {
    QLFT_CHECK_ARG(trainer && path && *path,
                   "qlft_trainer_load_adapter: trainer and path must be given");
    refuse_reentry(trainer, "qlft_trainer_load_adapter");
    qlft::ThreadScope threads(trainer->model->runtime->threads);
    trainer->trainer->load_adapter(
        [&](qlft::LoraAdapter& lora) { qlft::load_peft_adapter(lora, path); });
  });
}

int32_t qlft_trainer_save_checkpoint(qlft_trainer* trainer, const char* path) {
  return guard([&] {
    QLFT_CHECK_ARG(trainer && path && *path,
                   "qlft_trainer_save_checkpoint: trainer and path must be given");
    qlft::check_trainer_output(*trainer, path, "qlft_trainer_save_checkpoint",
                               "checkpoint.safetensors");
    qlft::ThreadScope threads(trainer->model->runtime->threads);
    trainer->trainer->save_checkpoint(path);
  });
}

int32_t qlft_trainer_resume(qlft_trainer* trainer, const char* path) {
  return guard([&] {
    QLFT_CHECK_ARG(trainer && path && *path, "qlft_trainer_resume: trainer and path must be given");
    refuse_reentry(trainer, "qlft_trainer_resume");
    qlft::ThreadScope threads(trainer->model->runtime->threads);
    trainer->trainer->resume(path);
  });
}

int32_t qlft_trainer_dist_info(const qlft_trainer* trainer, int32_t* rank, int32_t* world_size) {
  return guard([&] {
    QLFT_CHECK_ARG(trainer, "qlft_trainer_dist_info: trainer is NULL");
    if (rank) *rank = trainer->trainer->rank();
    if (world_size) *world_size = trainer->trainer->world();
  });
}

int32_t qlft_trainer_memory_report(const qlft_trainer* trainer, qlft_memory_report* out) {
  return guard([&] {
    QLFT_CHECK_ARG(trainer, "qlft_trainer_memory_report: trainer is NULL");
    qlft::memory_report(trainer->model->runtime, out, "qlft_trainer_memory_report");
  });
}

}  // extern "C"
