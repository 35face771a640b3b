// Rendering of the training report (see report_html.h): plain string building, no templates,
// so the page is exactly what this file writes.
#include "report/report_html.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "core/error.h"
#include "formats/atomic_file.h"

namespace qlft::report {

namespace {

// Chart geometry in CSS pixels (the SVG viewBox).
constexpr double kW = 760, kH = 230;
constexpr double kLeft = 78, kRight = 16, kTop = 30, kBottom = 34;
constexpr double kPlotW = kW - kLeft - kRight, kPlotH = kH - kTop - kBottom;
constexpr double kMiB = 1024.0 * 1024.0;
// Evaluations listed in the header by step and loss (the first and last half of them when there
// are more); the loss chart draws every one.
constexpr size_t kEvalListed = 12;

const char* const kCategoryColor[QLFT_MEM_CATEGORY_COUNT] = {
    "#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3"};

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '&':
        o += "&amp;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

std::string human_bytes(double b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return strf(u ? "%.1f %s" : "%.0f %s", b, unit[u]);
}

std::string human_seconds(double s) {
  if (!std::isfinite(s) || s < 0) return "-";
  // A time beyond a year (a corrupt elapsed_s, an ETA from a stalled pace) in years: the
  // conversion to long below is only defined in range.
  constexpr double kYear = 365.25 * 86400;
  if (s >= kYear) return strf("%.3g years", s / kYear);
  long t = static_cast<long>(s + 0.5);
  if (t >= 3600) return strf("%ldh %02ldm %02lds", t / 3600, (t / 60) % 60, t % 60);
  if (t >= 60) return strf("%ldm %02lds", t / 60, t % 60);
  return strf("%.1f s", s);
}

std::string num_or_dash(double v, const char* f = "%.4f") {
  return std::isfinite(v) ? strf(f, v) : std::string("-");
}

// A "nice" tick step (1, 2 or 5 times a power of ten) giving about n ticks over span.
double nice_step(double span, int n) {
  if (!(span > 0)) return 1;
  const double raw = span / n, p = std::pow(10.0, std::floor(std::log10(raw))), f = raw / p;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

struct Series {
  std::string name, label, color;
  std::vector<double> x, y;  // y in plot units (already divided by the chart's scale)
  enum Kind { kLine, kMarkers, kHorizontal } kind = kLine;
  double width = 1.6, opacity = 1.0;
  bool dashed = false;
};

struct Chart {
  std::string id, title, unit;
  double scale = 1;  // recorded value / scale = plotted value
  std::vector<Series> series;
};

class Plot {
 public:
  Plot(double xmin, double xmax, double ymin, double ymax)
      : xmin_(xmin), xmax_(xmax), ymin_(ymin), ymax_(ymax) {}
  double px(double x) const { return kLeft + (x - xmin_) / (xmax_ - xmin_) * kPlotW; }
  double py(double y) const { return kTop + kPlotH - (y - ymin_) / (ymax_ - ymin_) * kPlotH; }
  double xmin_, xmax_, ymin_, ymax_;
};

std::string render_chart(const Chart& c, double xmin, double xmax) {
  double lo = INFINITY, hi = -INFINITY;
  for (const Series& s : c.series)
    for (double v : s.y)
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  std::string o = "<section class=\"chart\"><h2>" + esc(c.title) + "</h2>\n";
  if (!std::isfinite(lo)) {
    o += "<p class=\"empty\" data-chart=\"" + c.id + "\">no values recorded</p></section>\n";
    return o;
  }
  // 5% headroom; a flat series (or one whose spread is rounding, such as a single loss and its
  // smoothing) gets a band around its value.
  double pad = (hi - lo) * 0.05;
  if (!(pad > std::fabs(hi) * 1e-9)) pad = std::fabs(hi) > 0 ? std::fabs(hi) * 0.1 : 1;
  double ymin = lo - pad, ymax = hi + pad;
  if (lo >= 0 && ymin < 0) ymin = 0;  // counts, rates and bytes are not negative
  const Plot p(xmin, xmax, ymin, ymax);
  o += strf(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart-svg\" data-chart=\"%s\" "
      "viewBox=\"0 0 %.0f %.0f\" width=\"%.0f\" height=\"%.0f\" role=\"img\">\n",
      c.id.c_str(), kW, kH, kW, kH);
  o += strf("<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" class=\"frame\"/>\n", kLeft,
            kTop, kPlotW, kPlotH);
  // Grid and tick labels.
  const double ys = nice_step(ymax - ymin, 4);
  // (Ticks counted, not accumulated: at most a dozen whatever the rounding.)
  const double y0 = std::ceil(ymin / ys) * ys;
  for (int k = 0; k < 12 && y0 + k * ys <= ymax + ys * 1e-9; ++k) {
    const double t = y0 + k * ys;
    const double y = p.py(t);
    o += strf("<line x1=\"%.0f\" x2=\"%.0f\" y1=\"%.2f\" y2=\"%.2f\" class=\"grid\"/>", kLeft,
              kLeft + kPlotW, y, y);
    o += strf("<text x=\"%.0f\" y=\"%.2f\" class=\"tick\" text-anchor=\"end\">%s</text>\n",
              kLeft - 6, y + 4, esc(strf("%.4g", std::fabs(t) < ys * 1e-6 ? 0.0 : t)).c_str());
  }
  const double xs = std::max(1.0, nice_step(xmax - xmin, 6));
  const double x0 = std::ceil(xmin / xs) * xs;
  for (int k = 0; k < 16 && x0 + k * xs <= xmax + 1e-9; ++k) {
    const double t = x0 + k * xs;
    const double x = p.px(t);
    o += strf("<line x1=\"%.2f\" x2=\"%.2f\" y1=\"%.0f\" y2=\"%.0f\" class=\"grid\"/>", x, x, kTop,
              kTop + kPlotH);
    o += strf("<text x=\"%.2f\" y=\"%.0f\" class=\"tick\" text-anchor=\"middle\">%.0f</text>\n", x,
              kTop + kPlotH + 16, t);
  }
  o += strf("<text x=\"%.0f\" y=\"%.0f\" class=\"axis\" text-anchor=\"middle\">step</text>\n",
            kLeft + kPlotW / 2, kH - 4);
  if (!c.unit.empty())
    o += strf(
        "<text x=\"14\" y=\"%.0f\" class=\"axis\" text-anchor=\"middle\" "
        "transform=\"rotate(-90 14 %.0f)\">%s</text>\n",
        kTop + kPlotH / 2, kTop + kPlotH / 2, esc(c.unit).c_str());
  // The plot: its data-* attributes are the mapping documented in report_html.h.
  o += strf(
      "<g class=\"plot\" data-xmin=\"%.17g\" data-xmax=\"%.17g\" data-ymin=\"%.17g\" "
      "data-ymax=\"%.17g\" data-left=\"%.17g\" data-top=\"%.17g\" data-width=\"%.17g\" "
      "data-height=\"%.17g\" data-scale=\"%.17g\">\n",
      xmin, xmax, ymin, ymax, kLeft, kTop, kPlotW, kPlotH, c.scale);
  for (const Series& s : c.series) {
    const std::string style =
        strf("stroke=\"%s\" stroke-width=\"%.1f\" stroke-opacity=\"%.2f\"%s", s.color.c_str(),
             s.width, s.opacity, s.dashed ? " stroke-dasharray=\"6 4\"" : "");
    if (s.kind == Series::kLine) {
      std::string pts;
      auto flush = [&] {
        if (!pts.empty())
          o += "<polyline class=\"series\" data-series=\"" + s.name + "\" fill=\"none\" " + style +
               " points=\"" + pts + "\"/>\n";
        pts.clear();
      };
      for (size_t i = 0; i < s.x.size(); ++i) {
        if (!std::isfinite(s.y[i])) {
          flush();
          continue;
        }
        if (!pts.empty()) pts += ' ';
        pts += strf("%.2f,%.2f", p.px(s.x[i]), p.py(s.y[i]));
      }
      flush();
    } else if (s.kind == Series::kMarkers) {
      for (size_t i = 0; i < s.x.size(); ++i)
        if (std::isfinite(s.y[i]))
          o += strf(
              "<circle class=\"series\" data-series=\"%s\" cx=\"%.2f\" cy=\"%.2f\" r=\"3.5\" "
              "fill=\"%s\"/>\n",
              s.name.c_str(), p.px(s.x[i]), p.py(s.y[i]), s.color.c_str());
    } else {
      for (double v : s.y)
        if (std::isfinite(v))
          o += strf(
              "<line class=\"series\" data-series=\"%s\" x1=\"%.2f\" x2=\"%.2f\" "
              "y1=\"%.2f\" y2=\"%.2f\" %s/>\n",
              s.name.c_str(), kLeft, kLeft + kPlotW, p.py(v), p.py(v), style.c_str());
    }
  }
  o += "</g>\n</svg>\n<ul class=\"legend\">";
  for (const Series& s : c.series)
    o += strf("<li><span class=\"swatch\" style=\"background:%s\"></span>%s</li>", s.color.c_str(),
              esc(s.label).c_str());
  o += "</ul></section>\n";
  return o;
}

Series line(const std::string& name, const std::string& label, const std::string& color) {
  Series s;
  s.name = name;
  s.label = label;
  s.color = color;
  return s;
}

// The training steps' records, without the evaluation records between them.
std::vector<MetricsRecord> step_records(const RunSeries& run) {
  std::vector<MetricsRecord> out;
  for (const MetricsRecord& r : run.records)
    if (!r.evaluation) out.push_back(r);
  return out;
}

std::vector<Chart> build_charts(const RunSeries& run) {
  const std::vector<MetricsRecord> rs = step_records(run);
  std::vector<double> steps, loss;
  for (const MetricsRecord& r : rs)
    steps.push_back(static_cast<double>(r.step)), loss.push_back(r.loss);
  std::vector<Chart> charts;
  auto each = [&](double MetricsRecord::*field, double scale = 1) {
    std::vector<double> y;
    for (const MetricsRecord& r : rs) y.push_back(r.*field / scale);
    return y;
  };

  Chart lc{"loss", "Loss", "loss", 1, {}};
  Series raw = line("loss", "training loss", "#9db4d8");
  raw.x = steps, raw.y = loss, raw.width = 1.2;
  Series sm =
      line("loss_smoothed", strf("training loss, smoothed (EMA %.1f)", kLossSmoothing), "#1f4e9c");
  sm.x = steps, sm.y = smooth_ema(loss, kLossSmoothing), sm.width = 2.2;
  Series ev = line("eval_loss", "evaluation loss", "#d1495b");
  ev.kind = Series::kMarkers;  // every evaluation: the steps' and those before and after them
  for (const MetricsRecord& r : run.records)
    if (std::isfinite(r.eval_loss))
      ev.x.push_back(static_cast<double>(r.step)), ev.y.push_back(r.eval_loss);
  lc.series = {raw, sm, ev};
  charts.push_back(lc);

  // A chart of one field of the steps' records, its series named as the chart.
  auto one_line = [&](const char* id, const char* title, const char* unit, const char* label,
                      const char* color, double MetricsRecord::*field) {
    Series l = line(id, label, color);
    l.x = steps, l.y = each(field);
    charts.push_back(Chart{id, title, unit, 1, {l}});
  };
  one_line("lr", "Learning rate", "lr", "learning rate", "#2a9d8f", &MetricsRecord::lr);
  one_line("loss_scale", "Loss scale (fp16; 1 otherwise)", "scale", "loss scale", "#e9c46a",
           &MetricsRecord::loss_scale);
  one_line("tokens_per_s", "Throughput", "tokens/s", "tokens per second", "#264653",
           &MetricsRecord::tokens_per_s);

  Chart gn{"grad_norm", "Gradient norm (before clipping) and skipped steps", "norm", 1, {}};
  Series g = line("grad_norm", "gradient norm", "#6a4c93");
  g.x = steps, g.y = each(&MetricsRecord::grad_norm);
  Series sk = line("skipped", "skipped step (non-finite gradients)", "#d00000");
  sk.kind = Series::kMarkers;
  double gmax = 0;
  for (double v : g.y)
    if (std::isfinite(v)) gmax = std::max(gmax, v);
  for (const MetricsRecord& r : rs)
    if (r.skipped) {
      sk.x.push_back(static_cast<double>(r.step));
      sk.y.push_back(std::isfinite(r.grad_norm) ? r.grad_norm : gmax);
    }
  gn.series = {g, sk};
  charts.push_back(gn);

  // Per category the peak so far (a step's activations and workspace are released by its end,
  // so the bytes reserved after it would hide them), against the planner's step peak.
  Chart mem{"memory",
            "Memory per category (peak so far) against the planner's prediction",
            "MiB",
            kMiB,
            {}};
  for (int c = 0; c < QLFT_MEM_CATEGORY_COUNT; ++c) {
    bool any = run.info.has_predicted && run.info.mem_predicted[c] > 0;
    for (const MetricsRecord& r : rs) any = any || r.mem_peak[c] > 0;
    if (!any) continue;
    Series m = line(std::string("mem_peak_") + mem_key(c), mem_key(c), kCategoryColor[c]);
    for (const MetricsRecord& r : rs)
      if (r.has_mem_peak)
        m.x.push_back(static_cast<double>(r.step)), m.y.push_back(r.mem_peak[c] / kMiB);
    mem.series.push_back(m);
    if (run.info.has_predicted) {
      Series pr = line(std::string("predicted_") + mem_key(c),
                       std::string(mem_key(c)) + " predicted (step peak)", kCategoryColor[c]);
      pr.kind = Series::kHorizontal, pr.dashed = true, pr.width = 1.2;
      pr.y = {run.info.mem_predicted[c] / kMiB};
      mem.series.push_back(pr);
    }
  }
  Series tot = line("memory_bytes", "total reserved", "#000000");
  Series peak = line("memory_peak_bytes", "total peak so far", "#777777");
  for (const MetricsRecord& r : rs) {
    tot.x.push_back(static_cast<double>(r.step)), tot.y.push_back(r.memory_bytes / kMiB);
    peak.x.push_back(static_cast<double>(r.step)), peak.y.push_back(r.memory_peak_bytes / kMiB);
  }
  mem.series.push_back(tot);
  mem.series.push_back(peak);
  if (run.info.has_predicted && run.info.mem_predicted_total) {
    Series pt = line("predicted_total", "total predicted (step peak)", "#000000");
    pt.kind = Series::kHorizontal, pt.dashed = true, pt.width = 1.2;
    pt.y = {run.info.mem_predicted_total / kMiB};
    mem.series.push_back(pt);
  }
  charts.push_back(mem);

  // A field only some runs log (preference runs: margin, accuracy): its chart when a record has it.
  auto logged_chart = [&](double MetricsRecord::*field, const char* name, const char* title,
                          const char* color) {
    bool any = false;
    for (const MetricsRecord& r : rs) any = any || std::isfinite(r.*field);
    if (!any) return;
    Chart c{name, title, name, 1, {}};
    Series l = line(name, name, color);
    l.x = steps, l.y = each(field);
    c.series = {l};
    charts.push_back(c);
  };
  logged_chart(&MetricsRecord::margin, "margin", "Preference margin (chosen minus rejected)",
               "#ff7f0e");
  logged_chart(&MetricsRecord::accuracy, "accuracy", "Preference accuracy (pairs with margin > 0)",
               "#2ca02c");
  return charts;
}

void row(std::string* o, const char* key, const std::string& value) {
  *o += std::string("<tr><th>") + key + "</th><td>" + esc(value) + "</td></tr>";
}

const char* kStyle =
    "body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;background:#fff}"
    "h1{font-size:20px;margin:0 0 12px}h2{font-size:15px;margin:18px 0 4px}"
    "table{border-collapse:collapse;margin:0 24px 12px 0;display:inline-table;vertical-align:top}"
    "th{text-align:left;font-weight:600;padding:2px 12px 2px 0;color:#555}td{padding:2px 0}"
    ".frame{fill:#fafafa;stroke:#bbb}.grid{stroke:#e4e4e4}.tick{font-size:11px;fill:#555}"
    ".axis{font-size:12px;fill:#333}.legend{list-style:none;padding:0;margin:2px 0 0 78px;"
    "font-size:12px}.legend li{display:inline-block;margin-right:14px}.swatch{display:inline-"
    "block;width:12px;height:3px;margin:0 5px 3px 0}.empty{color:#888}";

}  // namespace

std::vector<double> smooth_ema(const std::vector<double>& y, double weight) {
  std::vector<double> out(y.size(), kNaN);
  double acc = 0, norm = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (!std::isfinite(y[i])) continue;
    acc = acc * weight + (1 - weight) * y[i];
    norm = norm * weight + (1 - weight);
    out[i] = acc / norm;
  }
  return out;
}

std::string render_report_html(const RunSeries& run, const ReportOptions& opt) {
  const std::vector<MetricsRecord> rs = step_records(run);
  const RunInfo& in = run.info;
  const double now = std::isfinite(opt.generated_unix) ? opt.generated_unix
                                                       : static_cast<double>(std::time(nullptr));
  const uint64_t last_step = rs.empty() ? 0 : rs.back().step;
  std::string status = opt.status;
  if (status.empty())
    status = in.total_steps && last_step >= in.total_steps ? "finished" : "in progress or stopped";

  std::string o = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">";
  if (opt.refresh_seconds)
    o += strf("<meta http-equiv=\"refresh\" content=\"%u\">", opt.refresh_seconds);
  o += "<title>qlft training report" + (in.model.empty() ? "" : ": " + esc(in.model)) +
       "</title><style>" + kStyle + "</style></head>\n<body>\n";
  o += "<h1>qlft training report</h1>\n<div class=\"header\">";

  // Run and settings.
  o += "<table class=\"run\">";
  row(&o, "model", in.model.empty() ? "-" : in.model);
  if (!in.architecture.empty())
    row(&o, "architecture", in.architecture + (in.quant_type.empty() ? "" : ", " + in.quant_type));
  if (in.lora_r)
    row(&o, "adapter",
        strf("LoRA r %lld, alpha %s, targets %s", (long long)in.lora_r,
             num_or_dash(in.lora_alpha, "%g").c_str(), in.lora_targets.c_str()));
  if (!in.precision.empty()) row(&o, "precision", in.precision);
  if (in.micro_batch)
    row(&o, "batch",
        strf("micro-batch %lld x accumulation %lld, seq_len %lld", (long long)in.micro_batch,
             (long long)in.accumulation, (long long)in.seq_len));
  if (in.present)
    row(&o, "data",
        strf("%llu %s, %llu tokens, %llu train / %llu eval sequences",
             (unsigned long long)in.data_records, in.data_records == 1 ? "record" : "records",
             (unsigned long long)in.data_tokens, (unsigned long long)in.train_sequences,
             (unsigned long long)in.eval_sequences));
  o += "</table>";

  // Progress and final figures.
  double tokens = 0;
  uint64_t skipped = 0;
  uint64_t mem_peak = 0;
  for (const MetricsRecord& r : rs) {
    tokens += static_cast<double>(r.tokens);
    skipped += r.skipped ? 1 : 0;
    mem_peak = std::max(mem_peak, r.memory_peak_bytes);
  }
  // Every evaluation, in file order: "step 0: 2.7068, step 30: 0.8263 (-69.5%)".
  std::vector<const MetricsRecord*> evals;
  double best_eval = kNaN;
  for (const MetricsRecord& r : run.records)
    if (std::isfinite(r.eval_loss)) {
      evals.push_back(&r);
      if (!(best_eval <= r.eval_loss)) best_eval = r.eval_loss;
    }
  std::string eval_list;
  for (size_t i = 0; i < evals.size(); ++i) {
    if (evals.size() > kEvalListed && i == kEvalListed / 2) {
      eval_list += strf(", ... (%zu more)", evals.size() - kEvalListed);
      i = evals.size() - kEvalListed / 2;
    }
    eval_list += strf("%sstep %llu: %.4f", eval_list.empty() ? "" : ", ",
                      (unsigned long long)evals[i]->step, evals[i]->eval_loss);
  }
  if (evals.size() > 1 && evals.front()->eval_loss > 0)
    eval_list +=
        strf(" (%+.1f%%)", 100.0 * (evals.back()->eval_loss / evals.front()->eval_loss - 1));
  std::vector<double> loss;
  for (const MetricsRecord& r : rs) loss.push_back(r.loss);
  const std::vector<double> sm = smooth_ema(loss, kLossSmoothing);
  const double elapsed = rs.empty() ? kNaN : rs.back().elapsed_s;
  o += "<table class=\"progress\">";
  row(&o, "status", status);
  row(&o, "steps",
      in.total_steps
          ? strf("%llu of %llu", (unsigned long long)last_step, (unsigned long long)in.total_steps)
          : strf("%llu", (unsigned long long)last_step));
  row(&o, "run time", human_seconds(elapsed));
  if (status != "finished" && in.total_steps > last_step && !rs.empty() && elapsed > 0) {
    // The pace of this process's steps (a resumed run's elapsed time starts at its resume).
    size_t since = 0;
    for (size_t i = rs.size(); i-- > 0;) {
      if (i + 1 < rs.size() && rs[i].elapsed_s > rs[i + 1].elapsed_s) break;
      ++since;
    }
    row(&o, "ETA",
        human_seconds(elapsed / static_cast<double>(since) *
                      static_cast<double>(in.total_steps - last_step)));
  }
  row(&o, "loss (last, smoothed)",
      rs.empty() ? "-" : num_or_dash(rs.back().loss) + ", " + num_or_dash(sm.back()));
  row(&o, "eval loss (first, last, best)",
      evals.empty() ? "-, -, -"
                    : num_or_dash(evals.front()->eval_loss) + ", " +
                          num_or_dash(evals.back()->eval_loss) + ", " + num_or_dash(best_eval));
  row(&o, "evaluations", evals.empty() ? "none" : eval_list);
  row(&o, "tokens trained", strf("%.0f", tokens));
  row(&o, "skipped steps", strf("%llu", (unsigned long long)skipped));
  row(&o, "memory peak",
      human_bytes(static_cast<double>(mem_peak)) +
          (in.mem_predicted_total
               ? " (predicted " + human_bytes(static_cast<double>(in.mem_predicted_total)) + ")"
               : std::string()));
  std::time_t gt = static_cast<std::time_t>(now);
  char when[64] = "";
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&gt));
  row(&o, "generated", when);
  o += "</table></div>\n";

  if (rs.empty()) {
    o += "<p class=\"empty\">no steps recorded yet</p>\n";
  } else {
    double xmin = static_cast<double>(rs.front().step);
    double xmax = static_cast<double>(rs.back().step);
    for (const MetricsRecord& r : run.records) {  // the evaluation before training included
      xmin = std::min(xmin, static_cast<double>(r.step));
      xmax = std::max(xmax, static_cast<double>(r.step));
    }
    if (!(xmax > xmin)) xmax = xmin + 1;
    for (const Chart& c : build_charts(run)) o += render_chart(c, xmin, xmax);
  }
  o += "</body></html>\n";
  return o;
}

void write_report(const std::string& run_dir, const std::string& out_path,
                  const ReportOptions& opt) {
  const RunSeries run = read_metrics(run_dir + "/metrics.jsonl");
  AtomicFile f(out_path);
  f.write(render_report_html(run, opt));
  f.commit();
}

}  // namespace qlft::report
