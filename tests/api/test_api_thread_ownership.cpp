// Threads owned by the runtime (issue 20, done-when 3): two runtimes in one process, `threads=1`
// and `threads=2`, each used from several OS threads at once (and from the main thread), each run
// every parallel region of its compute -- qlft's kernels, OpenBLAS's and oneDNN's -- on exactly its
// count of OS threads, while the host's own OpenMP setting (omp_get_max_threads on each calling
// thread) and OpenBLAS's process-wide count stay what the host set.
//
// How threads are counted (an independent observer, not qlft's own bookkeeping): this executable
// defines GOMP_parallel, the libgomp entry every `#pragma omp parallel` compiled by GCC calls
// (libqlft, Debian's OpenMP OpenBLAS and oneDNN all import it; the dynamic linker binds their
// references to the executable's definition first). It forwards to libgomp's with a trampoline
// that records the kernel thread id of every team member, so each region's set of OS threads is
// known exactly, whatever the machine's load. A second check counts the process's tasks in
// /proc/self/task while every calling thread is still alive, which also sees threads made outside
// OpenMP (a pthread BLAS would show here).
#include <dirent.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <atomic>
#include <barrier>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "api/api_session.h"
#include "qlft.h"
#include "support/test_support.h"

namespace {

// ---- the observer ----------------------------------------------------------------------------

using ParallelFn = void (*)(void (*)(void*), void*, unsigned, unsigned);

struct Region {
  void (*fn)(void*);
  void* data;
  std::atomic<int> n{0};
  pid_t tids[256];
};

// The runtime whose work the calling thread does (set by the test around each C API call); 0 on
// threads the test did not label (OpenMP workers, where only nested, one-thread regions start).
thread_local int t_label = 0;

struct Stats {
  long regions = 0;
  int max_team = 0;                 // the most distinct OS threads one region ran on
  std::set<int> team_sizes;         // every distinct-thread count seen
  std::set<pid_t> tids;             // every OS thread that ran a region of this label
  long regions_without_caller = 0;  // regions the calling thread did not take part in
};

std::mutex g_mu;
std::map<int, Stats> g_stats;
std::atomic<bool> g_recording{false};

void trampoline(void* p) {
  Region* r = static_cast<Region*>(p);
  const int i = r->n.fetch_add(1);
  if (i < 256) r->tids[i] = gettid();
  r->fn(r->data);
}

}  // namespace

extern "C" void GOMP_parallel(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags) {
  static const ParallelFn real = reinterpret_cast<ParallelFn>(dlsym(RTLD_NEXT, "GOMP_parallel"));
  if (!g_recording.load()) return real(fn, data, num_threads, flags);
  Region r;
  r.fn = fn;
  r.data = data;
  real(trampoline, &r, num_threads, flags);
  const int n = std::min(r.n.load(), 256);
  std::set<pid_t> team(r.tids, r.tids + n);
  std::lock_guard<std::mutex> lock(g_mu);
  Stats& s = g_stats[t_label];
  ++s.regions;
  s.max_team = std::max<int>(s.max_team, int(team.size()));
  s.team_sizes.insert(int(team.size()));
  s.tids.insert(team.begin(), team.end());
  if (!team.count(gettid())) ++s.regions_without_caller;
}

namespace {

int count_tasks() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
  }
  return n;
}

// OpenBLAS's process-wide count, looked up at run time (libopenblas is libqlft's dependency, not
// this test's); -1 where the BLAS is not OpenBLAS.
int openblas_threads() {
  using Fn = int (*)();
  static const Fn f = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return f ? f() : -1;
}

std::string small_text() {
  std::string path = qlft_test::temp_dir("api-thread-ownership") + "/train.txt";
  std::string text;
  for (int i = 0; i < 30; ++i)
    text += "The little dog ran to the park and played with a red ball number " +
            std::to_string(i) + ".\n\n";
  qlft_test::write_file(path, text.data(), text.size());
  return path;
}

int32_t collect(const char* text, void* user) {
  static_cast<std::string*>(user)->append(text);
  return 0;
}

// One caller's work on a runtime: its own model, dataset and trainer (the documented unit of
// thread ownership; the runtime is shared), two training steps and a generation. Returns "" or
// what failed.
std::string work(qlft_runtime* rt, qlft_config* cfg, const std::string& model_path,
                 const std::string& text, int label) {
  t_label = label;
  qlft_model* model = nullptr;
  qlft_dataset* data = nullptr;
  qlft_trainer* tr = nullptr;
  std::string err;
  auto check = [&](int32_t rc, const char* what) {
    if (rc != QLFT_OK && err.empty()) err = std::string(what) + ": " + qlft_last_error();
    return rc == QLFT_OK;
  };
  if (check(qlft_model_load(rt, model_path.c_str(), cfg, &model), "model") &&
      check(qlft_dataset_load(model, text.c_str(), cfg, &data), "dataset") &&
      check(qlft_trainer_create(model, data, cfg, &tr), "trainer")) {
    for (int i = 0; i < 2 && err.empty(); ++i) {
      qlft_step_stats st{};
      st.struct_size = sizeof st;
      check(qlft_trainer_step(tr, &st), "step");
    }
    std::string out;
    if (err.empty())
      check(qlft_generate(model, tr, "Once upon a time", cfg, collect, &out), "generate");
  }
  qlft_trainer_free(tr);
  qlft_dataset_free(data);
  qlft_model_free(model);
  t_label = 0;
  return err;
}

void make_runtime(qlft_test::Session& s, const char* threads) {
  ASSERT_EQ(qlft_config_create(&s.cfg), QLFT_OK);
  for (auto [k, v] : {std::pair{"threads", threads},
                      {"quant.type", "nf4"},
                      {"lora.r", "4"},
                      {"train.micro_batch", "2"},
                      {"train.max_steps", "2"},
                      {"data.seq_len", "32"},
                      {"generate.max_tokens", "8"},
                      {"generate.temperature", "0"}})
    s.set(k, v);
  ASSERT_EQ(qlft_runtime_create(s.cfg, &s.rt), QLFT_OK) << qlft_last_error();
}

}  // namespace

TEST(ApiThreadOwnership, EachRuntimeUsesExactlyItsThreadsAndLeavesTheHostsSettings) {
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  const std::string text = small_text();
  // The host's own settings: an OpenMP count no runtime uses (3) on the main thread and on every
  // calling thread, and OpenBLAS's count as the process starts with it.
  constexpr int kHostOmp = 3;
  omp_set_num_threads(kHostOmp);
  const int blas_before = openblas_threads();

  qlft_test::Session one, two;  // threads=1 and threads=2
  make_runtime(two, "2");
  make_runtime(one, "1");  // last: a runtime that set OpenBLAS's global count would leave 1
  ASSERT_NE(one.rt, nullptr);
  ASSERT_NE(two.rt, nullptr);
  EXPECT_EQ(omp_get_max_threads(), kHostOmp) << "qlft_runtime_create changed the host's OpenMP";
  EXPECT_EQ(openblas_threads(), blas_before) << "qlft_runtime_create changed OpenBLAS's count";

  const int tasks_before = count_tasks();
  g_recording = true;
  // Two callers per runtime, all four at once; each keeps living (barrier) until the tasks are
  // counted, so its OpenMP workers are still there to be seen.
  constexpr int kCallers = 4;
  std::barrier done(kCallers + 1), counted(kCallers + 1);
  std::vector<std::string> errors(kCallers);
  std::vector<int> caller_omp(kCallers);
  std::vector<std::thread> callers;
  for (int i = 0; i < kCallers; ++i)
    callers.emplace_back([&, i] {
      omp_set_num_threads(kHostOmp);  // this thread's own setting, which qlft must not follow
      const bool first = i % 2 == 0;
      errors[i] = first ? work(one.rt, one.cfg, model_path, text, 1)
                        : work(two.rt, two.cfg, model_path, text, 2);
      caller_omp[i] = omp_get_max_threads();
      done.arrive_and_wait();
      counted.arrive_and_wait();
    });
  done.arrive_and_wait();
  const int tasks_during = count_tasks();
  counted.arrive_and_wait();
  for (auto& t : callers) t.join();
  // And the main thread itself, with its host setting of 3, on both runtimes.
  std::string main_two = work(two.rt, two.cfg, model_path, text, 2);
  std::string main_one = work(one.rt, one.cfg, model_path, text, 1);
  g_recording = false;

  for (int i = 0; i < kCallers; ++i) {
    EXPECT_EQ(errors[i], "") << "caller " << i;
    EXPECT_EQ(caller_omp[i], kHostOmp) << "caller " << i << ": its OpenMP setting changed";
  }
  EXPECT_EQ(main_two, "");
  EXPECT_EQ(main_one, "");
  EXPECT_EQ(omp_get_max_threads(), kHostOmp) << "the main thread's OpenMP setting changed";
  EXPECT_EQ(openblas_threads(), blas_before) << "OpenBLAS's process-wide count changed";

  std::lock_guard<std::mutex> lock(g_mu);
  const Stats& s1 = g_stats[1];
  const Stats& s2 = g_stats[2];
  auto sizes = [](const Stats& s) {
    std::string r;
    for (int n : s.team_sizes) r += std::to_string(n) + " ";
    return r;
  };
  std::printf(
      "threads=1: %ld regions on teams of %s| threads=2: %ld regions on teams of %s| "
      "tasks: %d before, %d while the callers lived\n",
      s1.regions, sizes(s1).c_str(), s2.regions, sizes(s2).c_str(), tasks_before, tasks_during);
  // threads=1: every region on its calling thread alone (the 3 calling threads' ids only).
  EXPECT_GT(s1.regions, 100) << "too few parallel regions observed to say anything";
  EXPECT_EQ(s1.max_team, 1) << "threads=1 ran regions on teams of sizes " << sizes(s1);
  EXPECT_EQ(s1.tids.size(), 3u) << "threads=1 used OS threads other than its 3 callers";
  EXPECT_EQ(s1.regions_without_caller, 0);
  // threads=2: regions on the caller plus one worker, the big ones on exactly two.
  EXPECT_GT(s2.regions, 100);
  EXPECT_EQ(s2.max_team, 2) << "threads=2 ran regions on teams of sizes " << sizes(s2);
  EXPECT_EQ(s2.regions_without_caller, 0);
  EXPECT_LE(s2.tids.size(), 6u) << "threads=2: 3 callers and at most one worker each";
  // Nothing else ran a region (an OpenMP worker starting a team of its own).
  for (const auto& [label, s] : g_stats) {
    if (label != 1 && label != 2) {
      EXPECT_LE(s.max_team, 1) << "an unlabelled thread ran a region of " << s.max_team;
    }
  }
  // /proc: while the four callers lived, the process had at most its threads before, the four
  // callers and one OpenMP worker per threads=2 caller (libgomp keeps a caller's workers while it
  // lives; a threads=1 caller has none), also counting threads made outside OpenMP.
  EXPECT_LE(tasks_during, tasks_before + kCallers + kCallers / 2)
      << "threads before: " << tasks_before;
  EXPECT_GE(tasks_during, tasks_before + kCallers);
}
