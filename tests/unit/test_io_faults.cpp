// Disk full while saving: the I/O fault hook of AtomicFile (set_io_fault_for_testing) cuts a
// write short at a byte budget and fails every later write with ENOSPC, or fails the fsync.
// For a plain file, a trainer checkpoint, a PEFT adapter directory and a llama.cpp GGUF adapter:
// the save fails with QLFT_ERR_IO naming the path and the OS reason, the previous file is
// byte-for-byte what it was and still loads (into a fresh trainer / adapter, giving the old
// weights), and no temporary file is left beside it.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <memory>

#include "config/config.h"
#include "core/error.h"
#include "formats/atomic_file.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "model/model.h"
#include "support/test_support.h"
#include "train/adapter_io.h"
#include "train/trainer.h"

using namespace qlft;
namespace fs = std::filesystem;

namespace {

// Resets the hook even when an assertion returns early.
struct FaultScope {
  explicit FaultScope(const IoFault& f) { set_io_fault_for_testing(f); }
  ~FaultScope() { set_io_fault_for_testing(IoFault{}); }
};

IoFault budget(int64_t bytes) {
  IoFault f;
  f.write_budget = bytes;
  return f;
}
IoFault fsync_fails() {
  IoFault f;
  f.fail_fsync = true;
  return f;
}

std::vector<std::string> leftovers(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos)
      out.push_back(e.path().string());
  return out;
}

// Runs save under fault f and checks the error: QLFT_ERR_IO naming `path` and the reason.
template <class Save>
void expect_save_fails(const IoFault& f, const std::string& path, Save save) {
  FaultScope scope(f);
  try {
    save();
    ADD_FAILURE() << "the save succeeded under a fault (budget " << f.write_budget << ")";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_IO) << e.what();
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << "the error must name the path: " << msg;
    EXPECT_NE(msg.find(std::strerror(f.err)), std::string::npos) << msg;
  }
}

std::vector<int64_t> budgets_for(int64_t size) {
  return {0, 1, 7, 4096, size / 2, size - 1};
}

Config trainer_config() {
  Config c;
  c.set("lora.r", "4");
  c.set("lora.alpha", "8");
  c.set("train.max_steps", "1");
  c.set("seed", "5");
  return c;
}

// Deterministic, distinct weights so an old and a new save differ everywhere.
void set_weights(LoraAdapter& lora, float base) {
  int k = 0;
  for (const LoraAdapter::Param& p : lora.params())
    for (size_t i = 0; i < p.n; ++i) p.w[i] = base + 1e-4f * static_cast<float>((k++) % 997);
}
std::vector<float> weights(LoraAdapter& lora) {
  std::vector<float> w;
  for (const LoraAdapter::Param& p : lora.params()) w.insert(w.end(), p.w, p.w + p.n);
  return w;
}

}  // namespace

TEST(IoFaults, AtomicFileKeepsTheOldContentOnEveryKindOfFailure) {
  const std::string dir = qlft_test::temp_dir("io_faults_atomic");
  const std::string path = dir + "/out.bin";
  write_file_atomic(path, "previous content");
  // 3 MiB: crosses the 1 MiB write buffer, so buffered and direct writes are both cut.
  std::string big(3 << 20, 'x');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + 7);
  const int64_t n = static_cast<int64_t>(big.size());
  for (int64_t b : {int64_t(0), int64_t(1), int64_t(1 << 20) - 1, int64_t(1 << 20),
                    int64_t(1 << 20) + 1, n / 2, n - 1}) {
    SCOPED_TRACE("budget " + std::to_string(b));
    expect_save_fails(budget(b), path, [&] { write_file_atomic(path, big); });
    std::vector<uint8_t> now = qlft_test::read_file(path);
    EXPECT_EQ(std::string(now.begin(), now.end()), "previous content");
    EXPECT_TRUE(leftovers(dir).empty());
  }
  IoFault eio = fsync_fails();
  eio.err = EIO;
  expect_save_fails(eio, path, [&] { write_file_atomic(path, big); });
  std::vector<uint8_t> now = qlft_test::read_file(path);
  EXPECT_EQ(std::string(now.begin(), now.end()), "previous content");
  EXPECT_TRUE(leftovers(dir).empty());
  {
    // Exactly enough room: the save succeeds.
    FaultScope scope(budget(n));
    write_file_atomic(path, big);
  }
  now = qlft_test::read_file(path);
  EXPECT_TRUE(std::string(now.begin(), now.end()) == big);
  // A file object destroyed without commit() (an exception elsewhere) leaves nothing behind.
  {
    AtomicFile f(path);
    f.write("partial");
  }
  EXPECT_TRUE(std::string(now.begin(), now.end()) == big);
  EXPECT_TRUE(leftovers(dir).empty());
}

class IoFaultsModel : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string m = qlft_test::shared_file("models/stories260K.gguf");
    if (m.empty())
      QLFT_SKIP("shared-missing") << "stories260K.gguf not found (set QLFT_SHARED_DIR)";
    LoadOptions lo;
    lo.quant_type = qlft::QuantType::Keep;
    model_ = load_model(&tracker_, m, lo);
  }
  MemoryTracker tracker_;
  std::unique_ptr<Model> model_;
};

TEST_F(IoFaultsModel, CheckpointSaveUnderDiskFullKeepsThePreviousCheckpoint) {
  const std::string dir = qlft_test::temp_dir("io_faults_ckpt");
  const std::string path = dir + "/checkpoint.safetensors";
  Trainer t(*model_, &tracker_, nullptr, qlft::parse_run_spec(trainer_config()));
  set_weights(t.lora(), 0.01f);
  const std::vector<float> w_old = weights(t.lora());
  t.save_checkpoint(path);
  const std::vector<uint8_t> bytes_old = qlft_test::read_file(path);

  set_weights(t.lora(), -0.02f);
  std::vector<IoFault> faults;
  for (int64_t b : budgets_for(static_cast<int64_t>(bytes_old.size()))) faults.push_back(budget(b));
  faults.push_back(fsync_fails());
  for (const IoFault& f : faults) {
    SCOPED_TRACE("budget " + std::to_string(f.write_budget) + " fsync " +
                 std::to_string(f.fail_fsync));
    expect_save_fails(f, path, [&] { t.save_checkpoint(path); });
    EXPECT_EQ(qlft_test::read_file(path), bytes_old);
    EXPECT_TRUE(leftovers(dir).empty());
    Trainer fresh(*model_, &tracker_, nullptr, qlft::parse_run_spec(trainer_config()));
    fresh.resume(path);  // still loadable, and it is the previous state
    EXPECT_EQ(weights(fresh.lora()), w_old);
  }
  // With room again the new checkpoint replaces the old one.
  t.save_checkpoint(path);
  Trainer fresh(*model_, &tracker_, nullptr, qlft::parse_run_spec(trainer_config()));
  fresh.resume(path);
  EXPECT_EQ(weights(fresh.lora()), weights(t.lora()));
}

TEST_F(IoFaultsModel, PeftAdapterSaveUnderDiskFullKeepsThePreviousAdapter) {
  const std::string parent = qlft_test::temp_dir("io_faults_peft");
  const std::string dir = parent + "/adapter";
  Trainer t(*model_, &tracker_, nullptr, qlft::parse_run_spec(trainer_config()));
  set_weights(t.lora(), 0.03f);
  const std::vector<float> w_old = weights(t.lora());
  save_peft_adapter(t.lora(), dir, "stories260K");
  const std::string st = dir + "/adapter_model.safetensors", cfg = dir + "/adapter_config.json";
  const std::vector<uint8_t> st_old = qlft_test::read_file(st), cfg_old = qlft_test::read_file(cfg);

  set_weights(t.lora(), -0.04f);
  // The directory is written whole (a temporary directory, then one rename): a fault anywhere,
  // in the weights or in adapter_config.json after complete weights, leaves the old adapter
  // whole and no temporary directory beside it.
  std::vector<int64_t> budgets = budgets_for(static_cast<int64_t>(st_old.size()));
  budgets.push_back(static_cast<int64_t>(st_old.size()) + 10);
  for (int64_t b : budgets) {
    SCOPED_TRACE("budget " + std::to_string(b));
    expect_save_fails(budget(b), dir, [&] { save_peft_adapter(t.lora(), dir, "stories260K"); });
    EXPECT_EQ(qlft_test::read_file(st), st_old);
    EXPECT_EQ(qlft_test::read_file(cfg), cfg_old);
    EXPECT_TRUE(leftovers(dir).empty());
    EXPECT_TRUE(leftovers(parent).empty());
    Trainer fresh(*model_, &tracker_, nullptr, qlft::parse_run_spec(trainer_config()));
    load_peft_adapter(fresh.lora(), dir);
    EXPECT_EQ(weights(fresh.lora()), w_old);
  }
  // With room again the new adapter replaces the old one as a whole.
  save_peft_adapter(t.lora(), dir, "stories260K");
  EXPECT_TRUE(leftovers(parent).empty());
  Trainer fresh(*model_, &tracker_, nullptr, qlft::parse_run_spec(trainer_config()));
  load_peft_adapter(fresh.lora(), dir);
  EXPECT_EQ(weights(fresh.lora()), weights(t.lora()));
}

TEST_F(IoFaultsModel, GgufAdapterSaveUnderDiskFullKeepsThePreviousFile) {
  const std::string dir = qlft_test::temp_dir("io_faults_gguf");
  const std::string path = dir + "/adapter.gguf";
  Trainer t(*model_, &tracker_, nullptr, qlft::parse_run_spec(trainer_config()));
  set_weights(t.lora(), 0.05f);
  save_gguf_lora_adapter(t.lora(), path);
  const std::vector<uint8_t> old = qlft_test::read_file(path);
  set_weights(t.lora(), -0.06f);
  std::vector<IoFault> faults;
  for (int64_t b : budgets_for(static_cast<int64_t>(old.size()))) faults.push_back(budget(b));
  faults.push_back(fsync_fails());
  for (const IoFault& f : faults) {
    SCOPED_TRACE("budget " + std::to_string(f.write_budget));
    expect_save_fails(f, path, [&] { save_gguf_lora_adapter(t.lora(), path); });
    EXPECT_EQ(qlft_test::read_file(path), old);
    EXPECT_TRUE(leftovers(dir).empty());
    auto g = GgufFile::open(path);  // still a valid GGUF
    EXPECT_GT(g->tensors().size(), 0u);
  }
}
