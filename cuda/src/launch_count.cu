// Launch counting (launch_count.h).
#include "launch_count.h"

#include <cxxabi.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>

#include "check.h"

namespace qlft::cu {

namespace {

struct Counts {
  std::mutex m;
  std::unordered_map<const void*, uint64_t> kernels;
  std::map<std::string, uint64_t> library;
  std::atomic<uint64_t> total{0};
  bool tracing = false;
  // The trace: a kernel's address, or a library call's static name (library set).
  struct Entry {
    const void* p;
    bool library;
  };
  std::vector<Entry> trace;
};
Counts& counts() {
  static Counts* c = new Counts;  // never destroyed: launches may come during static teardown
  return *c;
}

std::string kernel_name(const void* k) {
  const char* mangled = nullptr;
  QLFT_CUDA_CHECK(cudaFuncGetName(&mangled, k));
  int ok = -1;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &ok);
  const std::string full = ok == 0 && d ? d : mangled;
  std::free(d);
  return short_kernel_name(full);
}

}  // namespace

void count_launch(const void* kernel, bool recorded) {
  Counts& c = counts();
  std::lock_guard<std::mutex> g(c.m);
  ++c.kernels[kernel];
  if (c.tracing) c.trace.push_back({kernel, false});
  if (!recorded) c.total.fetch_add(1, std::memory_order_relaxed);
}

void count_library_launch(const char* name, bool recorded) {
  Counts& c = counts();
  std::lock_guard<std::mutex> g(c.m);
  ++c.library[name];
  if (c.tracing) c.trace.push_back({name, true});
  if (!recorded) c.total.fetch_add(1, std::memory_order_relaxed);
}

void count_graph_launch() {
  counts().total.fetch_add(1, std::memory_order_relaxed);
}

void trace_launches(bool on) {
  Counts& c = counts();
  std::lock_guard<std::mutex> g(c.m);
  c.tracing = on;
}

std::vector<std::string> launch_sequence() {
  Counts& c = counts();
  std::vector<Counts::Entry> t;
  {
    std::lock_guard<std::mutex> g(c.m);
    t.swap(c.trace);
  }
  std::unordered_map<const void*, std::string> names;
  std::vector<std::string> out;
  out.reserve(t.size());
  for (const Counts::Entry& e : t) {
    if (e.library) {
      out.emplace_back(static_cast<const char*>(e.p));
      continue;
    }
    auto it = names.find(e.p);
    if (it == names.end()) it = names.emplace(e.p, kernel_name(e.p)).first;
    out.push_back(it->second);
  }
  return out;
}

uint64_t launches_total() {
  return counts().total.load(std::memory_order_relaxed);
}

std::vector<LaunchCount> launch_counts() {
  Counts& c = counts();
  std::map<std::string, uint64_t> by_name;
  {
    std::lock_guard<std::mutex> g(c.m);
    for (const auto& [k, n] : c.kernels) by_name[kernel_name(k)] += n;
    for (const auto& [name, n] : c.library) by_name[name] += n;
  }
  std::vector<LaunchCount> out;
  for (const auto& [name, n] : by_name) out.push_back(LaunchCount{name, n});
  return out;
}

std::string short_kernel_name(const std::string& demangled) {
  // The parameter list: the first '(' outside template brackets; the name: after the last "::"
  // outside them (a return type, "void ", precedes a template instance's name).
  std::string s = demangled;
  const std::string anon = "(anonymous namespace)::";
  for (size_t at; (at = s.find(anon)) != std::string::npos;) s.erase(at, anon.size());
  int depth = 0;
  size_t end = s.size(), start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char ch = s[i];
    if (ch == '<') ++depth;
    if (ch == '>') --depth;
    if (depth == 0 && ch == '(') {
      end = i;
      break;
    }
    if (depth == 0 && (ch == ' ' || (ch == ':' && i + 1 < s.size() && s[i + 1] == ':')))
      start = i + (ch == ' ' ? 1 : 2);
  }
  return s.substr(start, end - start);
}

}  // namespace qlft::cu
