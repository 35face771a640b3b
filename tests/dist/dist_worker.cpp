// One rank of the mpirun-driven distributed tests (tests/dist/*.sh run it under mpirun, or
// alone as the 1-rank reference).
//
//   dist_worker comm RESULT
//       collectives checked against closed-form values (sums of rank-dependent data).
//   dist_worker train MODEL DATA CURVE [key=value ...]
//       a stories260K LoRA fine-tune with the qlft config keys given; rank 0 writes one
//       "step loss grad_norm" line per step to CURVE, and when training ends normally the final
//       LoRA weights (every A and B, HF order, raw float32) to CURVE.lora. Worker keys:
//         w.save_at=K w.ckpt=PATH   save a checkpoint after step K (every rank calls it)
//         w.save_every=1            save after every step to w.ckpt
//         w.resume=PATH             resume from PATH first
//         w.die_rank=R w.die_at=K   rank R SIGKILLs itself just before step K
//         w.result=PATH             each rank appends "rank R status NAME seconds S" (the
//                                   status of the training loop and how long its last step
//                                   took), and the message
//         w.die_acquire=N           rank w.die_rank SIGKILLs itself at its N-th weight-unit
//                                   acquire (ZeRO-3: inside a step, when the peers are gathering)
//         w.eval_rank=R             rank R alone (-1: every rank) evaluates the held-out split
//                                   (set data.eval_fraction) after step w.eval_at (if given)
//                                   and after the last step, while its peers go on; it writes
//                                   "step loss tokens" lines to CURVE.eval
//         w.gen=N                   then rank max(R, 0) alone generates N greedy tokens from
//                                   the first 8 tokens of the data with the trained adapter and
//                                   writes their ids to CURVE.gen
//         w.mem=PATH                each rank writes to PATH.R the tracker's weights and
//                                   communication bytes (allocated, and peak since the trainer
//                                   was built; gradients too, at the end of the line, with this
//                                   rank's planned gradients and communication), and with
//                                   ZeRO-3 whether the model refuses use
//                                   after the trainer ended; its backend's device ordinal, the
//                                   host<->device bytes of the steps after the first, and the
//                                   device peaks of weights, optimizer state and all live bytes,
//                                   the planner's host<->device bytes per step, and its device
//                                   training peak, weights and communication beside the
//                                   tracker's device communication peak; the weights peak
//                                   while loading and sharding, and this rank's planned one
//   dist_worker slow RESULT
//       rank 1 reaches a barrier at 85% of a 4 s timeout (inside rank 0's liveness probe
//       window), twice: the barriers must succeed, and the collectives after them, with stale
//       probes
//       about. (Mismatched collectives cannot be tested: MPI may match them with each other.)
//   dist_worker compare A B TOL [FIRST_STEP]
//       the curves hold the same steps (from FIRST_STEP on: a truncated run fails) and agree
//       step by step within relative TOL, and the final LoRA weights A.lora and B.lora agree
//       within TOL (max |a-b| / max |b|; TOL 0: bit for bit).
// Exit 0 on success, 1 on a failed check, 2 on a usage error.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "config/config.h"
#include "train/planner.h"
#include "core/error.h"
#include "core/threads.h"
#include "data/dataset.h"
#include "data/text_encoder.h"
#include "data/tokenizer_encoder.h"
#include "core/communicator.h"
#include "parallel/comm_select.h"
#include "backend/backend.h"
#include "model/generate.h"
#include "model/model.h"
#include "model/weight_stream.h"
#include "tokenizer/tokenizer.h"
#include "train/trainer.h"

using namespace qlft;

namespace {

int check_comm(const std::string& result) {
  auto comm = dist::make_communicator(qlft::DistBackend::Mpi, 20);
  const int r = comm->rank(), w = comm->world();
  std::vector<std::string> errors;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) errors.push_back(what);
  };
  // all_reduce sum/avg: element i of rank r is r * 1000 + i.
  const size_t n = 1000;
  std::vector<float> a(n);
  for (size_t i = 0; i < n; ++i) a[i] = static_cast<float>(r * 1000 + i);
  comm->all_reduce(a.data(), n, dist::ReduceOp::Sum);
  const double rank_sum = w * (w - 1) / 2.0;
  for (size_t i = 0; i < n; ++i)
    if (a[i] != static_cast<float>(rank_sum * 1000 + w * static_cast<double>(i))) {
      expect(false, "all_reduce sum at " + std::to_string(i));
      break;
    }
  std::vector<double> d{static_cast<double>(r), 1.0};
  comm->all_reduce(d.data(), 2, dist::ReduceOp::Avg);
  expect(d[0] == rank_sum / w && d[1] == 1.0, "all_reduce avg (double)");
  // reduce_scatter: rank r sends block b filled with (r + 1) * (b + 1); block b sums to
  // (b + 1) * w (w + 1) / 2.
  const size_t k = 37;
  std::vector<float> in(k * w), out(k, -1);
  for (int b = 0; b < w; ++b)
    for (size_t i = 0; i < k; ++i) in[b * k + i] = static_cast<float>((r + 1) * (b + 1));
  comm->reduce_scatter(in.data(), out.data(), k, dist::ReduceOp::Sum);
  for (size_t i = 0; i < k; ++i)
    if (out[i] != static_cast<float>((r + 1) * w * (w + 1) / 2)) {
      expect(false, "reduce_scatter");
      break;
    }
  // reduce to the last rank: element i of rank r is r + i; the root gets w (w - 1) / 2 + w i.
  {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(r + i);
    comm->reduce(v.data(), n, w - 1, dist::ReduceOp::Sum);
    if (r == w - 1)
      for (size_t i = 0; i < n; ++i)
        if (v[i] != static_cast<float>(rank_sum + w * static_cast<double>(i))) {
          expect(false, "reduce at " + std::to_string(i));
          break;
        }
  }
  // all_gather: block b is rank b's values b + i / 1000.
  std::vector<float> mine(k), all(k * w);
  for (size_t i = 0; i < k; ++i) mine[i] = static_cast<float>(r + i / 1000.0);
  comm->all_gather(mine.data(), all.data(), k);
  for (int b = 0; b < w; ++b)
    for (size_t i = 0; i < k; ++i)
      if (all[b * k + i] != static_cast<float>(b + i / 1000.0)) {
        expect(false, "all_gather");
        b = w;
        break;
      }
  // broadcast from the last rank, and variable-size byte gathers.
  char text[32] = {};
  if (r == w - 1) std::snprintf(text, sizeof text, "from %d", r);
  comm->broadcast(text, sizeof text, w - 1);
  expect(std::string(text) == "from " + std::to_string(w - 1), "broadcast");
  std::vector<std::string> blobs = comm->all_gather_bytes(std::string(r * 3 + 1, 'a' + r));
  for (int b = 0; b < w; ++b)
    expect(blobs[b] == std::string(b * 3 + 1, 'a' + b),
           "all_gather_bytes from " + std::to_string(b));
  // Byte gathers: a size in 64-byte units and an odd one, two in flight at once (the ZeRO-3
  // prefetch), byte i of rank b's block is (b * 31 + i) % 251.
  {
    const size_t sizes[2] = {4096, 1001};
    std::vector<std::vector<unsigned char>> in(2), outb(2);
    std::vector<std::unique_ptr<dist::PendingCollective>> pend;
    for (int k = 0; k < 2; ++k) {
      in[k].resize(sizes[k]);
      outb[k].assign(sizes[k] * w, 0);
      for (size_t i = 0; i < sizes[k]; ++i)
        in[k][i] = static_cast<unsigned char>((r * 31 + i) % 251);
      pend.push_back(comm->start_all_gather_raw(in[k].data(), outb[k].data(), sizes[k]));
    }
    for (auto& p : pend) p->wait();
    for (int k = 0; k < 2; ++k)
      for (int b = 0; b < w; ++b)
        for (size_t i = 0; i < sizes[k]; ++i)
          if (outb[k][b * sizes[k] + i] != static_cast<unsigned char>((b * 31 + i) % 251)) {
            expect(false, "all_gather_raw of " + std::to_string(sizes[k]) + " bytes");
            b = w;
            break;
          }
  }
  comm->barrier();
  expect(comm->sum(static_cast<int64_t>(r + 1)) == static_cast<int64_t>(w) * (w + 1) / 2,
         "sum(int64)");
  // Ranks that disagree are told so (every rank passes its own rank: they differ when w > 1).
  bool threw = false;
  try {
    comm->check_same(static_cast<uint64_t>(r), "the rank");
  } catch (const Error& e) {
    threw = e.status() == QLFT_ERR_DISTRIBUTED;
  }
  expect(threw == (w > 1), "check_same on different values");
  comm->check_same(42, "a constant");  // must not throw

  std::FILE* f = std::fopen((result + "." + std::to_string(r)).c_str(), "w");
  if (!f) return 1;
  std::fprintf(f, "rank %d world %d local %d errors %zu\n", r, w, comm->local_rank(),
               errors.size());
  for (const std::string& e : errors) std::fprintf(f, "FAIL %s\n", e.c_str());
  std::fclose(f);
  return errors.empty() ? 0 : 1;
}

int check_slow(const std::string& result) {
  auto comm = dist::make_communicator(qlft::DistBackend::Mpi, 4.0);
  const int r = comm->rank();
  std::string outcome = "ok";
  try {
    for (int round = 0; round < 2; ++round) {
      if (r == 1) ::usleep(3400 * 1000);  // 0.85 x timeout: inside the probe window
      comm->barrier();
      if (comm->sum(int64_t{1}) != comm->world()) outcome = "bad sum";
    }
  } catch (const Error& e) {
    outcome = std::string("slow peer failed: ") + e.what();
  }
  std::FILE* f = std::fopen((result + "." + std::to_string(r)).c_str(), "w");
  if (!f) return 1;
  std::fprintf(f, "%s\n", outcome.c_str());
  std::fclose(f);
  return outcome == "ok" ? 0 : 1;
}

// Delegates to the trainer's stream; kills this process at the n-th acquire (rank failure
// inside a ZeRO-3 weight gather).
class DieAtAcquire final : public WeightStream {
 public:
  DieAtAcquire(std::shared_ptr<WeightStream> inner, long n) : inner_(std::move(inner)), n_(n) {}
  void acquire(int u, int next) override {
    if (++count_ == n_) ::kill(::getpid(), SIGKILL);
    inner_->acquire(u, next);
  }
  void release(int u) noexcept override { inner_->release(u); }
  std::string describe() const override { return inner_->describe(); }

 private:
  std::shared_ptr<WeightStream> inner_;
  long n_, count_ = 0;
};

std::map<int, std::vector<double>> read_curve(const std::string& path) {
  std::map<int, std::vector<double>> m;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    // strtod, not >>: a skipped step's grad_norm is "inf".
    char* p = nullptr;
    long step = std::strtol(line.c_str(), &p, 10);
    char* q = nullptr;
    double loss = std::strtod(p, &q);
    char* e = nullptr;
    double norm = std::strtod(q, &e);
    if (p != line.c_str() && q != p && e != q) m[static_cast<int>(step)] = {loss, norm};
  }
  return m;
}

std::vector<float> read_floats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

// The final LoRA weights of two runs: same count, max |a-b| / max |b| within tol.
int compare_weights(const std::string& a, const std::string& b, double tol) {
  const std::vector<float> x = read_floats(a), y = read_floats(b);
  if (x.empty() || y.empty()) {
    std::printf("final LoRA weights missing (%s: %zu floats, %s: %zu floats)\n", a.c_str(),
                x.size(), b.c_str(), y.size());
    return 1;
  }
  if (x.size() != y.size()) {
    std::printf("final LoRA weights: %zu vs %zu floats\n", x.size(), y.size());
    return 1;
  }
  double scale = 1e-30, err = 0;
  size_t worst = 0;
  for (size_t i = 0; i < y.size(); ++i) scale = std::max(scale, double(std::fabs(y[i])));
  for (size_t i = 0; i < y.size(); ++i) {
    const double d =
        std::isnan(x[i]) != std::isnan(y[i]) ? INFINITY : std::fabs(double(x[i]) - y[i]);
    if (!(d <= err)) err = d, worst = i;
  }
  const double rel = err / scale;
  std::printf(
      "final LoRA weights: %zu floats, max difference %.3g of max |w| %.3g (relative %.3g)\n",
      y.size(), err, scale, rel);
  if (!(rel <= tol)) {
    std::printf("final LoRA weights differ: [%zu] %.9g vs %.9g (relative %.3g > %.3g)\n", worst,
                x[worst], y[worst], rel, tol);
    return 1;
  }
  return 0;
}

int compare(const std::string& a, const std::string& b, double tol, int first) {
  auto x = read_curve(a), y = read_curve(b);
  int compared = 0, bad = 0;
  for (const auto& [step, v] : y) {
    if (step >= first && !x.count(step)) {
      std::printf("step %d missing from %s (a truncated run?)\n", step, a.c_str());
      ++bad;
    }
  }
  for (const auto& [step, v] : x) {
    if (step < first) continue;
    auto it = y.find(step);
    if (it == y.end()) {
      std::printf("step %d missing from %s\n", step, b.c_str());
      ++bad;
      continue;
    }
    for (int k = 0; k < 2; ++k) {
      const double a = v[k], b = it->second[k];
      double rel = a == b ? 0.0 : std::fabs(a - b) / std::max(std::fabs(b), 1e-12);
      if (!(rel <= tol)) {
        std::printf("step %d %s: %.9g vs %.9g (relative %.3g > %.3g)\n", step,
                    k ? "grad_norm" : "loss", v[k], it->second[k], rel, tol);
        ++bad;
      }
    }
    ++compared;
  }
  if (compared == 0) {
    std::printf("no steps to compare in %s\n", a.c_str());
    return 1;
  }
  std::printf("%d steps compared, %d mismatches\n", compared, bad);
  if (compare_weights(a + ".lora", b + ".lora", tol) != 0) ++bad;
  return bad ? 1 : 0;
}

// CURVE.lora: every A and B in the adapter's fixed order (layer, projection, A then B).
void write_final_lora(const LoraAdapter& lora, const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw_error(QLFT_ERR_IO, "cannot write %s", path.c_str());
  for (int l = 0; l < lora.n_layers(); ++l)
    for (int p = 0; p < kProjCount; ++p) {
      if (!lora.targets(static_cast<Proj>(p))) continue;
      for (auto part : {LoraAdapter::Part::A, LoraAdapter::Part::B}) {
        const std::vector<float> v = lora.get_hf(l, static_cast<Proj>(p), part);
        if (std::fwrite(v.data(), 4, v.size(), f) != v.size())
          throw_error(QLFT_ERR_IO, "cannot write %s", path.c_str());
      }
    }
  if (std::fclose(f) != 0) throw_error(QLFT_ERR_IO, "cannot write %s", path.c_str());
}

int train(const std::string& model_path, const std::string& data_path, const std::string& curve,
          const std::vector<std::string>& kv) {
  Config c;
  c.set("lora.r", "4");
  c.set("lora.alpha", "8");
  c.set("optim.lr", "3e-3");
  c.set("seed", "5");
  c.set("data.seq_len", "64");
  std::map<std::string, std::string> w;
  for (const std::string& s : kv) {
    size_t eq = s.find('=');
    if (eq == std::string::npos)
      throw_error(QLFT_ERR_INVALID_ARGUMENT, "bad key=value '%s'", s.c_str());
    std::string k = s.substr(0, eq), v = s.substr(eq + 1);
    if (k.rfind("w.", 0) == 0)
      w[k] = v;
    else
      c.set(k, v);
  }
  auto wint = [&](const char* k, long dflt) {
    return w.count(k) ? std::strtol(w[k].c_str(), nullptr, 10) : dflt;
  };
  set_num_threads(1);
  MemoryTracker tracker;
  LoadOptions lo;
  lo.quant_type = parse_run_spec(c).quant.type;
  lo.deferred = load_into_shards(qlft::parse_run_spec(c));  // as qlft_model_load decides it
  auto model = load_model(&tracker, model_path, lo);
  // A model file without a tokenizer (the synthetic fixtures) reads the text as bytes (ASCII
  // text: ids below 128, within their vocabulary of 160).
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<data::TextEncoder> enc;
  if (model->gguf && model->gguf->find("tokenizer.ggml.model")) {
    tok = Tokenizer::from_gguf(*model->gguf);
    enc = std::make_unique<data::TokenizerEncoder>(*tok);
  } else {
    enc = std::make_unique<data::ByteEncoder>(std::vector<std::string>{});
  }
  c.set("data.path", data_path);
  auto ds =
      std::make_unique<data::Dataset>(data::Dataset::build(qlft::parse_run_spec(c).data, *enc));

  int rank = 0;
  int32_t status = QLFT_OK;
  std::string message;
  double last_step_s = 0;
  std::FILE* out = nullptr;
  std::string mem;
  double step_s_sum = 0;
  int steps_run = 0;
  uint64_t h2d_later = 0, d2h_later = 0;  // host<->device bytes of steps 2, 3, ...
  try {
    // The planner's host<->device bytes of a step (backend=cuda), from the resident model.
    const WeightFootprint footprint =
        weight_footprint_for_plan(*model, qlft::parse_run_spec(c).quant);
    const MemoryPlan plan =
        plan_memory(model->cfg, footprint, PlanSettings::from_spec(qlft::parse_run_spec(c)));
    Trainer t(*model, &tracker, ds.get(), qlft::parse_run_spec(c));
    rank = t.rank();
    // This rank's own plan (ZeRO-2: its gradient share), beside what its tracker measures.
    const MemoryPlan mine = plan_memory_of_rank(
        model->cfg, footprint, PlanSettings::from_spec(qlft::parse_run_spec(c)), rank);
    // The load and the sharding (a deferred load: one group at a time beside the shards).
    const uint64_t setup_weights_peak =
        tracker.snapshot().peak[static_cast<int>(MemCategory::Weights)];
    tracker.reset_peaks();  // w.mem: what training holds, not the full load before sharding
    if (w.count("w.die_acquire") && rank == wint("w.die_rank", -1))
      t.placement().own().stream =
          std::make_shared<DieAtAcquire>(t.placement().own().stream, wint("w.die_acquire", 0));
    if (w.count("w.resume")) t.resume(w["w.resume"]);
    if (t.is_writer()) {
      out = std::fopen(curve.c_str(), w.count("w.resume") ? "a" : "w");
      if (!out) throw_error(QLFT_ERR_IO, "cannot write %s", curve.c_str());
    }
    const long save_at = wint("w.save_at", -1), save_every = wint("w.save_every", 0);
    const long die_rank = wint("w.die_rank", -1), die_at = wint("w.die_at", -1);
    const bool evaluating = w.count("w.eval_rank") || w.count("w.gen");
    const long eval_rank = wint("w.eval_rank", -1), eval_at = wint("w.eval_at", 0);
    const int eval_writer = eval_rank < 0 ? 0 : static_cast<int>(eval_rank);
    auto evaluate = [&](long step) {
      if (!w.count("w.eval_rank") || (eval_rank >= 0 && rank != eval_rank)) return;
      const EvalReport e = t.evaluate(*ds, true);
      if (rank != eval_writer) return;
      std::FILE* f = std::fopen((curve + ".eval").c_str(), "a");
      if (!f) throw_error(QLFT_ERR_IO, "cannot write %s.eval", curve.c_str());
      std::fprintf(f, "%ld %.9g %lld\n", step, e.loss, static_cast<long long>(e.tokens));
      std::fclose(f);
    };
    while (!t.done()) {
      if (t.rank() == die_rank && t.steps_done() + 1 == die_at) ::kill(::getpid(), SIGKILL);
      StepReport r;
      auto t0 = std::chrono::steady_clock::now();
      try {
        if (!t.step(&r)) break;
      } catch (...) {
        last_step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        throw;
      }
      last_step_s = r.seconds;
      step_s_sum += r.seconds;
      if (steps_run > 0) {
        h2d_later += r.moved.host_to_device;
        d2h_later += r.moved.device_to_host;
      }
      ++steps_run;
      if (out) {
        std::fprintf(out, "%lld %.9g %.9g\n", static_cast<long long>(r.step), r.loss, r.grad_norm);
        std::fflush(out);
      }
      if (r.step == save_at || save_every > 0) t.save_checkpoint(w["w.ckpt"]);
      if (evaluating && eval_at > 0 && r.step == eval_at) evaluate(r.step);
    }
    if (evaluating) evaluate(t.steps_done());
    if (w.count("w.gen") && rank == eval_writer) {
      auto be = make_cpu_backend(&tracker);
      Generator g(*model, *be, &t.lora());
      const int sl = ds->train().seq_len();
      std::vector<int32_t> row(static_cast<size_t>(sl) * 4);
      ds->train().fill_row(0, 0, row.data(), row.data() + sl, row.data() + 2 * sl,
                           row.data() + 3 * sl);
      const std::vector<int32_t> prompt(row.begin(), row.begin() + 8);
      GenerateOptions go;
      go.max_tokens = static_cast<int>(wint("w.gen", 8));
      const std::vector<int32_t> ids = g.generate(prompt, go);
      std::FILE* f = std::fopen((curve + ".gen").c_str(), "w");
      if (!f) throw_error(QLFT_ERR_IO, "cannot write %s.gen", curve.c_str());
      for (int32_t id : ids) std::fprintf(f, "%d ", id);
      std::fprintf(f, "\n");
      std::fclose(f);
    }
    // (a collective with a sharded adapter: the others' tensors are gathered on rank 0)
    t.with_whole_adapter([&] {
      if (t.is_writer()) write_final_lora(t.lora(), curve + ".lora");
    });
    if (w.count("w.mem")) {
      MemorySnapshot m = tracker.snapshot();
      const int wt = static_cast<int>(MemCategory::Weights);
      const int cm = static_cast<int>(MemCategory::Communication);
      mem = strf(
          "rank %d weights_allocated %llu weights_peak %llu communication_peak %llu "
          "peak_rss %llu mean_step_s %.4f device %d h2d_later %llu d2h_later %llu "
          "device_weights_peak %llu device_optimizer_peak %llu device_live_peak %llu "
          "planned_h2d_per_step %llu planned_d2h_per_step %llu planned_device_peak %llu "
          "planned_device_weights %llu planned_device_communication %llu "
          "device_communication_peak %llu gradients_allocated %llu gradients_peak %llu "
          "planned_gradients %llu communication_allocated %llu planned_communication %llu "
          "setup_weights_peak %llu deferred %d planned_weights_peak %llu",
          rank, static_cast<unsigned long long>(m.allocated[wt]),
          static_cast<unsigned long long>(m.peak[wt]), static_cast<unsigned long long>(m.peak[cm]),
          static_cast<unsigned long long>(process_peak_rss()),
          steps_run ? step_s_sum / steps_run : 0.0, t.backend().device_index(),
          static_cast<unsigned long long>(h2d_later), static_cast<unsigned long long>(d2h_later),
          static_cast<unsigned long long>(m.device_peak[wt]),
          static_cast<unsigned long long>(m.device_peak[static_cast<int>(MemCategory::Optimizer)]),
          static_cast<unsigned long long>(m.device_live_peak),
          static_cast<unsigned long long>(plan.device_h2d_per_step),
          static_cast<unsigned long long>(plan.device_d2h_per_step),
          static_cast<unsigned long long>(plan.device_train_peak),
          static_cast<unsigned long long>(plan.device_train[wt]),
          static_cast<unsigned long long>(plan.device_train[cm]),
          static_cast<unsigned long long>(m.device_peak[cm]),
          static_cast<unsigned long long>(m.allocated[static_cast<int>(MemCategory::Gradients)]),
          static_cast<unsigned long long>(m.peak[static_cast<int>(MemCategory::Gradients)]),
          static_cast<unsigned long long>(mine.train[static_cast<int>(MemCategory::Gradients)]),
          static_cast<unsigned long long>(m.allocated[cm]),
          static_cast<unsigned long long>(mine.train[cm]),
          static_cast<unsigned long long>(setup_weights_peak), lo.deferred ? 1 : 0,
          static_cast<unsigned long long>(mine.peak[wt]));
    }
  } catch (const Error& e) {
    status = e.status();
    message = e.what();
  }
  if (w.count("w.mem") && status == QLFT_OK) {
    // After the trainer: the model is as loaded (the trainer sharded its own copy,
    // train/weight_placement.h): resident, or a deferred load that still reads its units.
    std::string after = "resident";
    if (model->stream) {
      try {
        UnitUse u(model->stream.get(), kEmbeddingUnit, kNoUnit);
        after = "usable";
      } catch (const Error& e) {
        after = std::string("failed:") + e.what();
      }
    }
    std::FILE* f = std::fopen((w["w.mem"] + "." + std::to_string(rank)).c_str(), "w");
    if (f) {
      std::fprintf(f, "%s after_end %s\n", mem.c_str(), after.c_str());
      std::fclose(f);
    }
  }
  if (out) std::fclose(out);
  if (w.count("w.result")) {
    std::FILE* f = std::fopen((w["w.result"] + "." + std::to_string(rank)).c_str(), "w");
    if (f) {
      std::fprintf(f, "rank %d status %s seconds %.3f\n%s\n", rank, qlft_status_string(status),
                   last_step_s, message.c_str());
      std::fclose(f);
    }
  }
  if (status != QLFT_OK) {
    std::fprintf(stderr, "rank %d: %s: %s\n", rank, qlft_status_string(status), message.c_str());
    // After a distributed failure, exit without MPI_Finalize (the peers are gone).
    std::fflush(nullptr);
    _exit(3);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> a(argv + 1, argv + argc);
  try {
    if (a.size() == 2 && a[0] == "comm") return check_comm(a[1]);
    if (a.size() == 2 && a[0] == "slow") return check_slow(a[1]);
    if (a.size() >= 4 && a[0] == "train")
      return train(a[1], a[2], a[3], std::vector<std::string>(a.begin() + 4, a.end()));
    if ((a.size() == 4 || a.size() == 5) && a[0] == "compare")
      return compare(a[1], a[2], std::strtod(a[3].c_str(), nullptr),
                     a.size() == 5 ? std::atoi(a[4].c_str()) : 0);
  } catch (const Error& e) {
    std::fprintf(stderr, "dist_worker: %s: %s\n", qlft_status_string(e.status()), e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: see tests/dist/dist_worker.cpp\n");
  return 2;
}
