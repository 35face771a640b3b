#include "api/api_outputs.h"

#include "core/error.h"
#include "formats/output_guard.h"

namespace qlft {

void check_trainer_output(const qlft_trainer& t, const std::string& out, const char* writer,
                          const char* run_file, bool replaced_whole) {
  OutputGuard g;
  const Model& m = *t.model->model;
  g.add_input(m.path, "the model");
  if (!m.hf_dir.empty()) g.add_input(m.hf_dir, "the model's directory");
  if (t.data) g.add_input(t.data->path, "the training data");
  g.add_input(t.spec.data.path, "the training data (data.path)");
  g.add_input(t.spec.lora.init_from, "the adapter the trainer started from (lora.init_from)");
  g.add_run_dir(t.spec.train.output_dir, run_file);
  const std::string why = g.refusal(out, writer, replaced_whole);
  if (!why.empty()) throw_error(QLFT_ERR_INVALID_ARGUMENT, "%s", why.c_str());
}

}  // namespace qlft
