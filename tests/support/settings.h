// Settings named as a user writes them ("nf4"), read through the settings parser
// (config/run_spec.h), for tests that loop over several values.
#pragma once

#include <string>

#include "config/config.h"
#include "config/run_spec.h"

namespace qlft_test {

// quant.type: "nf4", "int8" or "keep".
inline qlft::QuantType quant_type(const std::string& name) {
  qlft::Config c;
  c.set("quant.type", name);
  return qlft::parse_run_spec(c).quant.type;
}

}  // namespace qlft_test
