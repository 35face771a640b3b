// What a trainer's writers (adapter and checkpoint saves, merged exports) may not replace: the
// inputs it was made from and its run directory's other files. The rule itself:
// formats/output_guard.h.
#pragma once

#include <string>

#include "api/handles.h"

namespace qlft {

// Throws QLFT_ERR_INVALID_ARGUMENT when `out` would replace one of the trainer's inputs (the
// model's files, its training data, the adapter of lora.init_from) or a file of its run
// directory (train.output_dir) other than run_file, the one this writer exists to write
// (nullptr: none).
void check_trainer_output(const qlft_trainer& t, const std::string& out, const char* writer,
                          const char* run_file, bool replaced_whole = false);

}  // namespace qlft
