// A WeightStream that needs no other process: each acquired unit's weight groups are loaded
// again from the model's file (WeightGroupSource: the same reader and quantization as
// load_model, so the bytes equal what a ZeRO-3 gather returns) and freed at release. What a
// ZeRO-3 rank uses to evaluate or generate on its own (dist/zero3_stream.h rank_local): no
// collective, so it works whether one rank or every rank calls. At most one unit is held; the
// buffers are counted as `weights` while held.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/weight_stream.h"

namespace qlft {

class FileUnitStream final : public WeightStream,
                             public std::enable_shared_from_this<FileUnitStream> {
 public:
  // Opens its own reader of model.path (throws QLFT_ERR_IO when the file no longer matches).
  FileUnitStream(Model& model, MemoryTracker* tracker);
  ~FileUnitStream() override;

  void acquire(int u, int next) override;
  void release(int u) noexcept override;
  std::string describe() const override;
  // Itself: it needs no other process.
  std::shared_ptr<WeightStream> rank_local() override { return shared_from_this(); }

  // Where the bytes come from (a ZeRO-3 trainer shards a deferred load's groups from it).
  WeightGroupSource& source() { return *source_; }

  // Frees an installed unit (another stream is about to fill the same Buffers). Never throws.
  void evict() noexcept;
  int64_t loads() const { return loads_; }

 private:
  bool present(int u) const;  // every storage Buffer of u is filled
  void uninstall(int u) noexcept;

  Model& model_;
  std::unique_ptr<WeightGroupSource> source_;
  std::vector<std::vector<int>> unit_groups_;
  int installed_ = kNoUnit, held_ = kNoUnit;
  bool keep_ = false;
  int64_t loads_ = 0;
};

}  // namespace qlft
