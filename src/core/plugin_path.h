// Where the library looks for a plugin it opens with dlopen (the CUDA backend, the MPI
// communicator): one rule for all of them.
#pragma once

#include <string>

namespace qlft {

// $env_var when set and not empty (a path), else `file` in the directory of the binary that
// holds this code (libqlft.so, or the executable that links the static core), else the bare
// name (the dynamic loader's search path).
std::string plugin_path(const char* env_var, const char* file);

}  // namespace qlft
