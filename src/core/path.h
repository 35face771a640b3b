// Questions about paths the loaders and planners ask before opening anything (a model given as
// a directory, a .gguf, a config.json...): one copy of each, POSIX stat underneath, no throwing.
#pragma once

#include <string>

namespace qlft {

bool is_dir(const std::string& p);       // an existing directory (links followed)
bool path_exists(const std::string& p);  // anything at p (links followed)
// The directory part: "." for a bare name, "/" for a name in the root.
std::string dirname_of(const std::string& p);
bool ends_with(const std::string& s, const char* suffix);

}  // namespace qlft
