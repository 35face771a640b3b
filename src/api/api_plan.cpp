// The memory planner and the trainer's batch shape through the C ABI.
#include <algorithm>

#include "api/handles.h"
#include "config/run_spec.h"
#include "core/error.h"
#include "core/communicator.h"
#include "train/planner.h"
#include "train/trainer.h"
#include "core/threads.h"

using qlft::guard;

extern "C" {

int32_t qlft_estimate_memory(const qlft_model* model, const char* model_path,
                             const qlft_config* config, qlft_memory_estimate* out) {
  return guard([&] {
    QLFT_CHECK_ARG(out && out->struct_size >= sizeof(uint32_t),
                   "qlft_estimate_memory: out is NULL or out->struct_size is not set (use "
                   "sizeof(qlft_memory_estimate))");
    const bool has_path = model_path && *model_path;
    QLFT_CHECK_ARG((model != nullptr) != has_path,
                   "qlft_estimate_memory: give exactly one of model and model_path");
    const qlft::RunSpec spec = qlft::parse_run_spec(qlft::config_or_default(config));
    // A loaded model plans for its runtime's threads (per-thread scratch); a file for the
    // config's.
    qlft::ThreadScope threads(model ? model->runtime->threads : 0);
    qlft::ModelConfig mc;
    qlft::WeightFootprint w;
    if (model) {
      // (From the file when a trainer streams the model's weights.)
      mc = model->model->cfg;
      w = qlft::weight_footprint_for_plan(*model->model, spec.quant);
    } else {
      w = qlft::weight_footprint_of_file(model_path, qlft::load_options(spec.quant), &mc);
    }
    // train.offload_checkpoints=auto: on where the step would not fit memory.limit without it.
    const qlft::PlanSettings ps = qlft::plan_offload_checkpoints(
        mc, w, qlft::PlanSettings::from_spec(spec), spec.memory.limit);
    // A loaded model is this process's own run: under a launcher, this rank's share (what its
    // tracker will measure). A model file: the rank that needs the most.
    int rank = -1;
    if (model && ps.world > 1) rank = qlft::dist::detect_launch().rank;
    const qlft::MemoryPlan p = rank >= 0 && rank < ps.world
                                   ? qlft::plan_memory_of_rank(mc, w, ps, rank)
                                   : qlft::plan_memory(mc, w, ps);
    qlft_memory_estimate f{};
    f.struct_size = sizeof(f);
    for (int i = 0; i < QLFT_MEM_CATEGORY_COUNT; ++i) {
      f.peak[i] = p.peak[i];
      f.train[i] = p.train[i];
    }
    f.train_peak = p.train_peak;
    f.load_peak = p.load_peak;
    f.total_peak = p.total_peak;
    for (int i = 0; i < QLFT_MEM_CATEGORY_COUNT; ++i) f.device_train[i] = p.device_train[i];
    f.device_train_peak = p.device_train_peak;
    f.micro_batch = static_cast<uint32_t>(ps.micro_batch);
    f.offload_checkpoints = ps.offload_checkpoints && ps.checkpoint_every > 0 ? 1 : 0;
    f.text_model_only = mc.image_text ? 1 : 0;
    // What the OS sees beside the categories: measured now, in this process.
    const uint64_t rss = qlft::process_rss();
    uint64_t counted = 0;
    if (model) {
      const qlft::MemorySnapshot m = model->runtime->tracker.snapshot();
      counted = m.total_reserved - m.device_total;
    }
    f.process_base = rss > counted ? rss - counted : 0;
    const uint64_t host_peak = p.total_peak - std::min(p.total_peak, p.device_train_peak);
    f.process_peak_rss = f.process_base + host_peak + (p.device ? 0 : qlft::kCpuFirstStepUntracked);
    const uint64_t limit = spec.memory.limit;
    if (limit) {
      // (searched with the settings as given: auto chooses offload per length)
      const qlft::PlanSettings given = qlft::PlanSettings::from_spec(spec);
      f.max_micro_batch =
          static_cast<uint32_t>(qlft::plan_max_micro_batch(mc, w, given, limit, 65536));
      f.max_seq_len = static_cast<uint32_t>(qlft::plan_max_seq_len(mc, w, given, limit, 1 << 22));
    }
    qlft::copy_out(f, out);
  });
}

int32_t qlft_trainer_batch_shape(const qlft_trainer* trainer, uint32_t* micro_batch,
                                 uint32_t* accumulation) {
  return guard([&] {
    QLFT_CHECK_ARG(trainer && micro_batch && accumulation,
                   "qlft_trainer_batch_shape: trainer, micro_batch and accumulation must be given");
    const qlft::TrainSettings& ts = trainer->trainer->settings();
    *micro_batch = static_cast<uint32_t>(ts.micro_batch);
    *accumulation = static_cast<uint32_t>(ts.accumulation);
  });
}

}  // extern "C"
