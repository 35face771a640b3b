// The trainer's checkpoints (train/trainer.h save_checkpoint / resume): the adapter, this rank's
// (or, on rank 0, every rank's) optimizer state, the schedule's and scaler's state, the data
// position, a checksum over the tensors and a fingerprint of what must match on resume.
#include <algorithm>
#include <cstring>
#include <functional>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "formats/atomic_file.h"
#include "formats/safetensors.h"
#include "formats/safetensors_writer.h"
#include "parallel/data_parallel.h"
#include "train/trainer.h"

namespace qlft {

namespace {

// A checksum of a checkpoint's tensors (name and bytes, in name order), stored in its metadata
// and verified on resume: a bit flipped on disk is refused instead of training on garbage.
// 64-bit words mixed with a multiply-xorshift (not cryptographic; it catches corruption).
struct TensorBytes {
  std::string name;
  const uint8_t* data;
  size_t size;
};
class Checksum {
 public:
  // Tensors in name order.
  void add(const std::string& name, const void* data, size_t n) {
    bytes(reinterpret_cast<const uint8_t*>(name.data()), name.size());
    bytes(static_cast<const uint8_t*>(data), n);
  }
  std::string hex() const { return strf("%016llx", static_cast<unsigned long long>(h_)); }

 private:
  void mix(uint64_t w) {
    h_ ^= w + 0x9e3779b97f4a7c15ull + (h_ << 6) + (h_ >> 2);
    h_ *= 0xff51afd7ed558ccdull;
    h_ ^= h_ >> 33;
  }
  void bytes(const uint8_t* p, size_t n) {
    mix(n);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      mix(w);
    }
    uint64_t tail = 0;
    if (n > i) std::memcpy(&tail, p + i, n - i);
    mix(tail);
  }
  uint64_t h_ = 0x9e3779b97f4a7c15ull;
};
// data nullptr: the bytes are fetch(name)'s (another rank's, asked for in name order).
std::string checksum_of(std::vector<TensorBytes> ts,
                        const std::function<const void*(const std::string&)>& fetch = nullptr) {
  std::sort(ts.begin(), ts.end(),
            [](const TensorBytes& a, const TensorBytes& b) { return a.name < b.name; });
  Checksum c;
  for (const TensorBytes& t : ts) c.add(t.name, t.data ? t.data : fetch(t.name), t.size);
  return c.hex();
}

// A field of a data iterator state ("qlft-data v1 pos=N rows=N seed=N fp=HEX"), or "".
std::string state_field(const std::string& state, const char* key) {
  const std::string k = std::string(" ") + key + "=";
  size_t b = state.find(k);
  if (state.rfind("qlft-data v1 ", 0) != 0 || b == std::string::npos) return "";
  b += k.size();
  return state.substr(b, state.find(' ', b) - b);
}

// Refuses to resume on other data, naming what differs: the row count (the data, data.seq_len,
// packing or data.eval_fraction changed), the shuffling seed (data.seed), or, with the same
// count, the tokens themselves (the data's content, the tokenizer or the template changed).
void check_same_data(const std::string& path, const std::string& saved, const std::string& now) {
  std::string diffs;
  auto differs = [&](const char* key, const char* what) {
    std::string a = state_field(saved, key), b = state_field(now, key);
    if (a.empty() || b.empty() || a == b) return;
    diffs += strf("%s%s: %s in the checkpoint, %s now", diffs.empty() ? "" : "; ", what, a.c_str(),
                  b.c_str());
  };
  differs("rows",
          "training rows (the data, data.seq_len, data.pack, data.overflow or "
          "data.eval_fraction)");
  differs("seed", "data.seed");
  if (diffs.empty())
    differs("fp", "token fingerprint (the data's content, the tokenizer or data.template)");
  if (!diffs.empty())
    throw_error(QLFT_ERR_INVALID_ARGUMENT,
                "%s: cannot resume: the training data differs from the checkpoint's: %s",
                path.c_str(), diffs.c_str());
}

}  // namespace

// ---- checkpoints ------------------------------------------------------------------------------

std::string Trainer::fingerprint() const {
  const LoraConfig& c = lora_->config();
  return strf(
      "arch=%s layers=%d dim=%d lora.r=%d lora.alpha=%g targets=%s rslora=%d optim=%s "
      "batch=%lld",
      model_.cfg.arch.c_str(), model_.cfg.n_layers, model_.cfg.dim, c.r, c.alpha,
      c.targets_string().c_str(), c.use_rslora ? 1 : 0, opt_->name(),
      // The effective batch, not its split into micro-batches, accumulation and ranks: a
      // checkpoint resumes with any split (another world size included).
      static_cast<long long>(ts_.micro_batch) * ts_.accumulation * world());
}

void Trainer::save_checkpoint(const std::string& path) const {
  StateDict mine;
  opt_->save_state(mine, "optim.");
  if (world() == 1) return write_checkpoint_file(path, mine);
  if (dp_->zero_stage() == 0)  // every rank holds the whole state: rank 0 writes its own
    return write_checkpoint_on_rank0([&] { write_checkpoint_file(path, mine); });
  // A sharded adapter is gathered for the write (dist/zero3_lora.h), as for an adapter export.
  with_whole_adapter([&] { write_sharded_checkpoint(path, mine); });
}

void Trainer::write_sharded_checkpoint(const std::string& path, StateDict& mine) const {
  // ZeRO: rank 0 writes every rank's optimizer share in the 1-rank layout without holding the
  // others' shares: each of their entries is broadcast from its owner when the writer needs it,
  // once in name order (the checksum, which the file's header holds), then in data order. Every
  // rank makes the same broadcasts in the same order: the others by following that sequence,
  // rank 0 by writing (and, if the write fails, by finishing the sequence before it reports).
  const std::vector<dist::StateEntry> catalog = dp_->state_catalog(mine);
  std::vector<const dist::StateEntry*> remote, by_data;
  for (const dist::StateEntry& e : catalog)
    if (e.owner != 0) remote.push_back(&e);
  by_data = remote;
  std::sort(by_data.begin(), by_data.end(),
            [](const dist::StateEntry* a, const dist::StateEntry* b) {
              return safetensors_data_before(a->dtype, a->name, b->dtype, b->name);
            });
  const size_t n = remote.size();
  size_t done = 0;
  std::vector<uint8_t> scratch;
  auto fetch_next = [&] {
    const dist::StateEntry& e = done < n ? *remote[done] : *by_data[done - n];
    ++done;
    return std::make_pair(&e, dp_->fetch_state_entry(e, mine, &scratch));
  };
  auto finish_sequence = [&] {
    while (done < 2 * n) fetch_next();
  };
  if (!is_writer()) finish_sequence();
  write_checkpoint_on_rank0([&] {
    try {
      write_checkpoint_file(path, mine, remote, [&](const std::string& name) {
        if (done >= 2 * n)
          throw_error(QLFT_ERR_INTERNAL, "checkpoint: entry '%s' asked for past the sequence",
                      name.c_str());
        auto [e, bytes] = fetch_next();
        if (e->name != name)
          throw_error(QLFT_ERR_INTERNAL,
                      "checkpoint: entry '%s' asked for out of order (expected '%s')", name.c_str(),
                      e->name.c_str());
        return bytes;
      });
      if (done != 2 * n)
        throw_error(QLFT_ERR_INTERNAL, "checkpoint: %zu of %zu entry fetches made", done, 2 * n);
    } catch (...) {
      finish_sequence();
      throw;
    }
  });
}

const float* Trainer::param_values(size_t i) const {
  const ParamSlot& ps = param_slots_.at(i);
  // (the const slot(): a read, not a host write that would make a device copy stale)
  const LoraAdapter& a = *lora_;
  const Buffer* moe = nullptr;
  if (ps.moe >= 0) {
    const MoeLoraSlot& m = a.moe_slot(ps.layer, MoePart(ps.moe));
    moe = ps.b ? &m.B : &m.A;
  }
  const LoraSlot& s = a.slot(ps.layer, ps.p);
  const Buffer& v = moe ? *moe : ps.m ? s.M : ps.b ? s.B : s.A;
  if (v.empty())
    throw_error(QLFT_ERR_INTERNAL, "LoRA tensor '%s' is not on this rank",
                dp_->params()[i].name.c_str());
  return v.as<float>();
}

void Trainer::write_checkpoint_file(
    const std::string& path, StateDict& sd, const std::vector<const dist::StateEntry*>& remote,
    const std::function<const void*(const std::string&)>& fetch) const {
  lora_->sync_host();  // the ParamRef pointers below are the adapter's host buffers
  // A diverged adapter is never written over the last finite checkpoint.
  for (size_t k = 0; k < dp_->params().size(); ++k) {
    const ParamRef& p = dp_->params()[k];
    const float* v = param_values(k);
    for (size_t i = 0; i < p.numel; ++i)
      if (!std::isfinite(v[i]))
        throw_error(QLFT_ERR_NUMERICAL,
                    "%s: not written at step %lld: LoRA tensor '%s' holds a non-finite value "
                    "(training diverged; the last finite checkpoint is kept)",
                    path.c_str(), static_cast<long long>(step_), p.name.c_str());
  }
  sched_->save_state(sd, "sched.");
  scaler_->save_state(sd, "scaler.");
  SafetensorsWriter w;
  // Every tensor (name, bytes; nullptr: another rank's, fetched) for the checksum.
  std::vector<TensorBytes> sums;
  for (const auto& kv : sd.tensors()) {
    w.add_tensor(kv.first, kv.second.dtype, kv.second.shape, kv.second.bytes.data(),
                 kv.second.bytes.size(), /*copy=*/false);
    sums.push_back({kv.first, kv.second.bytes.data(), kv.second.bytes.size()});
  }
  for (const dist::StateEntry* e : remote) {
    w.add_tensor_deferred(e->name, e->dtype, e->shape, e->nbytes);
    sums.push_back({e->name, nullptr, static_cast<size_t>(e->nbytes)});
  }
  for (size_t k = 0; k < dp_->params().size(); ++k) {
    const ParamRef& p = dp_->params()[k];
    const float* v = param_values(k);
    w.add_tensor(p.name, DType::F32, {static_cast<int64_t>(p.numel)}, v, p.numel * 4, false);
    sums.push_back({p.name, reinterpret_cast<const uint8_t*>(v), p.numel * 4});
  }
  w.set_metadata("qlft.checksum", checksum_of(std::move(sums), fetch));
  w.set_metadata("qlft.checkpoint", "1");
  w.set_metadata("qlft.fingerprint", fingerprint());
  w.set_metadata("qlft.step", std::to_string(step_));
  w.set_metadata("qlft.nonfinite_in_row", std::to_string(nonfinite_in_row_));
  w.set_metadata("qlft.data", it_ ? it_->state() : "");
  w.write(path, fetch);
}

void Trainer::resume(const std::string& path) {
  auto f = SafetensorsFile::open(path);
  const auto& md = f->metadata();
  auto meta = [&](const char* k) -> std::string {
    auto i = md.find(k);
    QLFT_CHECK_FORMAT(i != md.end(), "%s: not a qlft checkpoint (metadata '%s' missing)",
                      path.c_str(), k);
    return i->second;
  };
  QLFT_CHECK_FORMAT(meta("qlft.checkpoint") == "1", "%s: unsupported checkpoint version",
                    path.c_str());
  QLFT_CHECK_ARG(meta("qlft.fingerprint") == fingerprint(),
                 "%s: checkpoint was made with different settings (%s) than this trainer (%s)",
                 path.c_str(), meta("qlft.fingerprint").c_str(), fingerprint().c_str());
  const std::string data_state = meta("qlft.data");
  if (it_) check_same_data(path, data_state, it_->state());
  char* end = nullptr;
  const std::string step_text = meta("qlft.step");
  long long step = std::strtoll(step_text.c_str(), &end, 10);
  QLFT_CHECK_FORMAT(*end == '\0' && step >= 0, "%s: bad qlft.step '%s'", path.c_str(),
                    step_text.c_str());
  long long nonfinite = std::strtoll(meta("qlft.nonfinite_in_row").c_str(), nullptr, 10);
  // Checkpoints written before the checksum existed have none and load as before.
  auto sum = md.find("qlft.checksum");
  if (sum != md.end()) {
    std::vector<TensorBytes> ts;
    for (const SafeTensorInfo& t : f->tensors())
      ts.push_back({t.name, static_cast<const uint8_t*>(t.data), t.nbytes});
    const std::string got = checksum_of(std::move(ts));
    QLFT_CHECK_FORMAT(got == sum->second,
                      "%s: the checkpoint's data is corrupted (checksum %s, recorded %s); "
                      "delete it to start over or restore it from a copy",
                      path.c_str(), got.c_str(), sum->second.c_str());
  }

  StateDict in;
  std::map<std::string, const SafeTensorInfo*> params;
  for (const SafeTensorInfo& t : f->tensors()) {
    if (t.name.rfind("lora.", 0) == 0) {
      params[t.name] = &t;
      continue;
    }
    in.put(t.name, t.dtype, t.shape, t.data, t.nbytes);
  }
  for (const ParamRef& p : dp_->params()) {
    auto i = params.find(p.name);
    QLFT_CHECK_FORMAT(i != params.end(), "%s: tensor '%s' is missing", path.c_str(),
                      p.name.c_str());
    QLFT_CHECK_FORMAT(
        i->second->dtype == DType::F32 && static_cast<size_t>(i->second->numel()) == p.numel,
        "%s: tensor '%s' does not match the adapter's shape", path.c_str(), p.name.c_str());
  }
  // Apply with rollback: snapshot the current state so a failure half-way restores it.
  const std::pair<CheckpointState*, const char*> parts[] = {
      {opt_.get(), "optim."}, {sched_.get(), "sched."}, {scaler_.get(), "scaler."}};
  StateDict backup;
  for (const auto& [part, prefix] : parts) part->save_state(backup, prefix);
  std::vector<std::vector<float>> old_params;
  lora_->sync_host();  // (the zero_grad below counts the writes: a device copy is made again)
  // (with a sharded adapter each rank restores the tensors it owns: params()' others are null)
  for (const ParamRef& p : dp_->params())
    if (p.data) old_params.emplace_back(p.data, p.data + p.numel);
  const std::string old_data = it_ ? it_->state() : "";
  try {
    for (const auto& [part, prefix] : parts) part->load_state(in, prefix);
    if (it_) it_->restore(data_state);
    for (const ParamRef& p : dp_->params())
      if (p.data) std::memcpy(p.data, params[p.name]->data, p.numel * 4);
  } catch (...) {
    for (const auto& [part, prefix] : parts) part->load_state(backup, prefix);
    if (it_) it_->restore(old_data);
    size_t i = 0;
    for (const ParamRef& p : dp_->params())
      if (p.data) std::memcpy(p.data, old_params[i++].data(), p.numel * 4);
    throw;
  }
  lora_->zero_grad();
  step_ = step;
  nonfinite_in_row_ = nonfinite;
}

}  // namespace qlft
