// The training report: one self-contained HTML page (inline SVG charts, no scripts, no network
// loads) drawn from a run's metrics.jsonl alone. Used by qlft_report_write (the C ABI) and so by
// `qlft-finetune report` and the end of `qlft-finetune train`.
//
// Every chart's plot area is a <g class="plot"> whose data-* attributes give its axis ranges and
// pixel box; each curve is <polyline class="series" data-series="NAME"> (split where a value is
// missing), each marker <circle class="series" data-series="NAME">, each prediction <line
// class="series" data-series="NAME">. A point (x, y) is drawn at
//   px = left + (x - xmin) / (xmax - xmin) * width
//   py = top + height - (y / scale - ymin) / (ymax - ymin) * height       (2 decimals)
// so a reader (tests/unit/test_report.cpp) can map what is drawn back to the records.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "report/metrics_series.h"

namespace qlft::report {

struct ReportOptions {
  std::string status;            // shown in the header; empty: derived from the records
  uint32_t refresh_seconds = 0;  // > 0: <meta http-equiv="refresh"> (a live view, no script)
  double generated_unix = kNaN;  // time shown as "generated at" (NaN: now)
};

// TensorBoard's smoothing: a debiased exponential moving average over the finite values (NaN
// stays NaN and does not enter the average).
inline constexpr double kLossSmoothing = 0.6;
std::vector<double> smooth_ema(const std::vector<double>& y, double weight);

std::string render_report_html(const RunSeries& run, const ReportOptions& opt);

// Reads <run_dir>/metrics.jsonl, renders, and writes out_path atomically (a temporary file
// renamed over it), so a browser never reads half a page.
void write_report(const std::string& run_dir, const std::string& out_path,
                  const ReportOptions& opt);

}  // namespace qlft::report
