// The single-rank side of src/parallel: launcher detection, the identity communicator, the ZeRO
// partition and the state-dict exchange format. (The MPI collectives run under mpirun in
// tests/dist.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <cstring>
#include <numeric>

#include "config/config.h"
#include "core/error.h"
#include "core/communicator.h"
#include "parallel/comm_select.h"
#include "parallel/data_parallel.h"
#include "parallel/mpi_plugin_loader.h"
#include "support/test_support.h"

using namespace qlft;

namespace {

int32_t status_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.status();
  }
  return QLFT_OK;
}

// Launcher variables from the environment this test might itself run under.
struct CleanLaunchEnv {
  qlft_test::ScopedEnv a{"OMPI_COMM_WORLD_RANK", nullptr}, b{"OMPI_COMM_WORLD_SIZE", nullptr},
      c{"PMI_RANK", nullptr}, d{"PMI_SIZE", nullptr}, e{"RANK", nullptr}, f{"WORLD_SIZE", nullptr},
      g{"LOCAL_RANK", nullptr};
};

}  // namespace

TEST(DistLaunch, NothingSetIsOneRank) {
  CleanLaunchEnv clean;
  dist::LaunchInfo li = dist::detect_launch();
  EXPECT_EQ(li.rank, 0);
  EXPECT_EQ(li.world, 1);
  EXPECT_EQ(li.source, "none");
}

TEST(DistLaunch, ReadsRankWorldLocalRank) {
  CleanLaunchEnv clean;
  qlft_test::ScopedEnv r("RANK", "3"), w("WORLD_SIZE", "4"), l("LOCAL_RANK", "1");
  dist::LaunchInfo li = dist::detect_launch();
  EXPECT_EQ(li.rank, 3);
  EXPECT_EQ(li.world, 4);
  EXPECT_EQ(li.local_rank, 1);
  EXPECT_EQ(li.source, "env");
}

TEST(DistLaunch, OpenMpiVariablesWin) {
  CleanLaunchEnv clean;
  qlft_test::ScopedEnv r("OMPI_COMM_WORLD_RANK", "1"), w("OMPI_COMM_WORLD_SIZE", "2"),
      e("RANK", "0"), ew("WORLD_SIZE", "8");
  dist::LaunchInfo li = dist::detect_launch();
  EXPECT_EQ(li.rank, 1);
  EXPECT_EQ(li.world, 2);
  EXPECT_EQ(li.local_rank, 1);  // no local variable: the rank
  EXPECT_EQ(li.source, "openmpi");
}

TEST(DistLaunch, InconsistentOrMalformedIsAnError) {
  CleanLaunchEnv clean;
  {
    qlft_test::ScopedEnv r("RANK", "2"), w("WORLD_SIZE", "2");
    EXPECT_EQ(status_of([] { dist::detect_launch(); }), QLFT_ERR_INVALID_ARGUMENT);
  }
  {
    qlft_test::ScopedEnv r("RANK", "x1"), w("WORLD_SIZE", "2");
    EXPECT_EQ(status_of([] { dist::detect_launch(); }), QLFT_ERR_INVALID_ARGUMENT);
  }
  {
    qlft_test::ScopedEnv w("WORLD_SIZE", "2");  // a size without a rank
    EXPECT_EQ(status_of([] { dist::detect_launch(); }), QLFT_ERR_INVALID_ARGUMENT);
  }
}

TEST(DistComm, BackendNoneRefusesAMultiRankLaunch) {
  CleanLaunchEnv clean;
  qlft_test::ScopedEnv r("RANK", "0"), w("WORLD_SIZE", "2");
  EXPECT_EQ(status_of([] { dist::make_communicator(qlft::DistBackend::None, 10); }),
            QLFT_ERR_INVALID_ARGUMENT);
}

TEST(DistComm, UnknownBackendIsAnError) {
  CleanLaunchEnv clean;
  // An unknown dist.backend is refused where settings enter (the key table).
  EXPECT_EQ(status_of([] { Config().set("dist.backend", "gloo"); }), QLFT_ERR_INVALID_ARGUMENT);
  // NCCL without the CUDA plugin (tests/support/cuda_plugin_absent.sh runs it through the CLI).
  qlft_test::ScopedEnv no_plugin("QLFT_CUDA_PLUGIN", "/nonexistent-qlft-test/libqlft-cuda.so");
  EXPECT_EQ(status_of([] { dist::make_communicator(qlft::DistBackend::Nccl, 10); }),
            QLFT_ERR_UNSUPPORTED);
}

// The MPI communicator is a plugin (libqlft-mpi.so) opened at run time: where it is not
// installed, dist.backend=mpi is refused naming the file it looked for, dlopen's reason and the
// override, and asking again looks again (a failure is not cached).
TEST(DistComm, MissingMpiPluginIsAClearError) {
  CleanLaunchEnv clean;
  const char* path = "/nonexistent-qlft-test/lib/libqlft-mpi.so";
  qlft_test::ScopedEnv p("QLFT_MPI_PLUGIN", path);
  EXPECT_EQ(dist::mpi_plugin_path(), path);
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      dist::make_communicator(qlft::DistBackend::Mpi, 10);
      FAIL() << "dist.backend=mpi worked without its plugin";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(e.status(), QLFT_ERR_UNSUPPORTED) << m;
      EXPECT_NE(m.find(path), std::string::npos) << m;
      EXPECT_NE(m.find("No such file"), std::string::npos) << m;
      EXPECT_NE(m.find("QLFT_MPI_PLUGIN"), std::string::npos) << m;
    }
  }
  // A file that exists but is no plugin: named, with the reason.
  const std::string not_elf = QLFT_SOURCE_DIR "/CMakeLists.txt";
  qlft_test::ScopedEnv q("QLFT_MPI_PLUGIN", not_elf.c_str());
  try {
    dist::make_communicator(qlft::DistBackend::Mpi, 10);
    FAIL() << "a non-library was taken for the MPI plugin";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_UNSUPPORTED) << e.what();
    EXPECT_NE(std::string(e.what()).find(not_elf), std::string::npos) << e.what();
  }
}

TEST(DistComm, SingleRankCollectivesAreTheIdentity) {
  CleanLaunchEnv clean;
  auto c = dist::make_communicator(qlft::DistBackend::None, 10);
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->world(), 1);
  EXPECT_STREQ(c->backend(), "none");
  std::vector<float> x{1.5f, -2.f, 3.25f};
  c->all_reduce(x.data(), x.size(), dist::ReduceOp::Avg);
  EXPECT_EQ(x, (std::vector<float>{1.5f, -2.f, 3.25f}));
  std::vector<float> out(3, 0.f);
  c->reduce_scatter(x.data(), out.data(), 3, dist::ReduceOp::Sum);
  EXPECT_EQ(out, x);
  std::fill(out.begin(), out.end(), 0.f);
  c->all_gather(x.data(), out.data(), 3);
  EXPECT_EQ(out, x);
  EXPECT_EQ(c->sum(int64_t{7}), 7);
  EXPECT_DOUBLE_EQ(c->sum(2.5), 2.5);
  EXPECT_EQ(c->all_gather_bytes("abc"), std::vector<std::string>{"abc"});
  EXPECT_EQ(status_of([&] { c->broadcast(out.data(), 4, 1); }), QLFT_ERR_INVALID_ARGUMENT);
  c->check_same(5, "anything");
  c->barrier();
}

TEST(DistZero, OneRankOwnsEverythingAtEveryStage) {
  CleanLaunchEnv clean;
  std::vector<float> w(100), g(100);
  std::iota(g.begin(), g.end(), 0.f);
  for (int stage = 0; stage <= 2; ++stage) {
    std::vector<ParamRef> params{{"a", w.data(), g.data(), 30},
                                 {"b", w.data() + 30, g.data() + 30, 70}};
    MemoryTracker tracker;
    dist::DataParallel dp(dist::make_communicator(qlft::DistBackend::None, 10), stage, params,
                          &tracker);
    EXPECT_EQ(dp.owned_params().size(), 2u);
    EXPECT_EQ(dp.grad_spans().size(), 2u);
    dp.reduce_gradients();  // identity
    EXPECT_EQ(g[99], 99.f);
    // clip: the norm of 0..99 is sqrt(sum i^2) = sqrt(328350)
    std::vector<float> g2 = g;
    std::vector<GradSpan> spans{{g2.data(), 100}};
    ClipResult r = dp.clip(spans, 1.0);
    EXPECT_NEAR(r.norm, std::sqrt(328350.0), 1e-9);
    EXPECT_TRUE(r.clipped);
    EXPECT_EQ(tracker.snapshot().allocated[QLFT_MEM_COMMUNICATION], 0u);  // no buffer for 1 rank
  }
  std::vector<ParamRef> none;
  MemoryTracker tracker;
  EXPECT_EQ(status_of([&] {
              dist::DataParallel dp(dist::make_communicator(qlft::DistBackend::None, 10), 3, none,
                                    &tracker);
            }),
            QLFT_ERR_INVALID_ARGUMENT);
}

TEST(DistState, ExchangeFormatRoundTripsAndRejectsTruncation) {
  StateDict sd;
  sd.put_string("optim.type", "adamw");
  sd.put_i64("optim.step", 12);
  std::vector<float> m{1, 2, 3, 4, 5, 6};
  sd.put("optim.x.exp_avg", DType::F32, {2, 3}, m.data(), m.size() * 4);
  std::string bytes = dist::serialize_state(sd);
  StateDict back;
  dist::deserialize_state(bytes, back);
  ASSERT_EQ(back.size(), 3u);
  EXPECT_EQ(back.get_string("optim.type"), "adamw");
  EXPECT_EQ(back.get_i64("optim.step"), 12);
  const StateTensor& t = back.require("optim.x.exp_avg", DType::F32, {2, 3});
  EXPECT_EQ(std::memcmp(t.bytes.data(), m.data(), 24), 0);
  for (size_t cut : {size_t{0}, size_t{5}, bytes.size() / 2, bytes.size() - 1}) {
    StateDict partial;
    EXPECT_EQ(status_of([&] { dist::deserialize_state(bytes.substr(0, cut), partial); }),
              QLFT_ERR_FORMAT)
        << "cut at " << cut;
  }
}
