// Counting of the device work the backend submits: every kernel launched through
// qlft::cu::launch (check.h) and every cuBLASLt matmul (gemm.cu), by name, process-wide.
//
// Counted here, at the backend's own launch wrapper, rather than in the emulator: the same code
// runs on a GPU and in the emulated build, so both report the same numbers (the emulator's
// runtime-level count, qlft_emu::api_counts, is the independent check the tests compare with).
// CudaBackend::transfers() reports the total, so the trainer's per-step difference is the
// step's launches (metrics.jsonl "launches"). One process drives one device; two backends in one
// process would share the count.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qlft::cu {

// recorded: the launch went into a stream capture (graph.h): counted by name, not as a
// submission; the graph launch that submits it counts once (count_graph_launch).
void count_launch(const void* kernel, bool recorded = false);  // named later by cudaFuncGetName
void count_library_launch(const char* name, bool recorded = false);  // name: a static string
void count_graph_launch();
// Submissions: kernel launches and library calls not recorded into a graph, plus graph launches.
uint64_t launches_total();

struct LaunchCount {
  std::string name;  // the kernel's unqualified name with template arguments ("k_attn_fwd<4>")
  uint64_t count = 0;
};
// Launches so far by name (kernels of one name but different instances are listed apart only
// when their template arguments differ), sorted by name.
std::vector<LaunchCount> launch_counts();
// The launch order, for a test that asks which kernel sits between which (cuda_entry.h's
// cuda_trace_launches): while on, each launch's name is kept in order (a pointer per kernel
// launch, named when read); launch_sequence() returns them and empties the record.
void trace_launches(bool on);
std::vector<std::string> launch_sequence();
// Demangled "void qlft::cu::k_attn_fwd<4>(qlft::cu::AttnArgs, ...)" -> "k_attn_fwd<4>".
std::string short_kernel_name(const std::string& demangled);

}  // namespace qlft::cu
