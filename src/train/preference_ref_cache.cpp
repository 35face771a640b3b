#include "train/preference_ref_cache.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "core/log.h"
#include "formats/atomic_file.h"

namespace qlft {

namespace {

constexpr char kMagic[8] = {'Q', 'L', 'F', 'T', 'R', 'E', 'F', '1'};

// FNV-1a over bytes (a file name's key: stable across runs and builds).
struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void add(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  void add(const std::vector<int32_t>& v) {
    const uint64_t n = v.size();
    add(&n, sizeof n);
    add(v.data(), v.size() * sizeof(int32_t));
  }
};

// The values of a file at path made for key with n values; empty when it is absent or another.
std::vector<double> read_cache(const std::string& path, uint64_t key, size_t n) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return {};
  char magic[8];
  uint64_t k = 0, count = 0;
  if (!f.read(magic, 8) || std::memcmp(magic, kMagic, 8) != 0 ||
      !f.read(reinterpret_cast<char*>(&k), 8) || !f.read(reinterpret_cast<char*>(&count), 8) ||
      k != key || count != n) {
    QLFT_LOG_W("%s: not a reference cache of this model and data; it is made again", path.c_str());
    return {};
  }
  std::vector<double> v(n);
  if (!f.read(reinterpret_cast<char*>(v.data()), std::streamsize(n * sizeof(double))) ||
      f.peek() != std::char_traits<char>::eof()) {
    QLFT_LOG_W("%s: a reference cache of the wrong length; it is made again", path.c_str());
    return {};
  }
  return v;
}

}  // namespace

uint64_t PrefRefCache::key_of(const PrefSet& set, Objective o, const std::string& model) {
  Fnv f;
  f.add("qlft-ref-1", 10);
  const int32_t obj = static_cast<int32_t>(o);
  f.add(&obj, sizeof obj);
  f.add(model.data(), model.size());
  for (const data::PrefExample& e : set.examples) {
    f.add(e.prompt);
    f.add(e.chosen);
    f.add(e.rejected);
  }
  return f.h;
}

std::string PrefRefCache::path_of(const std::string& data_path, uint64_t key) {
  std::string p = data_path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(key));
  return p + ".qlft-ref-" + hex + ".bin";
}

PrefRefCache PrefRefCache::make(LlamaRunner& runner, const PrefSet& set, Objective o, int batch,
                                const std::string& path, uint64_t key, bool* loaded) {
  QLFT_CHECK_ARG(needs_reference(o), "a reference cache for %s, which has no reference",
                 name_of(o));
  QLFT_CHECK_ARG(batch > 0, "reference cache: batch %d", batch);
  PrefRefCache c;
  c.per_example_ = is_paired(o) ? 2 : 1;
  const size_t n = set.examples.size() * size_t(c.per_example_);
  c.values_ = read_cache(path, key, n);
  *loaded = !c.values_.empty() || n == 0;
  if (*loaded) return c;
  c.values_.resize(n);
  const size_t E = set.examples.size();
  for (size_t first = 0; first < E; first += size_t(batch)) {
    std::vector<const data::PrefExample*> ex;
    for (size_t i = first; i < E && i < first + size_t(batch); ++i) ex.push_back(&set.examples[i]);
    PrefBatch b = make_pref_batch(ex, o, 0);
    std::vector<double> ref;
    preference_logps(runner, b.rows, true, nullptr, &ref);
    const size_t P = ex.size();
    for (size_t k = 0; k < P; ++k)
      for (int j = 0; j < c.per_example_; ++j)
        c.values_[(first + k) * size_t(c.per_example_) + size_t(j)] = ref[size_t(j) * P + k];
  }
  std::string bytes(kMagic, 8);
  const uint64_t count = n;
  bytes.append(reinterpret_cast<const char*>(&key), 8);
  bytes.append(reinterpret_cast<const char*>(&count), 8);
  bytes.append(reinterpret_cast<const char*>(c.values_.data()), n * sizeof(double));
  try {
    write_file_atomic(path, bytes);
  } catch (const Error& e) {
    QLFT_LOG_W("the reference log-probabilities are kept in memory only: %s", e.what());
  }
  return c;
}

void PrefRefCache::fill(const std::vector<const data::PrefExample*>& ex, const PrefSet& set,
                        PrefBatch& b) const {
  const size_t P = ex.size();
  b.ref.assign(P * size_t(per_example_), 0.0);
  for (size_t k = 0; k < P; ++k) {
    const size_t i = static_cast<size_t>(ex[k] - set.examples.data());
    QLFT_CHECK_ARG(i < set.examples.size(), "reference cache: an example not of its set");
    for (int j = 0; j < per_example_; ++j)
      b.ref[size_t(j) * P + k] = values_[i * size_t(per_example_) + size_t(j)];
  }
}

}  // namespace qlft
