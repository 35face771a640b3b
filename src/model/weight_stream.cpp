// The defaults of WeightStream's row-sharded embedding and head: a stream that keeps them whole
// in its units never has the runner call these.
#include "model/weight_stream.h"

#include "core/error.h"

namespace qlft {

void WeightStream::lookup_rows(const int32_t*, int64_t, float*) {
  throw_error(QLFT_ERR_INTERNAL, "%s keeps no row-sharded embedding", describe().c_str());
}

void WeightStream::each_head_slice(const std::function<void(const QWeight&, int64_t)>&) {
  throw_error(QLFT_ERR_INTERNAL, "%s keeps no row-sharded head", describe().c_str());
}

}  // namespace qlft
