// The records of a run's metrics.jsonl (written by qlft-finetune train, one line per optimizer
// step, and one per evaluation made outside a step: before training and after its last step),
// read back for the training report and qlft_metrics_read. The report is drawn from these records
// alone, so what is logged is what is drawn.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "qlft.h"

namespace qlft::report {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// One step record. A value logged as null (not finite) or absent is NaN; memory per category is
// 0 when the record has no "mem" object (files written before it existed). A line with
// "eval_loss" but no "loss" is an evaluation record: {"step": N, "eval_loss": x, "eval_tokens": n},
// the held-out loss with the weights after step N (0: before training), not a step.
struct MetricsRecord {
  uint64_t step = 0;
  double loss = kNaN, lr = kNaN, grad_norm = kNaN, loss_scale = kNaN;
  bool skipped = false;
  uint64_t tokens = 0;
  double tokens_per_s = kNaN, elapsed_s = kNaN;
  uint64_t memory_bytes = 0, memory_peak_bytes = 0;
  double eval_loss = kNaN;   // only after steps that evaluated, and in evaluation records
  bool evaluation = false;   // an evaluation record: not a training step
  uint64_t eval_tokens = 0;  // held-out tokens the evaluation scored (0: not logged)
  double margin = kNaN;      // preference runs: mean chosen-minus-rejected reward margin
  double accuracy = kNaN;    // preference runs: share of pairs with a margin > 0 (not KTO)
  bool has_mem = false;
  uint64_t mem[QLFT_MEM_CATEGORY_COUNT] = {};  // reserved bytes per category after the step
  bool has_mem_peak = false;
  uint64_t mem_peak[QLFT_MEM_CATEGORY_COUNT] = {};  // highest reserved bytes per category so far
};

// What the run's first record ("run": {...}) says about the run; empty fields when absent.
struct RunInfo {
  bool present = false;
  std::string model, architecture, quant_type, lora_targets, precision;
  int64_t lora_r = 0, seq_len = 0, micro_batch = 0, accumulation = 0;
  double lora_alpha = kNaN;  // a real number (lora.alpha 24.5); NaN when not logged
  uint64_t total_steps = 0;
  uint64_t data_records = 0, data_tokens = 0, train_sequences = 0, eval_sequences = 0;
  double started_unix = kNaN;
  bool has_predicted = false;
  uint64_t mem_predicted[QLFT_MEM_CATEGORY_COUNT] = {};  // planner: bytes at the step peak
  uint64_t mem_predicted_total = 0;
};

struct RunSeries {
  std::vector<MetricsRecord> records;  // in file order
  RunInfo info;                        // from the last record that carries "run"
};

// Parses metrics.jsonl text. A last line without '\n' is a record still being written and is
// left out; any other malformed line throws QLFT_ERR_FORMAT naming path and line.
RunSeries parse_metrics(const std::string& text, const std::string& path);
// Reads and parses the file (QLFT_ERR_IO naming it when unreadable).
RunSeries read_metrics(const std::string& path);

// The "mem" object's keys, in QLFT_MEM_* order.
const char* mem_key(int category);

}  // namespace qlft::report
