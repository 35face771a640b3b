// The fields metrics.jsonl records carry for the training report (qlft_report_write draws the
// report from metrics.jsonl alone): memory per category after every step, and in the first
// record a run writes, what the run is (model, adapter, data, batch, the planner's prediction).
#pragma once

#include <cstdint>
#include <string>

#include "qlft.h"

namespace cli {

// `"model": ..., "lora_r": ...` (a JSON object's members without braces) describing the run;
// predicted may be NULL (no prediction).
std::string report_run_members(const qlft_config* cfg, const qlft_model* model,
                               const qlft_dataset* data, const std::string& model_path,
                               const qlft_memory_estimate* predicted);

// The text a step record gets before its closing brace: `, "mem": {...}` (reserved bytes per
// category now), `, "mem_peak": {...}` (the highest reserved bytes per category so far: what
// the planner predicts) and, when *run_members is not empty, `, "run": {..., "total_steps": N}`,
// after which *run_members is cleared (only the first record of a run carries it).
std::string report_step_fields(const qlft_trainer* trainer, const qlft_step_stats* s,
                               std::string* run_members);

// Writes <dir>/report.html (qlft_report_write) and says where on stderr; a failure is printed
// as a warning: the report never fails the run.
void write_run_report(const std::string& dir, const char* status);

}  // namespace cli
