// The C API from several threads at once, each with its own config/runtime/model/dataset/trainer
// (the documented unit of thread ownership). Run under ThreadSanitizer by scripts/sanitize.sh;
// in the normal build it checks that concurrency changes nothing: every thread's losses, text
// and ids equal those of the same session run alone first (an independent, sequential run).
// Also: qlft_last_error() is per thread, and qlft_trainer_cancel() from another thread stops a
// running qlft_trainer_train.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "qlft.h"
#include "support/test_support.h"

namespace {

struct Outcome {
  int32_t status = -1;
  std::vector<float> losses;
  std::vector<int32_t> ids;
  std::string decoded, generated;
  std::string error;
};

int32_t collect(const char* text, void* user) {
  static_cast<std::string*>(user)->append(text);
  return 0;
}

// One full session; every handle is created and freed on the calling thread.
Outcome session(const std::string& model_path, const std::string& text_path, int seed) {
  Outcome o;
  qlft_config* cfg = nullptr;
  qlft_runtime* rt = nullptr;
  qlft_model* model = nullptr;
  qlft_dataset* data = nullptr;
  qlft_trainer* tr = nullptr;
  auto fail = [&](const char* what) {
    o.error = std::string(what) + ": " + qlft_last_error();
    return o.status;
  };
  auto run = [&]() -> int32_t {
    if ((o.status = qlft_config_create(&cfg)) != QLFT_OK) return fail("config");
    const std::pair<const char*, std::string> kv[] = {{"threads", "1"},
                                                      {"quant.type", "nf4"},
                                                      {"lora.r", "4"},
                                                      {"lora.alpha", "8"},
                                                      {"train.micro_batch", "2"},
                                                      {"train.max_steps", "2"},
                                                      {"data.seq_len", "32"},
                                                      {"seed", std::to_string(seed)},
                                                      {"generate.max_tokens", "8"},
                                                      {"generate.temperature", "0"}};
    for (const auto& [k, v] : kv)
      if ((o.status = qlft_config_set(cfg, k, v.c_str())) != QLFT_OK) return fail(k);
    if ((o.status = qlft_runtime_create(cfg, &rt)) != QLFT_OK) return fail("runtime");
    if ((o.status = qlft_model_load(rt, model_path.c_str(), cfg, &model)) != QLFT_OK)
      return fail("model");
    const std::string prompt = "Once upon a time";
    size_t n = 0;
    o.ids.resize(64);
    if ((o.status = qlft_tokenize(model, prompt.data(), prompt.size(), 1, 0, o.ids.data(),
                                  o.ids.size(), &n)) != QLFT_OK)
      return fail("tokenize");
    o.ids.resize(n);
    char buf[256];
    size_t need = 0;
    if ((o.status = qlft_detokenize(model, o.ids.data(), n, buf, sizeof buf, &need)) != QLFT_OK)
      return fail("detokenize");
    o.decoded = buf;
    if ((o.status = qlft_dataset_load(model, text_path.c_str(), cfg, &data)) != QLFT_OK)
      return fail("dataset");
    if ((o.status = qlft_trainer_create(model, data, cfg, &tr)) != QLFT_OK) return fail("trainer");
    for (int i = 0; i < 2; ++i) {
      qlft_step_stats st{};
      st.struct_size = sizeof st;
      if ((o.status = qlft_trainer_step(tr, &st)) != QLFT_OK) return fail("step");
      o.losses.push_back(st.loss);
    }
    if ((o.status = qlft_generate(model, tr, prompt.c_str(), cfg, collect, &o.generated)) !=
        QLFT_OK)
      return fail("generate");
    return o.status = QLFT_OK;
  };
  run();
  qlft_trainer_free(tr);
  qlft_dataset_free(data);
  qlft_model_free(model);
  qlft_runtime_free(rt);
  qlft_config_free(cfg);
  return o;
}

std::string small_text() {
  std::string dir = qlft_test::temp_dir("api-threads");
  std::string path = dir + "/train.txt";
  std::string text;
  for (int i = 0; i < 30; ++i)
    text += "The little dog ran to the park and played with a red ball number " +
            std::to_string(i) + ".\n\n";
  qlft_test::write_file(path, text.data(), text.size());
  return path;
}

}  // namespace

TEST(ApiThreads, SeparateSessionsOnSeveralThreadsMatchSequentialRuns) {
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  const std::string text = small_text();
  constexpr int kThreads = 3;
  std::vector<Outcome> alone(kThreads), together(kThreads);
  for (int i = 0; i < kThreads; ++i) {
    alone[i] = session(model_path, text, 10 + i);
    ASSERT_EQ(alone[i].status, QLFT_OK) << alone[i].error;
    ASSERT_EQ(alone[i].losses.size(), 2u);
  }
  std::vector<std::thread> pool;
  for (int i = 0; i < kThreads; ++i)
    pool.emplace_back([&, i] { together[i] = session(model_path, text, 10 + i); });
  for (auto& t : pool) t.join();
  for (int i = 0; i < kThreads; ++i) {
    ASSERT_EQ(together[i].status, QLFT_OK) << together[i].error;
    EXPECT_EQ(together[i].losses, alone[i].losses) << "thread " << i;
    EXPECT_EQ(together[i].ids, alone[i].ids);
    EXPECT_EQ(together[i].decoded, alone[i].decoded);
    EXPECT_EQ(together[i].generated, alone[i].generated);
  }
  // Different seeds give different LoRA inits, so the sessions really were distinct.
  EXPECT_NE(alone[0].losses[1], alone[1].losses[1]);
}

TEST(ApiThreads, LastErrorIsPerThread) {
  qlft_config* cfg = nullptr;
  ASSERT_EQ(qlft_config_create(&cfg), QLFT_OK);
  ASSERT_NE(qlft_config_set(cfg, "no.such.key", "1"), QLFT_OK);
  const std::string mine = qlft_last_error();
  EXPECT_NE(mine.find("no.such.key"), std::string::npos) << mine;
  std::string other;
  std::thread t([&] {
    qlft_config* c2 = nullptr;
    qlft_config_create(&c2);
    EXPECT_NE(qlft_config_set(c2, "lora.r", "-5"), QLFT_OK);
    other = qlft_last_error();
    qlft_config_free(c2);
  });
  t.join();
  EXPECT_NE(other.find("lora.r"), std::string::npos) << other;
  EXPECT_EQ(std::string(qlft_last_error()), mine);  // the other thread's error did not leak here
  qlft_config_free(cfg);
}

namespace {
struct CancelState {
  std::atomic<int> steps{0};
};
int32_t count_only(const qlft_step_stats*, void* user) {
  static_cast<CancelState*>(user)->steps.fetch_add(1);
  return 0;
}
}  // namespace

TEST(ApiThreads, CancelFromAnotherThreadStopsTraining) {
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  const std::string text = small_text();
  qlft_config* cfg = nullptr;
  qlft_runtime* rt = nullptr;
  qlft_model* model = nullptr;
  qlft_dataset* data = nullptr;
  qlft_trainer* tr = nullptr;
  ASSERT_EQ(qlft_config_create(&cfg), QLFT_OK);
  for (auto [k, v] : {std::pair{"threads", "1"},
                      {"quant.type", "nf4"},
                      {"lora.r", "2"},
                      {"train.micro_batch", "1"},
                      {"train.max_steps", "100000"},
                      {"data.seq_len", "16"},
                      {"data.epochs", "1000"}})
    ASSERT_EQ(qlft_config_set(cfg, k, v), QLFT_OK) << k << ": " << qlft_last_error();
  ASSERT_EQ(qlft_runtime_create(cfg, &rt), QLFT_OK);
  ASSERT_EQ(qlft_model_load(rt, model_path.c_str(), cfg, &model), QLFT_OK) << qlft_last_error();
  ASSERT_EQ(qlft_dataset_load(model, text.c_str(), cfg, &data), QLFT_OK) << qlft_last_error();
  ASSERT_EQ(qlft_trainer_create(model, data, cfg, &tr), QLFT_OK) << qlft_last_error();
  CancelState st;
  int32_t rc = -1;
  std::thread worker([&] { rc = qlft_trainer_train(tr, count_only, &st); });
  while (st.steps.load() < 2) std::this_thread::yield();
  qlft_trainer_cancel(tr);
  worker.join();
  EXPECT_EQ(rc, QLFT_ERR_CANCELLED) << qlft_last_error();
  EXPECT_LT(st.steps.load(), 1000);
  qlft_trainer_free(tr);
  qlft_dataset_free(data);
  qlft_model_free(model);
  qlft_runtime_free(rt);
  qlft_config_free(cfg);
}
