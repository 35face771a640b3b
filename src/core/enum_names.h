// An enum's spelling from a table of names in its declaration order: the one lookup behind
// every name_of / *_name function over a dense enum (run_spec.cpp, rope_type_name,
// quant_kind_name, key_type_name, gguf_type_name).
#pragma once

#include <cstddef>

namespace qlft {

// names[v]; "?" for a value past the table (a corrupt or newer value).
template <class E, size_t N>
const char* enum_name(const char* const (&names)[N], E v) {
  const size_t i = static_cast<size_t>(v);
  return i < N ? names[i] : "?";
}

}  // namespace qlft
