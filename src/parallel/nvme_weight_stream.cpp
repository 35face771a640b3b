#include "parallel/nvme_weight_stream.h"

#include <malloc.h>

#include <algorithm>
#include <map>

#include "core/error.h"
#include "core/log.h"
#include "model/model.h"

namespace qlft {

namespace {

constexpr uint64_t kAlign = 4096;  // file offsets: page (and O_DIRECT) aligned

uint64_t align_up(uint64_t v) {
  return (v + kAlign - 1) / kAlign * kAlign;
}

}  // namespace

NvmeWeightStream::NvmeWeightStream(Model& model, MemoryTracker* tracker, std::string dir,
                                   int read_ahead)
    : model_(model), tracker_(tracker), dir_(std::move(dir)), read_ahead_(read_ahead) {}

NvmeWeightStream::~NvmeWeightStream() {
  if (file_)
    log_message(QLFT_LOG_INFO,
                "offload.params=nvme: %s read back from %s; at most %s of base weights were "
                "resident at once",
                format_bytes(file_->bytes_read()).c_str(), file_->name().c_str(),
                format_bytes(peak_resident_).c_str());
  // The model may outlive its stream only by being destroyed with it (model.stream owns it);
  // whatever is still resident stays in the model.
  for (Record& r : records_)
    if (r.io) {
      try {
        file_->wait(r.io);
      } catch (...) {
      }
      r.io = 0;
    }
}

std::shared_ptr<NvmeWeightStream> NvmeWeightStream::offload(Model& model, const Model& host,
                                                            MemoryTracker* tracker,
                                                            const std::string& dir,
                                                            int read_ahead) {
  QLFT_CHECK_ARG(!model.stream, "%s: the base weights are already streamed (%s)",
                 model.path.c_str(), model.stream ? model.stream->describe().c_str() : "");
  QLFT_CHECK_ARG(read_ahead >= 0, "offload read-ahead must be >= 0, got %d", read_ahead);
  std::shared_ptr<NvmeWeightStream> s(
      new NvmeWeightStream(model, tracker, offload_dir_or_temp(dir), read_ahead));
  const int L = model.cfg.n_layers;
  s->units_.resize(unit_count(L));
  s->in_use_.assign(unit_count(L), 0);
  // Each of model's storage Buffers with the one holding its bytes.
  std::map<const Buffer*, const Buffer*> bytes_of;
  {
    const std::vector<const Buffer*> bytes = weight_bytes_in(host, model, "offload.params=nvme");
    size_t i = 0;
    for_each_weight_buffer(model, [&](int, Buffer& b) { bytes_of[&b] = bytes[i++]; });
  }
  std::map<const Buffer*, int> index;  // a Buffer shared by two units is one record
  std::vector<const Buffer*> source;   // per record: the bytes written
  auto add = [&](int u, Buffer& b, const char* what) {
    const Buffer& h = *bytes_of.at(&b);
    if (h.empty()) return;
    auto it = index.find(&b);
    if (it == index.end()) {
      Record r{&b, h.size(), s->file_bytes_, what};
      s->file_bytes_ = align_up(s->file_bytes_ + h.size());
      it = index.emplace(&b, static_cast<int>(s->records_.size())).first;
      s->records_.push_back(r);
      source.push_back(&h);
    }
    s->units_[u].push_back(it->second);
  };
  auto add_q = [&](int u, QWeight& w, const char* what) {
    add(u, w.data, what);
    add(u, w.absmax, what);
    add(u, w.nested_absmax, what);
    add(u, w.code, what);
    add(u, w.nested_code, what);
    add(u, w.scb, what);
  };
  add_q(kEmbeddingUnit, model.tok_embd, "token embedding");
  for (int l = 0; l < L; ++l) {
    LayerWeights& lw = model.layers[l];
    add(layer_unit(l), lw.attn_norm, "attn norm");
    add(layer_unit(l), lw.ffn_norm, "ffn norm");
    for (QWeight& q : lw.proj) add_q(layer_unit(l), q, "projection");
    for (Buffer& b : lw.bias) add(layer_unit(l), b, "bias");
    add(layer_unit(l), lw.q_norm, "q norm");
    add(layer_unit(l), lw.k_norm, "k norm");
  }
  add(head_unit(L), model.output_norm, "output norm");
  // The head reads model.head(): the output matrix, or the embedding when they are tied.
  add_q(head_unit(L), model.output.rows ? model.output : model.tok_embd, "output head");

  s->file_ = UringFile::create_temp(s->dir_, "base weights");
  s->file_->resize(s->file_bytes_);
  for (size_t i = 0; i < s->records_.size(); ++i) {
    const Record& r = s->records_[i];
    s->file_->write_async(source[i]->data(), r.bytes, r.off);
  }
  s->file_->wait_all();  // throws QLFT_ERR_IO with the model untouched
  if (&host == &model)
    for (const Record& r : s->records_) r.slot->reset();
#ifdef __GLIBC__
  // Freeing a large block makes glibc raise its mmap threshold to that block's size (up to 32
  // MiB), after which blocks up to that size come from the heap, where freed memory stays
  // resident: the activations freed after each step would then keep their pages and eat the
  // saving (measured: 90 MiB of the 171 MiB on SmolLM2-135M). Setting the threshold fixes it
  // at glibc's default (128 KiB): large buffers keep their own mappings, returned when freed.
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
#endif
  model.stream = s;
  log_message(QLFT_LOG_INFO,
              "offload.params=nvme: %s of base weights moved to %s (%s, %d units read ahead)",
              format_bytes(s->file_bytes_).c_str(), s->file_->name().c_str(), s->engine(),
              read_ahead);
  return s;
}

std::string NvmeWeightStream::describe() const {
  return strf("NVMe offload in %s", dir_.c_str());
}

void NvmeWeightStream::ref_unit(int u) {
  std::vector<int> taken;
  try {
    for (int i : units_[u]) {
      Record& r = records_[i];
      if (r.refs == 0) {
        *r.slot = Buffer(tracker_, MemCategory::Weights, r.bytes, r.what);
        resident_ += r.bytes;
        peak_resident_ = std::max(peak_resident_, resident_);
        r.refs = 1;
        taken.push_back(i);
        r.io = file_->read_async(r.slot->data(), r.bytes, r.off);
      } else {
        ++r.refs;
        taken.push_back(i);
      }
    }
  } catch (...) {
    for (int i : taken) unref_record(i);  // the model is as before
    throw;
  }
}

void NvmeWeightStream::wait_unit(int u) {
  for (int i : units_[u]) {
    Record& r = records_[i];
    if (!r.io) continue;
    const UringFile::Ticket t = r.io;
    r.io = 0;
    file_->wait(t);
  }
}

void NvmeWeightStream::unref_record(int i) noexcept {
  Record& r = records_[i];
  if (--r.refs > 0) return;
  if (r.io) {
    try {
      file_->wait(r.io);  // the read must end before its Buffer goes
    } catch (...) {
    }
    r.io = 0;
  }
  r.slot->reset();
  resident_ -= r.bytes;
}

void NvmeWeightStream::unref_unit(int u) noexcept {
  for (int i : units_[u]) unref_record(i);
}

void NvmeWeightStream::drop_prefetch(int keep1, int keep2) noexcept {
  std::vector<int> kept;
  for (int p : prefetched_) {
    if (p == keep1 || p == keep2)
      kept.push_back(p);
    else
      unref_unit(p);  // read ahead but not asked for: a stale guess
  }
  prefetched_ = std::move(kept);
}

void NvmeWeightStream::acquire(int u, int next) {
  const int n = static_cast<int>(units_.size());
  QLFT_CHECK_ARG(u >= 0 && u < n, "weight stream: unit %d is out of range (%d units)", u, n);
  if (next < 0 || next >= n) next = kNoUnit;
  drop_prefetch(u, next);
  auto pf = std::find(prefetched_.begin(), prefetched_.end(), u);
  if (pf != prefetched_.end()) {
    prefetched_.erase(pf);  // its references pass to this use
  } else {
    ref_unit(u);
  }
  try {
    wait_unit(u);
  } catch (...) {
    unref_unit(u);
    throw;
  }
  ++in_use_[u];
  // Read the next unit while this one computes, within the bound on resident units.
  if (next != kNoUnit && read_ahead_ > 0 &&
      std::find(prefetched_.begin(), prefetched_.end(), next) == prefetched_.end() &&
      static_cast<int>(prefetched_.size()) < read_ahead_) {
    try {
      ref_unit(next);
      prefetched_.push_back(next);
    } catch (const Error& e) {
      // Not fatal: acquire(next) reads it again and reports the error then.
      log_message(QLFT_LOG_DEBUG, "weight stream: reading unit %d ahead failed: %s", next,
                  e.what());
    }
  }
}

void NvmeWeightStream::release(int u) noexcept {
  if (u < 0 || u >= static_cast<int>(units_.size()) || in_use_[u] == 0) return;
  --in_use_[u];
  unref_unit(u);
}

}  // namespace qlft
