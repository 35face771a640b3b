// qlft_trainer_export_merged: the merged-model half of the export C API (adapter exports are in
// api_train.cpp).
#include "api/api_outputs.h"
#include "api/handles.h"
#include "core/error.h"
#include "train/merge_export.h"
#include "train/trainer.h"
#include "core/threads.h"

using qlft::guard;

int32_t qlft_trainer_export_merged(qlft_trainer* trainer, const char* path, const char* format) {
  return guard([&] {
    QLFT_CHECK_ARG(trainer && trainer->trainer && path && *path,
                   "qlft_trainer_export_merged: trainer and path must be given");
    QLFT_CHECK_ARG(format && *format,
                   "qlft_trainer_export_merged: format must be safetensors, gguf-f16 or gguf-bf16");
    // Nothing the trainer reads or its run owns is replaced: the file (GGUF) or the directory's
    // files (safetensors) the export writes.
    const std::string out = path;
    qlft::check_trainer_output(*trainer, out, "qlft_trainer_export_merged", nullptr);
    if (std::string(format) == "safetensors")
      for (const char* f : {"model.safetensors", "config.json"})
        qlft::check_trainer_output(*trainer, out + "/" + f, "qlft_trainer_export_merged", nullptr);
    qlft::ThreadScope threads(trainer->model->runtime->threads);
    qlft::export_merged(trainer->trainer->model(), &trainer->trainer->lora(), path, format);
  });
}
