// Stream capture and CUDA graphs for the emulator.
//
// A capturing stream does not run its work: each asynchronous call (kernel launch, cuBLASLt
// matmul, memcpy / memset, event record) is appended to the capture as the same call, re-issued
// later on the stream a graph launch names. A kernel node owns its converted arguments (the
// launch's by-value tuple, qlft_emu::launch), a matmul node its descriptors and alpha / beta, so
// a replay sees the scalars of capture time and the device memory of replay time, as on a GPU.
// cudaGraphLaunch runs the nodes in capture order on the launching thread (streams run in issue
// order here, so capture order is a valid order of any graph's dependencies).
//
// What CUDA refuses during a capture is refused here with its error, and the capture is
// invalidated (cudaStreamEndCapture then answers cudaErrorStreamCaptureInvalidated and no
// graph): synchronizing a capturing stream or the device, a synchronous copy or fill or
// cudaMalloc / cudaFree from a thread a global or thread-local capture covers, legacy-stream
// work while a blocking stream captures. Other streams join a capture by waiting on an event
// recorded in it and must be joined back (some stream of the capture waits on an event recorded
// after their last work) before it ends, or it ends with cudaErrorStreamCaptureUnjoined.
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "emu_internal.h"

namespace {

struct Node {
  qlft_emu::Api kind;
  const void* kernel;  // a kernel node's function
  qlft_emu::GraphOp op;
};

struct Capture {
  cudaStream_t origin;
  cudaStreamCaptureMode mode;
  std::thread::id thread;
  bool invalid = false;
  std::vector<Node> nodes;
  std::set<cudaStream_t> streams;           // recording into it (the origin and joined ones)
  std::map<cudaStream_t, uint64_t> joined;  // a joined stream's work some stream waited for
};

}  // namespace

struct qlft_emu_graph {
  std::vector<Node> nodes;
};
struct qlft_emu_graph_exec {
  std::vector<Node> nodes;
};

namespace qlft_emu {

namespace {

struct State {
  uint64_t next_id = 1;
  std::map<uint64_t, Capture> captures;
  std::set<const void*> graphs, execs;
};
State& state() {  // under device_lock()
  static State* s = new State;
  return *s;
}

thread_local int t_replaying = 0;

Capture* capture_of(cudaStream_t s) {
  if (!s || !s->capture) return nullptr;
  auto it = state().captures.find(s->capture);
  return it == state().captures.end() ? nullptr : &it->second;
}

cudaError_t fail(cudaError_t e, const std::string& msg) {
  report(e, msg);
  return e;
}

void invalidate(Capture& c, const char* why) {
  if (!c.invalid) std::fprintf(stderr, "qlft CUDA emulator: stream capture invalidated: %s\n", why);
  c.invalid = true;
}

// Ends a capture: its streams stop recording.
void close(uint64_t id) {
  Capture& c = state().captures.at(id);
  for (cudaStream_t s : c.streams) {
    s->capture = 0;
    s->cap_work = 0;
  }
  state().captures.erase(id);
}

}  // namespace

bool replaying() {
  return t_replaying > 0;
}

bool capture_active(uint64_t id) {
  if (!id) return false;
  std::lock_guard<std::recursive_mutex> g(device_lock());
  return state().captures.count(id) != 0;
}

bool captured(cudaStream_t s, Api a, const void* kernel, GraphOp op, cudaError_t* e) {
  if (replaying()) return false;
  std::lock_guard<std::recursive_mutex> g(device_lock());
  *e = cudaSuccess;
  if (!s) {  // the legacy stream waits for every blocking stream: not for a capturing one
    for (auto& [id, c] : state().captures)
      for (cudaStream_t x : c.streams)
        if (!(x->flags & cudaStreamNonBlocking)) {
          invalidate(c, "work on the legacy stream while a blocking stream captures");
          *e = cudaErrorStreamCaptureImplicit;
          set_last_error(*e);
          return true;
        }
    return false;
  }
  Capture* c = capture_of(s);
  if (!c) return false;
  if (c->invalid) {
    *e = cudaErrorStreamCaptureInvalidated;
    set_last_error(*e);
    return true;
  }
  c->nodes.push_back(Node{a, kernel, std::move(op)});
  ++s->cap_work;
  count_api(s, a, kernel);
  return true;
}

cudaError_t unsafe_call(const char* what) {
  if (replaying()) return cudaSuccess;
  std::lock_guard<std::recursive_mutex> g(device_lock());
  cudaError_t e = cudaSuccess;
  for (auto& [id, c] : state().captures) {
    const bool covered =
        c.mode == cudaStreamCaptureModeGlobal ||
        (c.mode == cudaStreamCaptureModeThreadLocal && c.thread == std::this_thread::get_id());
    if (!covered) continue;
    invalidate(c, what);
    e = cudaErrorStreamCaptureUnsupported;
  }
  if (e != cudaSuccess)
    report(e, std::string(what) + " during a global or thread-local stream capture");
  return e;
}

cudaError_t sync_during_capture(cudaStream_t s, const char* what) {
  if (replaying()) return cudaSuccess;
  std::lock_guard<std::recursive_mutex> g(device_lock());
  cudaError_t e = cudaSuccess;
  for (auto& [id, c] : state().captures) {
    if (s && !c.streams.count(s)) continue;  // s == nullptr: the device
    invalidate(c, what);
    e = cudaErrorStreamCaptureUnsupported;
  }
  if (e != cudaSuccess) report(e, std::string(what) + " during a stream capture");
  return e;
}

bool capture_event_record(cudaEvent_t e, cudaStream_t s, cudaError_t* err) {
  if (replaying()) return false;
  std::lock_guard<std::recursive_mutex> g(device_lock());
  GraphOp op = [e](cudaStream_t r) { return cudaEventRecord(e, r); };
  if (!captured(s, Api::Event, nullptr, std::move(op), err)) return false;
  if (*err == cudaSuccess) {
    e->capture = s->capture;
    e->cap_stream = s;
    e->cap_work = s->cap_work;
  }
  return true;
}

bool capture_stream_wait(cudaStream_t s, cudaEvent_t e, cudaError_t* err) {
  if (replaying()) return true;  // replay runs in issue order: nothing to wait for
  std::lock_guard<std::recursive_mutex> g(device_lock());
  *err = cudaSuccess;
  Capture* mine = capture_of(s);
  const bool from_capture = capture_active(e->capture);
  if (!from_capture) {
    if (mine && mine->invalid) *err = cudaErrorStreamCaptureInvalidated;
    return mine != nullptr;  // a dependency on work submitted before: already done
  }
  Capture& theirs = state().captures.at(e->capture);
  if (mine && mine != &theirs) {
    invalidate(*mine, "cudaStreamWaitEvent on an event of another capture");
    invalidate(theirs, "cudaStreamWaitEvent on an event of another capture");
    *err = cudaErrorStreamCaptureIsolation;
    return true;
  }
  if (!mine) {  // s forks from the capture: its work records into it from now on
    s->capture = e->capture;
    s->cap_work = 0;
    theirs.streams.insert(s);
    return true;
  }
  if (e->cap_stream != s && e->cap_stream != theirs.origin) {
    uint64_t& j = theirs.joined[e->cap_stream];
    j = std::max(j, e->cap_work);
  }
  if (theirs.invalid) *err = cudaErrorStreamCaptureInvalidated;
  return true;
}

void capture_stream_destroyed(cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> g(device_lock());
  Capture* c = capture_of(s);
  if (!c) return;
  invalidate(*c, "a capturing stream was destroyed");
  c->streams.erase(s);
}

}  // namespace qlft_emu

using namespace qlft_emu;

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  std::lock_guard<std::recursive_mutex> g(device_lock());
  if (!s) return fail(cudaErrorStreamCaptureUnsupported, "capture on the legacy stream");
  if (!stream_is_valid(s)) return fail(cudaErrorInvalidResourceHandle, "cudaStreamBeginCapture");
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed)
    return fail(cudaErrorInvalidValue, "cudaStreamBeginCapture: unknown mode");
  if (s->capture) return fail(cudaErrorIllegalState, "the stream is already capturing");
  State& st = state();
  const uint64_t id = st.next_id++;
  Capture& c = st.captures[id];
  c.origin = s;
  c.mode = mode;
  c.thread = std::this_thread::get_id();
  c.streams.insert(s);
  s->capture = id;
  s->cap_work = 0;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  std::lock_guard<std::recursive_mutex> g(device_lock());
  if (!graph) return fail(cudaErrorInvalidValue, "cudaStreamEndCapture: null graph");
  if (!s || !stream_is_valid(s))
    return fail(cudaErrorInvalidResourceHandle, "cudaStreamEndCapture");
  *graph = nullptr;
  Capture* c = capture_of(s);
  if (!c) return fail(cudaErrorIllegalState, "cudaStreamEndCapture: the stream is not capturing");
  const uint64_t id = s->capture;
  if (c->origin != s) {
    invalidate(*c, "cudaStreamEndCapture on a stream that joined the capture");
    return fail(cudaErrorStreamCaptureUnmatched, "capture was begun on another stream");
  }
  if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id())
    return fail(cudaErrorStreamCaptureWrongThread, "capture ended from another thread");
  if (c->invalid) {
    close(id);
    return fail(cudaErrorStreamCaptureInvalidated, "cudaStreamEndCapture: capture invalidated");
  }
  for (cudaStream_t x : c->streams) {
    if (x == s || x->cap_work == 0) continue;
    auto j = c->joined.find(x);
    if (j == c->joined.end() || j->second < x->cap_work) {
      close(id);
      return fail(cudaErrorStreamCaptureUnjoined,
                  "a stream that joined the capture has work the origin never waited for");
    }
  }
  qlft_emu_graph* gr = new qlft_emu_graph{std::move(c->nodes)};
  close(id);
  state().graphs.insert(gr);
  *graph = gr;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  std::lock_guard<std::recursive_mutex> g(device_lock());
  if (!status) return fail(cudaErrorInvalidValue, "cudaStreamIsCapturing: null status");
  if (!stream_is_valid(s)) return fail(cudaErrorInvalidResourceHandle, "cudaStreamIsCapturing");
  const Capture* c = capture_of(s);
  *status = !c           ? cudaStreamCaptureStatusNone
            : c->invalid ? cudaStreamCaptureStatusInvalidated
                         : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags) {
  std::lock_guard<std::recursive_mutex> g(device_lock());
  if (!exec) return fail(cudaErrorInvalidValue, "cudaGraphInstantiate: null exec");
  if (!graph || !state().graphs.count(graph))
    return fail(cudaErrorInvalidResourceHandle, "cudaGraphInstantiate: not a live graph");
  if (flags & ~0xfull) return fail(cudaErrorInvalidValue, "cudaGraphInstantiate: unknown flags");
  qlft_emu_graph_exec* x = new qlft_emu_graph_exec{graph->nodes};
  state().execs.insert(x);
  *exec = x;
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  std::vector<Node> nodes;
  {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    if (!exec || !state().execs.count(exec))
      return fail(cudaErrorInvalidResourceHandle, "cudaGraphLaunch: not a live executable graph");
    if (!stream_is_valid(s)) return fail(cudaErrorInvalidResourceHandle, "cudaGraphLaunch");
    nodes = exec->nodes;
  }
  // A graph launched into a capture becomes one node of it (a child graph).
  auto run = [nodes](cudaStream_t r) {
    ++t_replaying;
    cudaError_t first = cudaSuccess;
    for (const Node& n : nodes) {
      const cudaError_t before = cudaPeekAtLastError();
      set_last_error(cudaSuccess);
      cudaError_t e = n.op(r);
      if (e == cudaSuccess) e = cudaPeekAtLastError();
      set_last_error(before);
      if (e != cudaSuccess) {
        first = e;
        break;
      }
    }
    --t_replaying;
    return first;
  };
  cudaError_t e = cudaSuccess;
  if (captured(s, Api::Graph, nullptr, run, &e)) return e;
  count_api(s, Api::Graph);
  e = run(s);
  if (e != cudaSuccess) set_last_error(e);
  return e;
}

cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t graph,
                                cudaGraphExecUpdateResultInfo* info) {
  std::lock_guard<std::recursive_mutex> g(device_lock());
  if (!info) return fail(cudaErrorInvalidValue, "cudaGraphExecUpdate: null result info");
  *info = cudaGraphExecUpdateResultInfo{cudaGraphExecUpdateError, nullptr, nullptr};
  if (!exec || !state().execs.count(exec) || !graph || !state().graphs.count(graph))
    return fail(cudaErrorInvalidResourceHandle, "cudaGraphExecUpdate: not a live exec / graph");
  cudaGraphExecUpdateResult r = cudaGraphExecUpdateSuccess;
  if (exec->nodes.size() != graph->nodes.size()) r = cudaGraphExecUpdateErrorTopologyChanged;
  for (size_t i = 0; r == cudaGraphExecUpdateSuccess && i < graph->nodes.size(); ++i) {
    const Node &a = exec->nodes[i], &b = graph->nodes[i];
    if (a.kind != b.kind)
      r = cudaGraphExecUpdateErrorNodeTypeChanged;
    else if (a.kernel != b.kernel)
      r = cudaGraphExecUpdateErrorFunctionChanged;
    if (r != cudaGraphExecUpdateSuccess)
      info->errorNode = reinterpret_cast<cudaGraphNode_t>(&graph->nodes[i]);
  }
  info->result = r;
  if (r != cudaGraphExecUpdateSuccess) return cudaErrorGraphExecUpdateFailure;  // not reported
  exec->nodes = graph->nodes;
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  std::lock_guard<std::recursive_mutex> g(device_lock());
  if (!exec || !state().execs.erase(exec))
    return fail(cudaErrorInvalidResourceHandle, "cudaGraphExecDestroy: not a live exec");
  delete exec;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  std::lock_guard<std::recursive_mutex> g(device_lock());
  if (!graph || !state().graphs.erase(graph))
    return fail(cudaErrorInvalidResourceHandle, "cudaGraphDestroy: not a live graph");
  delete graph;
  return cudaSuccess;
}

cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* count) {
  std::lock_guard<std::recursive_mutex> g(device_lock());
  if (!count) return fail(cudaErrorInvalidValue, "cudaGraphGetNodes: null count");
  if (!graph || !state().graphs.count(graph))
    return fail(cudaErrorInvalidResourceHandle, "cudaGraphGetNodes: not a live graph");
  const size_t n = graph->nodes.size();
  if (nodes)
    for (size_t i = 0; i < std::min(n, *count); ++i)
      nodes[i] = reinterpret_cast<cudaGraphNode_t>(&graph->nodes[i]);
  *count = n;
  return cudaSuccess;
}
