#include "parallel/mpi_plugin_loader.h"

#include <mutex>
#include <string>

#include "core/error.h"
#include "core/plugin_path.h"
#include "parallel/mpi_plugin_abi.h"

namespace qlft::dist {

namespace {

constexpr const char* kPluginFile = "libqlft-mpi.so";
constexpr const char* kPluginEnv = "QLFT_MPI_PLUGIN";

// Opened once and kept; a failure is not remembered, so each attempt reports the file it tried
// (the environment may have changed) and a plugin installed later is found.
const QlftMpiPlugin* load_plugin() {
  static std::mutex mu;
  static const QlftMpiPlugin* plugin = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (plugin) return plugin;
  const std::string path = mpi_plugin_path();
  // Global: OpenMPI opens its own components with dlopen and expects libmpi's symbols to be
  // global.
  std::string why;
  auto entry = reinterpret_cast<QlftMpiPluginEntry>(
      plugin_entry(path, QLFT_MPI_PLUGIN_ENTRY, /*global=*/true, &why));
  if (!entry)
    throw_error(QLFT_ERR_UNSUPPORTED,
                "dist.backend=mpi needs the MPI plugin: %s. Build libqlft where MPI is installed "
                "(OpenMPI: apt install libopenmpi-dev) so that %s is built and installed beside "
                "libqlft, or set %s to the plugin's path",
                why.c_str(), kPluginFile, kPluginEnv);
  const QlftMpiPlugin* p = entry();
  if (!p)
    throw_error(QLFT_ERR_UNSUPPORTED, "%s: its %s returned no plugin", path.c_str(),
                QLFT_MPI_PLUGIN_ENTRY);
  if (p->abi_version != QLFT_MPI_PLUGIN_ABI_VERSION)
    throw_error(QLFT_ERR_UNSUPPORTED,
                "%s implements MPI plugin ABI %u but this libqlft needs %u: install the plugin "
                "built with this libqlft",
                path.c_str(), p->abi_version, QLFT_MPI_PLUGIN_ABI_VERSION);
  plugin = p;  // never dlclose'd: MPI_Finalize runs at exit from inside the plugin
  return plugin;
}

class PluginPending final : public PendingCollective {
 public:
  PluginPending(const QlftMpiPlugin* api, void* p) : api_(api), p_(p) {}
  ~PluginPending() override { api_->pending_free(p_); }
  void wait() override {
    char err[1024] = {};
    if (int32_t s = api_->pending_wait(p_, err, sizeof err)) throw_error(s, "%s", err);
  }

 private:
  const QlftMpiPlugin* api_;
  void* p_;
};

// Forwards every collective to the plugin and turns its status back into qlft::Error.
class PluginCommunicator final : public Communicator {
 public:
  PluginCommunicator(const QlftMpiPlugin* api, double timeout_s) : api_(api) {
    char err[1024] = {};
    if (int32_t s = api_->create(timeout_s, &comm_, err, sizeof err)) throw_error(s, "%s", err);
    api_->info(comm_, &rank_, &world_, &local_rank_);
    set_timeout(timeout_s);
  }
  ~PluginCommunicator() override { api_->destroy(comm_); }

  const char* backend() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  int local_rank() const override { return local_rank_; }

  void all_reduce(float* data, size_t n, ReduceOp op) override {
    call([&](char* e, size_t l) {
      return api_->all_reduce(comm_, data, n, 0, op == ReduceOp::Avg, e, l);
    });
  }
  void all_reduce(double* data, size_t n, ReduceOp op) override {
    call([&](char* e, size_t l) {
      return api_->all_reduce(comm_, data, n, 1, op == ReduceOp::Avg, e, l);
    });
  }
  void reduce(float* data, size_t n, int root, ReduceOp op) override {
    call([&](char* e, size_t l) {
      return api_->reduce(comm_, data, n, root, op == ReduceOp::Avg, e, l);
    });
  }
  void reduce_scatter(const float* in, float* out, size_t n, ReduceOp op) override {
    call([&](char* e, size_t l) {
      return api_->reduce_scatter(comm_, in, out, n, op == ReduceOp::Avg, e, l);
    });
  }
  void all_gather(const float* in, float* out, size_t n) override {
    call([&](char* e, size_t l) { return api_->all_gather(comm_, in, out, n, e, l); });
  }
  std::unique_ptr<PendingCollective> start_all_gather_raw(const void* in, void* out,
                                                          size_t bytes) override {
    void* p = nullptr;
    call([&](char* e, size_t l) {
      return api_->start_all_gather_raw(comm_, in, out, bytes, &p, e, l);
    });
    return std::make_unique<PluginPending>(api_, p);
  }
  void broadcast(void* data, size_t bytes, int root) override {
    call([&](char* e, size_t l) { return api_->broadcast(comm_, data, bytes, root, e, l); });
  }
  void barrier() override {
    call([&](char* e, size_t l) { return api_->barrier(comm_, e, l); });
  }

 private:
  template <class F>
  void call(F&& f) {
    // The timeout may have changed since the last call (Communicator::set_timeout is not
    // virtual): the plugin's communicator bounds its collectives by its own copy.
    api_->set_timeout(comm_, timeout_s());
    char err[1024] = {};
    const int32_t s = f(err, sizeof err);
    broken_ = api_->broken(comm_) != 0;
    if (s) throw_error(s, "%s", err);
  }

  const QlftMpiPlugin* api_;
  void* comm_ = nullptr;
  int rank_ = 0, world_ = 1, local_rank_ = 0;
};

}  // namespace

std::string mpi_plugin_path() {
  return plugin_path(kPluginEnv, kPluginFile);
}

void require_mpi_plugin() {
  load_plugin();
}

std::unique_ptr<Communicator> make_mpi_communicator_from_plugin(double timeout_s) {
  return std::make_unique<PluginCommunicator>(load_plugin(), timeout_s);
}

}  // namespace qlft::dist
