// The defaults of WeightStream's row-sharded embedding and head: a stream that keeps them whole
// in its units never has the runner call these.
#include "model/weight_stream.h"

#include "core/error.h"
#include "model/model.h"

namespace qlft {

void WeightStream::lookup_rows(const int32_t*, int64_t, float*) {
  throw_error(QLFT_ERR_INTERNAL, "%s keeps no row-sharded embedding", describe().c_str());
}

void WeightStream::each_head_slice(const std::function<void(const QWeight&, int64_t)>&) {
  throw_error(QLFT_ERR_INTERNAL, "%s keeps no row-sharded head", describe().c_str());
}

void check_one_unit_acquire(const char* who, int u, size_t units, int held) {
  QLFT_CHECK_ARG(u >= 0 && u < static_cast<int>(units), "%s: unit %d does not exist (%zu units)",
                 who, u, units);
  if (held != kNoUnit && held != u)
    throw_error(QLFT_ERR_INTERNAL, "%s: unit %d acquired while unit %d is still held", who, u,
                held);
}

std::vector<const Buffer*> weight_bytes_in(const Model& host, const Model& model,
                                           const char* what) {
  std::vector<std::pair<int, const Buffer*>> from;
  for_each_weight_buffer(host, [&](int g, const Buffer& b) { from.emplace_back(g, &b); });
  std::vector<const Buffer*> out;
  bool paired = true;
  for_each_weight_buffer(model, [&](int g, const Buffer& b) {
    const size_t i = out.size();
    paired = paired && i < from.size() && from[i].first == g && (&host == &model || b.empty());
    out.push_back(i < from.size() ? from[i].second : nullptr);
  });
  if (!paired || out.size() != from.size())
    throw_error(QLFT_ERR_INTERNAL, "%s: %s does not have the weight slots of %s", what,
                model.path.c_str(), host.path.c_str());
  return out;
}

}  // namespace qlft
