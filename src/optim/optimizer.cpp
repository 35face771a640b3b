#include "optim/optimizer.h"

#include <cmath>
#include <set>

#include "config/config.h"
#include "core/error.h"
#include "optim/adamw.h"
#include "optim/adamw8bit.h"
#include "core/state_store.h"
#include "parallel/nvme_state_store.h"

namespace qlft {

OptimSettings OptimSettings::from_config(const Config& cfg) {
  OptimSettings s;
  s.name = cfg.get("optim.name");
  s.lr = cfg.get_float("optim.lr");
  s.beta1 = cfg.get_float("optim.beta1");
  s.beta2 = cfg.get_float("optim.beta2");
  s.eps = cfg.get_float("optim.eps");
  s.weight_decay = cfg.get_float("optim.weight_decay");
  s.max_grad_norm = cfg.get_float("optim.max_grad_norm");
  s.offload_dir = cfg.get("offload.dir");
  s.offload_nvme = cfg.get("offload.optimizer") == "nvme";
  s.offload_buffers = static_cast<int>(cfg.get_int("offload.buffers"));
  return s;
}

Optimizer::Optimizer(OptimSettings s, std::vector<ParamRef> params)
    : settings_(std::move(s)), params_(std::move(params)) {}

std::unique_ptr<StateStore> make_optimizer_state_store(const OptimSettings& s,
                                                       MemoryTracker* tracker, bool paged) {
  if (s.offload_nvme) return make_nvme_state_store(tracker, s.offload_dir, s.offload_buffers);
  if (paged) return make_paged_state_store(tracker, s.offload_dir);
  return make_host_state_store(tracker);
}

std::unique_ptr<Optimizer> make_optimizer(const OptimSettings& s, std::vector<ParamRef> params,
                                          MemoryTracker* tracker) {
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
  if (s.name == "adamw") return make_adamw(s, std::move(params), tracker);
  if (s.name == "adamw8bit") return make_adamw8bit(s, std::move(params), tracker, false);
  if (s.name == "paged_adamw8bit") return make_adamw8bit(s, std::move(params), tracker, true);
  throw_error(QLFT_ERR_INVALID_ARGUMENT,
              "optim.name must be one of adamw|adamw8bit|paged_adamw8bit, got '%s'",
              s.name.c_str());
}

}  // namespace qlft
