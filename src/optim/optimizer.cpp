#include "optim/optimizer.h"

#include <cmath>
#include <set>

#include "core/error.h"
#include "optim/adamw.h"
#include "optim/adamw8bit.h"
#include "core/state_store.h"

namespace qlft {

Optimizer::Optimizer(OptimSettings s, std::vector<ParamRef> params)
    : settings_(std::move(s)), params_(std::move(params)) {}

StateStoreFactory host_or_paged_state_stores(std::string dir) {
  return [dir = std::move(dir)](MemoryTracker* tracker, bool paged) {
    return paged ? make_paged_state_store(tracker, dir) : make_host_state_store(tracker);
  };
}

std::unique_ptr<Optimizer> make_optimizer(const OptimSettings& s, std::vector<ParamRef> params,
                                          MemoryTracker* tracker, const StateStoreFactory& stores) {
  QLFT_CHECK_ARG(std::isfinite(s.lr) && s.lr >= 0, "optim.lr must be >= 0, got %g", s.lr);
  QLFT_CHECK_ARG(s.beta1 >= 0 && s.beta1 < 1, "optim.beta1 must be in [0, 1), got %g", s.beta1);
  QLFT_CHECK_ARG(s.beta2 >= 0 && s.beta2 < 1, "optim.beta2 must be in [0, 1), got %g", s.beta2);
  QLFT_CHECK_ARG(s.eps >= 0, "optim.eps must be >= 0, got %g", s.eps);
  QLFT_CHECK_ARG(s.weight_decay >= 0, "optim.weight_decay must be >= 0, got %g", s.weight_decay);
  std::set<std::string> names;
  for (const ParamRef& p : params) {
    QLFT_CHECK_ARG(!p.name.empty(), "optimizer parameter without a name");
    QLFT_CHECK_ARG(p.numel > 0 && p.data && p.grad,
                   "optimizer parameter '%s' has no data, gradient or elements", p.name.c_str());
    QLFT_CHECK_ARG(names.insert(p.name).second, "optimizer parameter '%s' is given twice",
                   p.name.c_str());
  }
  switch (s.kind) {
    case OptimizerKind::AdamW:
      return make_adamw(s, std::move(params), stores(tracker, false));
    case OptimizerKind::AdamW8bit:
      return make_adamw8bit(s, std::move(params), stores(tracker, false));
    case OptimizerKind::PagedAdamW8bit:
      return make_adamw8bit(s, std::move(params), stores(tracker, true));
  }
  throw_error(QLFT_ERR_INVALID_ARGUMENT, "optim.name: unknown optimizer %d",
              static_cast<int>(s.kind));
}

}  // namespace qlft
