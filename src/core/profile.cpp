#include "core/profile.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace qlft::prof {

struct Node {
  const char* name = "";
  Node* parent = nullptr;
  std::vector<std::unique_ptr<Node>> children;  // in order of first call
  int64_t calls = 0, total_ns = 0, self_ns = 0;
};

namespace {

std::atomic<bool> g_enabled{false};
// One lock for the tree and its counts: scopes open and close per op or per weight panel (some
// thousands a step), so an uncontended lock is far below the work they time.
std::mutex g_mu;
Node g_root;
thread_local Scope* t_open = nullptr;  // the innermost open scope of this thread

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool in_parallel_region() {
#ifdef _OPENMP
  return omp_in_parallel() != 0;
#else
  return false;
#endif
}

Node* child_of(Node* parent, const char* name) {
  for (auto& c : parent->children)
    if (c->name == name || std::strcmp(c->name, name) == 0) return c.get();
  parent->children.push_back(std::make_unique<Node>());
  Node* n = parent->children.back().get();
  n->name = name;
  n->parent = parent;
  return n;
}

void zero(Node& n) {
  n.calls = n.total_ns = n.self_ns = 0;
  for (auto& c : n.children) zero(*c);
}

void collect(const Node& n, const std::string& prefix, int depth, std::vector<Entry>& out) {
  for (const auto& c : n.children) {
    std::string path = prefix.empty() ? c->name : prefix + "/" + c->name;
    if (c->calls > 0) out.push_back({path, depth, c->calls, c->total_ns, c->self_ns});
    collect(*c, path, depth + 1, out);
  }
}

}  // namespace

bool enabled() {
  return g_enabled.load(std::memory_order_relaxed);
}

void set_enabled(bool on) {
  g_enabled.store(on, std::memory_order_relaxed);
}

void reset() {
  std::lock_guard<std::mutex> lock(g_mu);
  zero(g_root);
}

void Scope::begin(const char* name) {
  if (in_parallel_region()) return;
  parent_ = t_open;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    node_ = child_of(parent_ ? parent_->node_ : &g_root, name);
  }
  t_open = this;
  t0_ = now_ns();
}

void Scope::end() {
  const int64_t dt = now_ns() - t0_;
  t_open = parent_;
  if (parent_) parent_->child_ns_ += dt;
  std::lock_guard<std::mutex> lock(g_mu);
  node_->calls += 1;
  node_->total_ns += dt;
  node_->self_ns += dt - child_ns_;
}

void add_child_time(const char* name, int64_t calls, int64_t ns) {
  Scope* open = t_open;
  if (!enabled() || !open || in_parallel_region() || calls <= 0) return;
  open->child_ns_ += ns;
  std::lock_guard<std::mutex> lock(g_mu);
  Node* n = child_of(open->node_, name);
  n->calls += calls;
  n->total_ns += ns;
  n->self_ns += ns;
}

TeamTimes::TeamTimes(int threads)
    : on_(enabled()), slots_(on_ ? static_cast<size_t>(std::max(1, threads)) : 0) {}

int64_t TeamTimes::start() const {
  return on_ ? now_ns() : 0;
}

void TeamTimes::add(int slot, int64_t t0) {
  if (!on_ || slot < 0 || static_cast<size_t>(slot) >= slots_.size()) return;
  Slot& s = slots_[static_cast<size_t>(slot)];
  s.ns += now_ns() - t0;
  s.calls += 1;
}

void TeamTimes::report(const char* name) const {
  if (!on_) return;
  int64_t ns = 0, calls = 0;
  for (const Slot& s : slots_) {
    ns += s.ns;
    calls += s.calls;
  }
  add_child_time(name, calls, ns / static_cast<int64_t>(slots_.size()));
}

std::vector<Entry> snapshot() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<Entry> out;
  collect(g_root, "", 0, out);
  return out;
}

std::string format_table(const std::vector<Entry>& entries) {
  int64_t roots = 0;
  std::map<std::string, int64_t> by_name;
  for (const Entry& e : entries) {
    if (e.depth == 0) roots += e.total_ns;
    const size_t slash = e.path.rfind('/');
    by_name[slash == std::string::npos ? e.path : e.path.substr(slash + 1)] += e.self_ns;
  }
  const double all = roots > 0 ? static_cast<double>(roots) : 1.0;
  std::string s = "path\tcalls\ttotal_ms\tself_ms\tself_pct\n";
  char line[64];
  for (const Entry& e : entries) {
    std::snprintf(line, sizeof line, "\t%" PRId64 "\t%.3f\t%.3f\t%.2f\n", e.calls,
                  e.total_ns * 1e-6, e.self_ns * 1e-6, 100.0 * e.self_ns / all);
    s += e.path + line;
  }
  std::vector<std::pair<std::string, int64_t>> names(by_name.begin(), by_name.end());
  std::stable_sort(names.begin(), names.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  s += "\nby name\tself_ms\tself_pct\n";
  for (const auto& [name, ns] : names) {
    std::snprintf(line, sizeof line, "\t%.3f\t%.2f\n", ns * 1e-6, 100.0 * ns / all);
    s += name + line;
  }
  return s;
}

}  // namespace qlft::prof
