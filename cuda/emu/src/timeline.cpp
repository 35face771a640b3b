// The emulator's stream timeline: where each piece of work would run relative to the others,
// on a logical clock. The emulator executes everything synchronously in issue order; this
// records what the streams and events allow instead: each stream has a clock, an operation
// (kernel, cuBLASLt matmul, copy, fill) starts at its stream's clock and takes one tick, an
// event records its stream's clock, and a stream that waits on an event moves its clock up to
// the event's. Two operations overlap when their [start, end) intervals do: exact and
// deterministic, a statement about ordering (not durations), which is what a test of "the copy
// stream runs beside the compute stream" needs.
#include <map>
#include <mutex>
#include <vector>

#include "emu_internal.h"

namespace qlft_emu {

namespace {

struct Timeline {
  std::mutex m;
  bool on = false;
  std::map<cudaStream_t, uint64_t> clock;
  std::map<cudaEvent_t, uint64_t> events;
  std::vector<TimelineOp> ops;
};
Timeline& tl() {
  static Timeline* t = new Timeline;
  return *t;
}

}  // namespace

void timeline_op(cudaStream_t s, Api a, const void* kernel) {
  Timeline& t = tl();
  std::lock_guard<std::mutex> g(t.m);
  if (!t.on) return;
  uint64_t& c = t.clock[s];
  t.ops.push_back({s, int(a), kernel, c, c + 1});
  ++c;
}

void timeline_event_record(cudaEvent_t e, cudaStream_t s) {
  Timeline& t = tl();
  std::lock_guard<std::mutex> g(t.m);
  if (t.on) t.events[e] = t.clock[s];
}

void timeline_stream_wait(cudaStream_t s, cudaEvent_t e) {
  Timeline& t = tl();
  std::lock_guard<std::mutex> g(t.m);
  if (!t.on) return;
  auto it = t.events.find(e);
  if (it != t.events.end()) t.clock[s] = std::max(t.clock[s], it->second);
}

void timeline_record(bool on) {
  Timeline& t = tl();
  std::lock_guard<std::mutex> g(t.m);
  t.on = on;
  if (on) {
    t.clock.clear();
    t.events.clear();
    t.ops.clear();
  }
}

std::vector<TimelineOp> timeline() {
  Timeline& t = tl();
  std::lock_guard<std::mutex> g(t.m);
  return t.ops;
}

}  // namespace qlft_emu
