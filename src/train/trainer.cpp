#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backend/backend_select.h"
#include "backend/cuda_plugin.h"
#include "train/device_adamw.h"
#include "backend/dropout.h"
#include "core/error.h"
#include "core/log.h"
#include "core/profile.h"
#include "parallel/data_parallel.h"
#include "parallel/nvme_state_store.h"
#include "parallel/zero3_stream.h"
#include "formats/atomic_file.h"
#include "model/lora_extras.h"
#include "model/lora_loftq.h"
#include "optim/grad_clip.h"
#include "train/adapter_io.h"
#include "train/planner.h"
#include "train/token_batch.h"

namespace qlft {

namespace {

// train.offload_checkpoints=auto on a device backend with checkpointed layers: on exactly where
// the planner puts the step past the device budget without it (memory.limit; with none, the
// device's memory to be had now), at the configured micro-batch (1 when auto).
bool auto_offload_checkpoints(const Model& model, const RunSpec& spec, const Backend& backend,
                              MemoryTracker* tracker) {
  if (!spec.train.offload_checkpoints_auto || !backend.device_memory()) return false;
  uint64_t budget = spec.memory.limit;
  if (budget == 0)  // what this trainer can still have: free + the cache's blocks
    budget = cuda_plugin::get("train.offload_checkpoints=auto").device_available(tracker);
  return plan_offload_checkpoints(model.cfg, weight_footprint_for_plan(model, spec.quant),
                                  PlanSettings::from_spec(spec), budget)
      .offload_checkpoints;
}

// The MoE load-balancing loss's weight (LlamaRunner::set_moe_aux_loss) as moe.aux_loss and
// moe.aux_loss_coef resolve for this model: auto follows its output_router_logits and
// router_aux_loss_coef. 0: off.
float moe_aux_coef(const ModelConfig& c, const RunSpec& spec) {
  const TrainSpec& t = spec.train;
  const bool on = t.moe_aux_loss < 0 ? c.moe.n_experts > 0 && c.moe.aux_loss : t.moe_aux_loss > 0;
  if (!on) return 0.f;
  QLFT_CHECK_ARG(c.moe.n_experts > 0, "moe.aux_loss=on: the model (%s) has no mixture of experts",
                 c.arch.c_str());
  QLFT_CHECK_ARG(spec.pref.objective == Objective::Sft,
                 "moe.aux_loss: the MoE load-balancing loss is not implemented for "
                 "train.objective other than sft; set moe.aux_loss=off");
  const double coef = t.moe_aux_coef >= 0 ? t.moe_aux_coef : c.moe.aux_coef;
  QLFT_CHECK_ARG(coef > 0,
                 "moe.aux_loss is on but the load-balancing loss's weight is %g: the model file "
                 "states no router_aux_loss_coef; set moe.aux_loss_coef",
                 coef);
  return static_cast<float>(coef);
}

// Where the optimizer state lives (offload.optimizer, offload.dir, offload.buffers): nvme
// streams it through a file (parallel/nvme_state_store.h); otherwise host memory, or
// paged_adamw8bit's paged files in offload.dir.
StateStoreFactory state_stores(const OffloadSpec& o) {
  if (o.optimizer != OffloadTarget::Nvme) return host_or_paged_state_stores(o.dir);
  return [o](MemoryTracker* tracker, bool) {
    return make_nvme_state_store(tracker, o.dir, o.buffers);
  };
}

// Where a step's non-finite value first appeared: each micro-batch is rerun layer by layer
// (LlamaRunner::locate_nonfinite) until one shows it. Never throws: a failure to diagnose is
// reported in the text instead of replacing the numerical error.
template <class SeedFn>
std::string locate_nonfinite(LlamaRunner& runner, const std::vector<data::Batch>& batches,
                             float grad_scale, SeedFn seed) {
  try {
    for (size_t i = 0; i < batches.size(); ++i) {
      const data::Batch& b = batches[i];
      if (b.trained_tokens == 0) continue;
      TokenBatch tb = token_batch(b);
      std::string where = runner.locate_nonfinite(tb, grad_scale, seed(static_cast<int>(i)));
      if (!where.empty())
        return batches.size() > 1 ? strf("%s, micro-batch %zu", where.c_str(), i) : where;
    }
    return "not reproduced when the step was rerun layer by layer";
  } catch (const std::exception& e) {
    return strf("could not be located (%s)", e.what());
  }
}

}  // namespace

TrainSettings TrainSettings::from_spec(const RunSpec& s) {
  TrainSettings t;
  t.micro_batch_auto = s.train.micro_batch.is_auto;
  t.micro_batch = s.train.micro_batch.n;
  t.effective_batch = s.train.effective_batch;
  t.accumulation = s.train.accumulation;
  t.max_steps = s.train.max_steps;
  t.precision = s.backend.precision;
  t.checkpoint_every_layers = s.train.grad_checkpointing;
  t.offload_checkpoints = s.train.offload_checkpoints;
  t.eval_every = s.train.eval_every;
  t.save_every = s.train.save_every;
  t.output_dir = s.train.output_dir;
  t.seed = s.train.seed;
  t.stop_on_nonfinite = s.train.stop_on_nonfinite;
  t.max_nonfinite_in_row = s.train.max_nonfinite;
  return t;
}

Trainer::Trainer(const Model& model, MemoryTracker* tracker, const data::Dataset* train,
                 const RunSpec& spec, const PrefSet* pref_data)
    : model_(model),
      tracker_(tracker),
      host_cache_(tracker),
      train_(train),
      ts_(TrainSettings::from_spec(spec)),
      pref_(spec.pref),
      pref_set_(pref_data),
      pref_epochs_(spec.data.epochs) {
  if (const char* p = std::getenv("QLFT_PROFILE"); p && *p) {
    profile_path_ = p;
    prof::set_enabled(true);
  }
  // train.precision reaches the kernels through the backend it is made with.
  backend_ = make_backend(spec.backend, tracker);
  init_pref_ref(spec);
  LoraConfig lc = lora_config_from(spec.lora);
  const std::string& init_from = spec.lora.init_from;
  if (!init_from.empty()) {
    LoraConfig file = read_peft_config(init_from);
    file.init_seed = lc.init_seed;
    lc = file;
  }
  // Its gradients come once the ZeRO partition is known (init_grads): ZeRO-2 keeps only this
  // rank's share.
  // A sharded adapter (dist.zero3_shard_adapter on several launched ranks) gets its values once
  // the partition is known, only this rank's (Trainer::shard_adapter); unless lora.init_from
  // loads them all first.
  const bool later_values =
      spec.dist.shard_adapter && init_from.empty() && dist::detect_launch().world > 1;
  lora_ = std::make_unique<LoraAdapter>(tracker, model.shapes, lc, /*gradients=*/false,
                                        /*values=*/!later_values);
  if (!init_from.empty()) load_peft_adapter(*lora_, init_from);
  // DoRA and a PiSSA / OLoRA start run around the kernels on host memory, one rank, resident
  // weights (model/lora_extras.h; the runner refuses a device backend or streamed weights).
  const bool start = spec.lora.init == LoraInit::Pissa || spec.lora.init == LoraInit::Olora;
  if (lc.use_dora || start)
    QLFT_CHECK_ARG(dist::detect_launch().world == 1, "%s runs on one rank; this launch has %d",
                   lc.use_dora ? "lora.use_dora" : "lora.init=pissa/olora",
                   dist::detect_launch().world);
  if (lc.use_dora && init_from.empty()) dora_init_magnitude(*lora_, model);  // PEFT's dora_init
  if (spec.lora.init != LoraInit::Default) {
    const char* name = spec.lora.init == LoraInit::Loftq ? "loftq" : start ? "pissa/olora" : "";
    QLFT_CHECK_ARG(init_from.empty() && !later_values,
                   "lora.init=%s makes the adapter's values itself: it goes with neither "
                   "lora.init_from nor a sharded adapter (dist.zero3_shard_adapter)",
                   name);
    if (lora_->has_moe())  // (their SVD / QR starts cover the projections' slots only)
      throw_error(QLFT_ERR_UNSUPPORTED,
                  "lora.init=%s with LoRA on %s's experts / router (lora.target_modules w1 / w2 / "
                  "w3 / gate) is not supported; use lora.init=default there",
                  name, model.cfg.arch.c_str());
    QLFT_CHECK_ARG(!(start && lc.use_dora),
                   "lora.init=%s with lora.use_dora is not supported (the magnitude would be "
                   "measured on the residual base)",
                   spec.lora.init == LoraInit::Pissa ? "pissa" : "olora");
  }
  if (spec.lora.init == LoraInit::Loftq) loftq_init(*lora_, model, tracker);
  if (start) start_from_base(*lora_, model, spec.lora.init);
  // ZeRO-3, NVMe and device offload stream the base weights: this trainer's own model
  // (train/weight_placement.h), never the shared one. ZeRO-3 converts a copy of the weights;
  // the offloads only read the host bytes, so theirs is a skeleton over the shared model's.
  {
    const OffloadTarget params = spec.offload.params;
    const bool offload = params == OffloadTarget::Nvme ||
                         (params == OffloadTarget::Cpu && backend_->device_memory());
    const WeightUse use = spec.dist.zero_stage == 3 ? WeightUse::Convert
                          : offload                 ? WeightUse::Read
                                                    : WeightUse::Shared;
    placement_ = std::make_unique<WeightPlacement>(model, tracker, use);
  }
  runner_ = std::make_unique<LlamaRunner>(placement_->model(), *backend_, lora_.get());
  runner_->set_activation_dtype(activation_dtype(ts_.precision));
  if (ts_.checkpoint_every_layers > 0)
    for (int l = 0; l < model.cfg.n_layers; ++l)
      runner_->set_checkpoint(l, l % ts_.checkpoint_every_layers == 0);
  runner_->set_mlp_tile_rows(mlp_tile_rows_of(model.shapes, spec.train.mlp_tile_rows));
  runner_->set_moe_aux_loss(moe_aux_coef(model.cfg, spec));
  if (spec.train.offload_checkpoints_auto)
    ts_.offload_checkpoints = auto_offload_checkpoints(model, spec, *backend_, tracker);
  if (ts_.offload_checkpoints && spec.train.offload_checkpoints_auto)
    QLFT_LOG_I(
        "train.offload_checkpoints=auto: on (the step exceeds the device budget without it)");
  runner_->set_offload_checkpoints(ts_.offload_checkpoints);

  std::vector<ParamRef> params;
  for (int l = 0; l < lora_->n_layers(); ++l)
    for (int p = 0; p < kProjCount; ++p) {
      LoraSlot& s = lora_->slot(l, static_cast<Proj>(p));
      if (!s.active()) continue;
      std::string base = "lora." + std::to_string(l) + "." + proj_peft_name(static_cast<Proj>(p));
      if (!s.shares_a) {  // a fused module's A (and its summed dA) once, in its first part
        params.push_back({base + ".A", s.A.as<float>(), nullptr, s.a_bytes() / 4});
        param_slots_.push_back({l, static_cast<Proj>(p), false});
      }
      params.push_back({base + ".B", s.B.as<float>(), nullptr, s.b_bytes() / 4,
                        spec.optim.loraplus_lr_ratio});  // LoRA+
      param_slots_.push_back({l, static_cast<Proj>(p), true});
      if (!s.M.empty()) {  // DoRA: LoRA+ puts 1-D parameters in B's group (PEFT)
        params.push_back({base + ".magnitude", s.M.as<float>(), nullptr, s.m_bytes() / 4,
                          spec.optim.loraplus_lr_ratio});
        param_slots_.push_back({l, static_cast<Proj>(p), false, true});
      }
    }
  // The MoE layers' expert / router LoRA, after the projections' (LoraAdapter::params' order).
  for (int l = 0; l < lora_->n_layers(); ++l)
    for (int p = 0; p < kMoePartCount; ++p) {
      if (!lora_->moe_active(l, MoePart(p))) continue;
      const MoeLoraSlot& s = static_cast<const LoraAdapter&>(*lora_).moe_slot(l, MoePart(p));
      const std::string base = "lora." + std::to_string(l) + "." + moe_part_name(MoePart(p));
      params.push_back(
          {base + ".A", const_cast<float*>(s.A.as<float>()), nullptr, size_t(s.a_n())});
      param_slots_.push_back({l, Proj::Q, false, false, p});
      params.push_back({base + ".B", const_cast<float*>(s.B.as<float>()), nullptr, size_t(s.b_n()),
                        spec.optim.loraplus_lr_ratio});
      param_slots_.push_back({l, Proj::Q, true, false, p});
    }
  const OptimSettings& os = spec.optim;
  init_dist(spec, std::move(params));
  init_grads(spec);
  init_offload(spec);
  try {  // a constructor that throws runs no destructor: give streamed weights back here
    // A device backend with AdamW, on one rank or on several over NCCL, or with (paged) 8-bit
    // AdamW on one rank, keeps the adapter, its gradients and the optimizer state in device (or
    // managed) memory (a step moves only the batch and a few scalars; NCCL exchanges gradients
    // and updated tensors between the devices). Otherwise the optimizer steps on the host, the
    // adapter copied in and its gradients out per pass.
    const bool device_exchange = world() == 1 || dp_->device_comm().device_buffers();
    const bool state_on_host = spec.offload.optimizer != OffloadTarget::None;
    // 8-bit AdamW (its state in device or managed memory) steps on the device on one rank.
    const bool device_8bit = world() == 1 && (os.kind == OptimizerKind::AdamW8bit ||
                                              os.kind == OptimizerKind::PagedAdamW8bit);
    if (backend_->device_memory() && device_exchange &&
        (os.kind == OptimizerKind::AdamW || device_8bit) && !state_on_host) {
      runner_->keep_lora_on_device();
      const int64_t n = runner_->lora_device_count();
      float* w = runner_->lora_device_weights();
      float* g = runner_->lora_device_grads();
      if (n > 0 && device_8bit) {
        opt_ = make_device_adamw8bit(os, dp_->owned_params(), *backend_, w, g, n);
      } else if (n > 0 && world() == 1) {  // (it writes the bf16 copy of A / B too)
        opt_ = make_device_adamw(os, dp_->owned_params(), *backend_, w, g, n,
                                 runner_->lora_device_weights16());
        device_writes16_ = runner_->lora_device_weights16() != nullptr;
      } else if (n > 0) {
        dp_->attach_device(*backend_, w, g, n);
        const int64_t b = dp_->owned_begin();
        opt_ =
            make_device_adamw(os, dp_->owned_params(), *backend_, w + b, g + b, dp_->owned_count());
      }
    }
    device_step_ = opt_ != nullptr;
    if (device_step_) runner_->lora_device_written(false);  // (ranks' weights made equal)
    if (!opt_) opt_ = make_optimizer(os, dp_->owned_params(), tracker, state_stores(spec.offload));
    // train.micro_batch=auto / train.effective_batch: trial steps (or the cache) set the batch
    // shape before the data batches are made; the trainer is left as if none had run.
    if (ts_.micro_batch_auto || ts_.effective_batch > 0) {
      RunSpec resolved = spec;  // the planner's start with offload as the runner does it
      resolved.train.offload_checkpoints = ts_.offload_checkpoints;
      resolved.train.offload_checkpoints_auto = false;
      plan_batch_shape(resolved);
    }

    if (train_) {
      it_ = std::make_unique<data::BatchIterator>(train_->train_batches(ts_.micro_batch));
      int64_t per_step = static_cast<int64_t>(ts_.micro_batch) * ts_.accumulation * world();
      int64_t data_steps = static_cast<int64_t>((it_->total_rows() + per_step - 1) / per_step);
      total_steps_ = ts_.max_steps > 0 ? ts_.max_steps : data_steps;
    } else if (pref_set_) {  // a step takes micro_batch x accumulation examples
      const uint64_t per = uint64_t(ts_.micro_batch) * uint64_t(ts_.accumulation);
      const uint64_t n = pref_set_->examples.size() * uint64_t(pref_epochs_);
      total_steps_ = ts_.max_steps > 0 ? ts_.max_steps : static_cast<int64_t>((n + per - 1) / per);
    } else {
      total_steps_ = ts_.max_steps;
    }
    sched_ = std::make_unique<LrSchedule>(spec.sched, os.lr, total_steps_ > 0 ? total_steps_ : 1);
    scaler_ = std::make_unique<LossScaler>(spec.scaler);
  } catch (...) {
    end_offload();
    throw;
  }
}

Trainer::~Trainer() {
  end_offload();
  write_profile();
}

void Trainer::write_profile() const noexcept {
  if (profile_path_.empty()) return;
  // Several ranks in one job each write their own file.
  const std::string path =
      world() > 1 ? profile_path_ + ".rank" + std::to_string(rank()) : profile_path_;
  try {
    write_file_atomic(path,
                      "# qlft host op profile: wall time of the steps after this trainer's "
                      "first (" +
                          std::to_string(steps_run_ > 0 ? steps_run_ - 1 : 0) + " steps)\n" +
                          prof::format_table(prof::snapshot()));
    QLFT_LOG_I("op profile written to %s", path.c_str());
  } catch (const std::exception& e) {
    QLFT_LOG_W("QLFT_PROFILE: the op profile was not written: %s", e.what());
  }
}

void Trainer::set_batch_shape(int micro_batch, int accumulation) {
  QLFT_CHECK_ARG(micro_batch >= 1 && accumulation >= 1,
                 "micro_batch %d and accumulation %d must be positive", micro_batch, accumulation);
  QLFT_CHECK_ARG(!it_ && step_ == 0, "the batch shape can only be set before training starts");
  ts_.micro_batch = micro_batch;
  ts_.accumulation = accumulation;
}

bool Trainer::done() const {
  if (pref_set_) return pref_done();
  if (!it_) return true;
  if (ts_.max_steps > 0 && step_ >= ts_.max_steps) return true;
  // With max_steps the data cycles (epochs repeat); otherwise it ends with the data.
  return ts_.max_steps == 0 && it_->position() >= it_->total_rows();
}

std::vector<GradSpan> Trainer::grad_spans() {
  return dp_->grad_spans();  // every gradient, or this rank's ZeRO-2 share
}

uint64_t Trainer::dropout_seed(int64_t step, int micro) const {
  return mix64(ts_.seed ^ mix64(static_cast<uint64_t>(step) * 1315423911ull + micro + 1));
}

bool Trainer::step(StepReport* out) {
  if (pref_.objective != Objective::Sft) return step_preference(out);
  QLFT_CHECK_ARG(it_, "this trainer has no training data");
  if (done()) return false;
  // Every rank stops at the same step boundary when any of them was cancelled.
  const bool cancel =
      world() > 1 ? dp_->begin_collective(dist::DataParallel::Collective::Step, cancel_requested())
                  : cancel_requested();
  if (cancel) throw_error(QLFT_ERR_CANCELLED, "training was cancelled");
  const uint64_t start_pos = it_->position();
  try {
    // Gather the step's micro-batches first: the loss is a mean over all their trained tokens.
    std::vector<data::Batch> batches;
    if (next_global_batches(batches) == 0) return false;
    step_on(batches, out);
  } catch (...) {
    it_->seek(start_pos);  // the same micro-batches next time
    throw;
  }
  return true;
}

void Trainer::step_on(const std::vector<data::Batch>& batches, StepReport* out) {
  // With several ranks, one may have no micro-batch of the last global batch: it still joins
  // the collectives.
  QLFT_CHECK_ARG(!batches.empty() || world() > 1, "step_on: no micro-batches");
  // QLFT_PROFILE leaves out the first step (page faults, oneDNN's JIT, first-touch caches).
  if (steps_run_++ == 1 && !profile_path_.empty()) prof::reset();
  QLFT_PROFILE_SCOPE("step");
  auto t0 = std::chrono::steady_clock::now();
  const TransferCounts moved0 = backend_->transfers();
  const std::vector<KernelLaunches> launches0 = backend_->launch_counts();
  StepReport r;
  std::string nonfinite_where;  // set when this step ends training (train.on_nonfinite=stop)
  try {
    runner_->zero_lora_grads();  // the previous step's gradients stay readable until here
    int64_t n = 0;
    int passes = 0;  // forward/backward passes this rank runs
    for (const data::Batch& b : batches) {
      n += b.trained_tokens;
      passes += b.trained_tokens > 0;
    }
    n = dp_->global_sum(n);  // every rank scales by the global token count
    // ZeRO-3: a rank with fewer passes than another joins its weight gathers after its own.
    const int replays = dp_->missing_passes(passes);
    const bool fp16 = ts_.precision == Precision::FP16;
    const float scale = fp16 ? scaler_->scale() : 1.0f;
    double loss_sum = 0;
    for (size_t i = 0; i < batches.size(); ++i) {
      // (Several ranks agree on cancelling at step boundaries only, in step().)
      if (cancel_requested() && world() == 1)
        throw_error(QLFT_ERR_CANCELLED, "training was cancelled");
      const data::Batch& b = batches[i];
      r.tokens += static_cast<int64_t>(b.rows) * b.seq_len;
      if (b.trained_tokens == 0) continue;
      if (pref_batches_) {  // step_pref: the objective's passes (the scale: a mean of means)
        tracker_->set_phase("forward");
        pref_seen_.push_back(preference_forward_backward(*runner_, pref_, (*pref_batches_)[i],
                                                         scale / static_cast<float>(passes),
                                                         dropout_seed(step_, static_cast<int>(i))));
        continue;
      }
      TokenBatch tb = token_batch(b);
      std::vector<uint8_t> real;  // the MoE load-balancing loss weighs the rows holding data
      if (b.rows < b.micro_batch && runner_->moe_aux_loss_coef() > 0.f) {
        real.assign(size_t(b.micro_batch) * size_t(b.seq_len), 0);
        std::fill_n(real.begin(), size_t(b.rows) * size_t(b.seq_len), uint8_t(1));
        tb.attention_mask = real.data();
      }
      tracker_->set_phase("forward");
      {
        QLFT_PROFILE_SCOPE("forward");
        LossResult lr =
            runner_->forward(tb, scale / static_cast<float>(n),
                             // the global micro-batch index: the same masks at any world size
                             dropout_seed(step_, static_cast<int>(i) * world() + rank()));
        loss_sum += lr.loss_sum;
      }
      tracker_->set_phase("backward");
      QLFT_PROFILE_SCOPE("backward");
      runner_->backward();
    }
    dp_->replay_passes(replays, backend_->cross_entropy_walks());
    runner_->release();
    tracker_->set_phase("optimizer");
    QLFT_PROFILE_SCOPE("optimizer");
    dp_->reduce_gradients();
    loss_sum = dp_->global_sum(loss_sum);
    r.tokens = dp_->global_sum(r.tokens);
    r.trained_tokens = n;
    r.loss = n ? loss_sum / static_cast<double>(n) : 0.0;
    r.loss_scale = scale;
    bool found_inf = false;
    ClipResult clip{};
    if (device_step_ && dp_->on_device()) {  // several ranks over NCCL
      int64_t ng = 0;
      float* g = dp_->device_grads(&ng);
      if (fp16) found_inf = dp_->any(device_unscale_and_check(*backend_, g, ng, scaler_->scale()));
      if (!found_inf) clip = dp_->device_clip(opt_->settings().max_grad_norm);
    } else if (device_step_) {  // one rank: nothing to agree on
      float* g = runner_->lora_device_grads();
      const int64_t ng = runner_->lora_device_count();
      if (fp16) found_inf = device_unscale_and_check(*backend_, g, ng, scaler_->scale());
      if (!found_inf)
        clip = device_clip_grad_norm(*backend_, g, ng, opt_->settings().max_grad_norm);
    } else {
      std::vector<GradSpan> grads = grad_spans();
      if (fp16) found_inf = dp_->any(scaler_->unscale_and_check(grads));
      if (!found_inf) clip = dp_->clip(grads, opt_->settings().max_grad_norm);
    }
    r.grad_norm = found_inf ? INFINITY : clip.norm;
    r.lr = sched_->current_lr();
    if (found_inf || !clip.finite || n == 0) {
      r.skipped = true;
      ++nonfinite_in_row_;
      if (ts_.stop_on_nonfinite && nonfinite_in_row_ >= ts_.max_nonfinite_in_row)
        nonfinite_where =
            n == 0 ? "no trained tokens in the step (every target is masked)"
            // Its reruns stop where each rank finds the value: ZeRO-3 gathers would not match.
            : world() > 1 && (dp_->zero3_stream() || dp_->grad_shards())
                ? strf("not located (dist.zero_stage=%d with several ranks; rerun on one rank)",
                       dp_->zero_stage())
                : locate_nonfinite(*runner_, batches, scale / static_cast<float>(n),
                                   [&](int i) { return dropout_seed(step_, i); });
    } else {
      opt_->step(r.lr);
      dp_->gather_params();  // ZeRO 1-2: every rank gets the tensors others updated
      // The device copy of A / B changed: its bf16 copy with it where one device AdamW wrote
      // both, else the next forward converts it (LlamaRunner::lora_device_weights16).
      if (device_step_) runner_->lora_device_written(device_writes16_);
      nonfinite_in_row_ = 0;
    }
    if (fp16) scaler_->update(found_inf || !clip.finite);
    sched_->advance();
    ++step_;
    tracker_->set_phase("setup");
  } catch (...) {
    // Leave the trainer as before the step: no partial gradients, activations freed.
    runner_->zero_lora_grads();
    runner_->release();
    tracker_->set_phase("setup");
    throw;
  }
  r.step = step_;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const TransferCounts moved1 = backend_->transfers();
  r.moved.host_to_device = moved1.host_to_device - moved0.host_to_device;
  r.moved.device_to_host = moved1.device_to_host - moved0.device_to_host;
  r.moved.syncs = moved1.syncs - moved0.syncs;
  r.moved.launches = moved1.launches - moved0.launches;
  r.launches = launches_since(launches0, backend_->launch_counts());
  if (out) *out = r;
  if (r.skipped && ts_.stop_on_nonfinite && nonfinite_in_row_ >= ts_.max_nonfinite_in_row)
    throw_error(QLFT_ERR_NUMERICAL,
                "%lld steps in a row had non-finite gradients (last at step %lld, loss %g); "
                "first non-finite value: %s; lower optim.lr or use train.precision=bf16",
                static_cast<long long>(nonfinite_in_row_), static_cast<long long>(step_), r.loss,
                nonfinite_where.c_str());
}

EvalReport Trainer::evaluate(const data::Dataset& d, bool eval_split) {
  data::BatchIterator it = eval_split
                               ? d.eval_batches(ts_.micro_batch)
                               : data::BatchIterator(d.train(), ts_.micro_batch, 1, 0, false, 0);
  EvalReport e;
  double sum = 0;
  data::Batch b;
  // ZeRO-3 over several ranks: this rank reads the base weights from the model's file
  // (Zero3Stream::rank_local), it does not gather them, so evaluation needs no peer: rank 0
  // alone may call it (a progress callback, the C API), or every rank. The stream of the
  // trainer's own model is swapped for the evaluation. Over a device communicator every rank must
  // call (the gathers). With a sharded adapter (dist.zero3_shard_adapter) the other ranks' LoRA
  // tensors exist only on them: evaluation gathers them as training does, so every rank must call
  // it.
  std::shared_ptr<WeightStream> local;
  if (dp_ && world() > 1 && dp_->zero3_stream() && !adapter_sharded())
    local = dp_->zero3_stream()->rank_local();
  if (adapter_sharded()) dp_->begin_collective(dist::DataParallel::Collective::Evaluate);
  struct Swap {
    Model* m;
    std::shared_ptr<WeightStream> saved;
    ~Swap() {
      if (saved) m->stream = std::move(saved);
    }
  } swap{nullptr, nullptr};
  if (local) {  // ZeRO-3: the trainer's own model (train/weight_placement.h)
    swap.m = &placement_->own();
    swap.saved = swap.m->stream;
    swap.m->stream = local;
  }
  tracker_->set_phase("evaluation");
  try {
    while (it.next(b)) {
      if (b.trained_tokens == 0) continue;
      LossResult lr = runner_->eval_loss(token_batch(b));
      sum += lr.loss_sum;
      e.tokens += lr.count;
    }
  } catch (const Error& err) {
    runner_->release();
    tracker_->set_phase("setup");
    if (err.status() == QLFT_ERR_DISTRIBUTED && adapter_sharded())
      throw_error(err.status(),
                  "evaluation with dist.zero3_shard_adapter gathers the LoRA tensors from every "
                  "rank, so every rank must call it: %s",
                  err.what());
    throw;
  } catch (...) {
    runner_->release();
    tracker_->set_phase("setup");
    throw;
  }
  runner_->release();
  tracker_->set_phase("setup");
  e.loss = e.tokens ? sum / static_cast<double>(e.tokens) : NAN;
  return e;
}

}  // namespace qlft
