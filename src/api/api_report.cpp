// The training report and its data (metrics.jsonl records) through the C ABI; the reading and
// drawing live in src/report.
#include <string>

#include "api/handles.h"
#include "core/error.h"
#include "formats/output_guard.h"
#include "report/metrics_series.h"
#include "report/report_html.h"

using qlft::guard;

extern "C" {

int32_t qlft_metrics_read(const char* path, qlft_metrics_record* records, size_t capacity,
                          size_t* count) {
  return guard([&] {
    QLFT_CHECK_ARG(path && *path && count, "qlft_metrics_read: path or count is NULL");
    QLFT_CHECK_ARG(capacity == 0 || (records && records[0].struct_size >= sizeof(uint32_t)),
                   "qlft_metrics_read: records is NULL or records[0].struct_size is not set (use "
                   "sizeof(qlft_metrics_record))");
    const qlft::report::RunSeries run = qlft::report::read_metrics(path);
    *count = run.records.size();
    if (capacity == 0) return;
    QLFT_CHECK_ARG(capacity >= run.records.size(),
                   "qlft_metrics_read: %s holds %zu records, the array %zu", path,
                   run.records.size(), capacity);
    // The caller's records[0].struct_size is its array's stride.
    const uint32_t stride = records[0].struct_size;
    char* base = reinterpret_cast<char*>(records);
    for (size_t i = 0; i < run.records.size(); ++i) {
      const qlft::report::MetricsRecord& r = run.records[i];
      qlft_metrics_record f{};
      f.step = r.step;
      f.loss = r.loss;
      f.learning_rate = r.lr;
      f.grad_norm = r.grad_norm;
      f.loss_scale = r.loss_scale;
      f.skipped = r.skipped ? 1 : 0;
      f.tokens = r.tokens;
      f.tokens_per_second = r.tokens_per_s;
      f.elapsed_seconds = r.elapsed_s;
      f.eval_loss = r.eval_loss;
      f.margin = r.margin;
      f.memory_reserved = r.memory_bytes;
      f.memory_peak = r.memory_peak_bytes;
      for (int c = 0; c < QLFT_MEM_CATEGORY_COUNT; ++c) {
        f.memory[c] = r.mem[c];
        f.memory_category_peak[c] = r.mem_peak[c];
        f.predicted[c] = run.info.mem_predicted[c];
      }
      f.predicted_total = run.info.mem_predicted_total;
      qlft::copy_out(f, base + i * stride, stride);
    }
  });
}

int32_t qlft_report_write(const char* run_dir, const qlft_report_options* options) {
  return guard([&] {
    QLFT_CHECK_ARG(run_dir && *run_dir, "qlft_report_write: run_dir is NULL or empty");
    QLFT_CHECK_ARG(!options || options->struct_size >= sizeof(uint32_t),
                   "qlft_report_write: options->struct_size is not set (use "
                   "sizeof(qlft_report_options))");
    // Fields past the caller's struct_size are left at their defaults.
    const qlft_report_options o = qlft::copy_in(options);
    qlft::report::ReportOptions ro;
    if (o.status) ro.status = o.status;
    ro.refresh_seconds = o.refresh_seconds;
    const std::string out = o.output_path && *o.output_path ? std::string(o.output_path)
                                                            : std::string(run_dir) + "/report.html";
    // The report never replaces what it is drawn from, nor another file of the run.
    qlft::OutputGuard g;
    g.add_input(std::string(run_dir) + "/metrics.jsonl", "the run's metrics");
    g.add_run_dir(run_dir, nullptr);
    const std::string why = g.refusal(out, "qlft_report_write");
    QLFT_CHECK_ARG(why.empty(), "%s", why.c_str());
    qlft::report::write_report(run_dir, out, ro);
  });
}

}  // extern "C"
