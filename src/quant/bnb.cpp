// TEMPORARY: recognizes nothing; the quant work replaces this file.
#include "quant/bnb.h"

namespace qlft {

bool load_bnb_weight(MemoryTracker*, const SafetensorsSet&, const std::string&, int64_t, int64_t,
                     QWeight*) {
  return false;
}

}  // namespace qlft
