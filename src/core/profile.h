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
