// Host op profile: wall time per named scope, nested as the calls nest, for finding where a
// training step's time goes on a machine without perf (a lent GPU machine's host CPU, a
// customer's box). Off unless switched on (QLFT_PROFILE=FILE, read by the trainer; or
// prof::set_enabled): a scope then costs one relaxed load.
//
// A scope records on the thread that opens it, outside OpenMP parallel regions only (a worker's
// share of a parallel kernel is inside the caller's scope already), under the scope that thread
// has open; a thread with none open starts a root. Each node keeps its call count, its total
// time and its self time (total less its children's), so the self times of a tree add up to its
// roots' totals and a table of them is a profile of the step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qlft::prof {

bool enabled();
void set_enabled(bool on);
// Drops every count (the nodes' names stay); scopes open now record into the fresh counts.
void reset();

// Records ns of time as a child `name` of the calling thread's open scope, as if a scope of that
// name had run `calls` times for ns in all (nothing outside an open scope, inside a parallel
// region, or when off). For work timed inside a parallel region, where scopes do not record:
// the caller sums its threads' times and passes the sum over the team size (TeamTimes), so the
// tree stays a split of wall time.
void add_child_time(const char* name, int64_t calls, int64_t ns);

class Scope {
 public:
  // name: a string literal (kept by pointer). Names are compared by content, so the same name
  // from two call sites is one node.
  explicit Scope(const char* name) {
    if (enabled()) begin(name);
  }
  ~Scope() {
    if (node_) end();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  void begin(const char* name);
  void end();
  friend void add_child_time(const char* name, int64_t calls, int64_t ns);
  struct Node* node_ = nullptr;
  Scope* parent_ = nullptr;  // the thread's enclosing open scope
  int64_t t0_ = 0;           // steady clock, ns
  int64_t child_ns_ = 0;     // this call's children's time
};

struct Entry {
  std::string path;  // names from the root, joined by '/'
  int depth = 0;     // 0 for a root
  int64_t calls = 0;
  int64_t total_ns = 0, self_ns = 0;
};
// Per-thread time of one kind of work inside a parallel region (an OpenMP team's threads, by
// slot), reported after the region as a child of the caller's scope (add_child_time). Off (the
// profiler disabled when made), start() and add() cost a branch and read no clock.
class TeamTimes {
 public:
  explicit TeamTimes(int threads);
  int64_t start() const;           // a time stamp for add (0 when off)
  void add(int slot, int64_t t0);  // the time since t0 counted for thread slot, one call
  // The slots' total over the team size and their calls, as add_child_time(name, ...).
  void report(const char* name) const;

 private:
  struct alignas(64) Slot {  // a cache line each: the threads write their own
    int64_t ns = 0, calls = 0;
  };
  bool on_;
  std::vector<Slot> slots_;
};

// Every node with a call, depth first, children in order of first call.
std::vector<Entry> snapshot();

// The profile as a tab-separated table: a header line, then per node path, calls, total and
// self milliseconds, and self as a percentage of all roots' total; then the self times summed
// by scope name ("by name"), largest first.
std::string format_table(const std::vector<Entry>& entries);

}  // namespace qlft::prof

#define QLFT_PROF_CAT2(a, b) a##b
#define QLFT_PROF_CAT(a, b) QLFT_PROF_CAT2(a, b)
// Times the rest of the enclosing block under name.
#define QLFT_PROFILE_SCOPE(name) ::qlft::prof::Scope QLFT_PROF_CAT(qlft_prof_, __LINE__)(name)
