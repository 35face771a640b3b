// Streaming generation (qlft_generation_*): the same text as qlft_generate for the same
// settings, the ids checked by detokenizing them (a second path to the same text), stop strings,
// finish reasons, and cancellation from another thread (at most one token after the cancel).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "api/api_session.h"
#include "qlft.h"
#include "support/test_support.h"

namespace {

struct Streamed {
  std::vector<int32_t> ids;
  std::string text;
  int32_t finish = QLFT_FINISH_NONE;
  int events = 0;
};

int32_t collect(const char* text, void* user) {
  static_cast<std::string*>(user)->append(text);
  return 0;
}

class Stream : public ::testing::Test {
 protected:
  void SetUp() override {
    QLFT_NEED_SHARED(path, "models/stories260K.gguf");
    ASSERT_EQ(qlft_config_create(&s.cfg), QLFT_OK);
    s.set("threads", "1");
    s.set("generate.max_tokens", "40");
    ASSERT_EQ(qlft_runtime_create(s.cfg, &s.rt), QLFT_OK) << qlft_last_error();
    ASSERT_EQ(qlft_model_load(s.rt, path.c_str(), s.cfg, &s.model), QLFT_OK) << qlft_last_error();
  }

  std::string generate_text() {
    std::string t;
    EXPECT_EQ(qlft_generate(s.model, nullptr, prompt, s.cfg, collect, &t), QLFT_OK)
        << qlft_last_error();
    return t;
  }

  Streamed stream(const std::vector<const char*>& stops = {}) {
    Streamed r;
    qlft_generation* g = nullptr;
    EXPECT_EQ(
        qlft_generation_create(s.model, nullptr, prompt, s.cfg, stops.data(), stops.size(), &g),
        QLFT_OK)
        << qlft_last_error();
    if (!g) return r;
    qlft_generated_token tok{};
    for (int guard = 0; guard < 1000 && r.finish == QLFT_FINISH_NONE; ++guard) {
      tok.struct_size = sizeof(tok);
      EXPECT_EQ(qlft_generation_next(g, &tok), QLFT_OK) << qlft_last_error();
      EXPECT_EQ(tok.struct_size, sizeof(tok));
      EXPECT_EQ(std::strlen(tok.text), tok.text_len);
      if (tok.id >= 0) {
        EXPECT_EQ(tok.index, r.ids.size());
        r.ids.push_back(tok.id);
      }
      r.text += tok.text;
      r.finish = tok.finish_reason;
      ++r.events;
    }
    // After the end: the end again, with no token and no text.
    tok.struct_size = sizeof(tok);
    EXPECT_EQ(qlft_generation_next(g, &tok), QLFT_OK);
    EXPECT_EQ(tok.id, -1);
    EXPECT_EQ(tok.finish_reason, r.finish);
    EXPECT_STREQ(tok.text, "");
    qlft_generation_free(g);
    return r;
  }

  // qlft_detokenize skips special tokens (the EOS qlft_generate drops too).
  std::string detokenize(const std::vector<int32_t>& ids) {
    std::vector<char> buf(4096);
    size_t n = 0;
    EXPECT_EQ(qlft_detokenize(s.model, ids.data(), ids.size(), buf.data(), buf.size(), &n), QLFT_OK)
        << qlft_last_error();
    return n > 0 ? std::string(buf.data(), n - 1) : std::string();
  }

  qlft_test::Session s;
  const char* prompt = "Once upon a time";
};

TEST_F(Stream, SameTextAndIdsAsGenerateGreedy) {
  std::string want = generate_text();
  Streamed r = stream();
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(r.text, want);
  EXPECT_EQ(detokenize(r.ids), want);
  ASSERT_TRUE(r.finish == QLFT_FINISH_LENGTH || r.finish == QLFT_FINISH_EOS) << r.finish;
  if (r.finish == QLFT_FINISH_LENGTH) EXPECT_EQ(r.ids.size(), 40u);
  EXPECT_EQ(r.events, static_cast<int>(r.ids.size()));  // the last token carries the finish
}

TEST_F(Stream, SameTextAndIdsAsGenerateSampled) {
  s.set("generate.temperature", "0.9");
  s.set("generate.top_k", "20");
  s.set("generate.seed", "7");
  s.set("generate.stop_at_eos", "false");
  std::string want = generate_text();
  Streamed r = stream();
  EXPECT_EQ(r.text, want);
  EXPECT_EQ(detokenize(r.ids), want);
  EXPECT_EQ(r.finish, QLFT_FINISH_LENGTH);
  EXPECT_EQ(r.ids.size(), 40u);
}

TEST_F(Stream, StopStringEndsBeforeIt) {
  std::string full = generate_text();
  ASSERT_GT(full.size(), 30u);
  // A stop string from the middle of the text, plus one that never occurs.
  std::string stop = full.substr(20, 6);
  size_t at = full.find(stop);
  Streamed r = stream({"\x01never", stop.c_str()});
  EXPECT_EQ(r.finish, QLFT_FINISH_STOP);
  EXPECT_EQ(r.text, full.substr(0, at));
  // Its ids are a prefix of the unstopped run's, ending with the token that completed the stop.
  Streamed all = stream();
  ASSERT_LE(r.ids.size(), all.ids.size());
  EXPECT_TRUE(std::equal(r.ids.begin(), r.ids.end(), all.ids.begin()));
  EXPECT_NE(detokenize(r.ids).find(stop), std::string::npos);
  EXPECT_EQ(detokenize({r.ids.begin(), r.ids.end() - 1}).find(stop), std::string::npos);
}

TEST_F(Stream, CancelBeforeFirstTokenAndBadArguments) {
  qlft_generation* g = nullptr;
  ASSERT_EQ(qlft_generation_create(s.model, nullptr, prompt, s.cfg, nullptr, 0, &g), QLFT_OK);
  qlft_generation_cancel(g);  // a generation is running from creation: not discarded
  qlft_generated_token tok{};
  tok.struct_size = sizeof(tok);
  ASSERT_EQ(qlft_generation_next(g, &tok), QLFT_OK);
  EXPECT_EQ(tok.id, -1);
  EXPECT_EQ(tok.finish_reason, QLFT_FINISH_CANCELLED);
  qlft_generation_free(g);

  g = nullptr;
  EXPECT_EQ(qlft_generation_create(s.model, nullptr, prompt, s.cfg, nullptr, 2, &g),
            QLFT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(g, nullptr);
  const char* empty[] = {""};
  EXPECT_EQ(qlft_generation_create(s.model, nullptr, prompt, s.cfg, empty, 1, &g),
            QLFT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qlft_last_error()).find("stop string 0"), std::string::npos);
  ASSERT_EQ(qlft_generation_create(s.model, nullptr, prompt, s.cfg, nullptr, 0, &g), QLFT_OK);
  tok.struct_size = 0;
  EXPECT_EQ(qlft_generation_next(g, &tok), QLFT_ERR_INVALID_ARGUMENT);
  qlft_generation_free(g);
}

// Another thread cancels after the third token: at most one more token arrives after
// qlft_generation_cancel returned, and the generation ends as cancelled.
TEST_F(Stream, CancelFromAnotherThreadWithinOneToken) {
  s.set("generate.max_tokens", "200");
  s.set("generate.stop_at_eos", "false");
  qlft_generation* g = nullptr;
  ASSERT_EQ(qlft_generation_create(s.model, nullptr, prompt, s.cfg, nullptr, 0, &g), QLFT_OK);
  std::atomic<int> delivered{0};
  std::atomic<int> at_cancel{-1};
  std::thread canceller([&] {
    while (delivered.load() < 3) std::this_thread::yield();
    qlft_generation_cancel(g);
    at_cancel.store(delivered.load());
  });
  qlft_generated_token tok{};
  int32_t finish = QLFT_FINISH_NONE;
  int after_cancel = 0;
  while (finish == QLFT_FINISH_NONE) {
    tok.struct_size = sizeof(tok);
    ASSERT_EQ(qlft_generation_next(g, &tok), QLFT_OK) << qlft_last_error();
    finish = tok.finish_reason;
    if (tok.id >= 0) {
      if (at_cancel.load() >= 0) ++after_cancel;
      delivered.fetch_add(1);
    }
  }
  canceller.join();
  qlft_generation_free(g);
  EXPECT_EQ(finish, QLFT_FINISH_CANCELLED);
  EXPECT_EQ(tok.id, -1);
  EXPECT_LE(after_cancel, 1);
  EXPECT_LT(delivered.load(), 200);
}

}  // namespace
