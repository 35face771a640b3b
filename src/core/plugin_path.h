// Where the library looks for a plugin it opens with dlopen (the CUDA backend, the MPI
// communicator): one rule for all of them.
#pragma once

#include <string>

namespace qlft {

// $env_var when set and not empty (a path), else `file` in the directory of the binary that
// holds this code (libqlft.so, or the executable that links the static core), else the bare
// name (the dynamic loader's search path).
std::string plugin_path(const char* env_var, const char* file);

// Opens the plugin library at path (RTLD_NOW, so a missing library or symbol is reported here and
// not at first use; RTLD_GLOBAL when global, else RTLD_LOCAL) and returns its entry symbol's
// address, or nullptr with *why naming the file and what failed. The library is never closed:
// what it makes may outlive any call.
void* plugin_entry(const std::string& path, const char* symbol, bool global, std::string* why);

}  // namespace qlft
