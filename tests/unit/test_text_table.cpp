// The tokenizer's compact vocabulary tables against std::unordered_map as the oracle: random
// spellings with repeats (a vocabulary may spell two ids alike), both insert policies, lookups of
// absent texts, and enough entries to grow the index several times.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/text_table.h"

namespace {

using qlft::tok::TextIndex;
using qlft::tok::TextTable;

std::vector<std::string> random_texts(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) {
    if (i > 0 && rng() % 8 == 0) {  // a repeated spelling
      out.push_back(out[rng() % out.size()]);
      continue;
    }
    std::string s(rng() % 12, '\0');  // empty texts included
    for (char& c : s) c = static_cast<char>(rng() % 7 == 0 ? rng() % 256 : 'a' + rng() % 6);
    out.push_back(s);
  }
  return out;
}

TEST(TextTable, HoldsEveryStringByIndex) {
  const auto texts = random_texts(5000, 1);
  TextTable t;
  for (const auto& s : texts) ASSERT_TRUE(t.push(s));
  t.shrink_to_fit();
  ASSERT_EQ(t.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(t.at(i), texts[i]) << i;
}

TEST(TextIndex, LastOrFirstValueOfEachSpellingAsAMapGives) {
  const auto texts = random_texts(20000, 2);
  TextTable t;
  for (const auto& s : texts) t.push(s);
  TextIndex last, first;
  std::unordered_map<std::string, int32_t> want_last, want_first;
  for (size_t i = 0; i < texts.size(); ++i) {
    const int32_t id = static_cast<int32_t>(i);
    last.insert(t, id, id, /*replace=*/true);
    first.insert(t, id, id + 1000000, /*replace=*/false);
    want_last[texts[i]] = id;
    want_first.emplace(texts[i], id + 1000000);
  }
  EXPECT_EQ(last.size(), want_last.size());
  EXPECT_EQ(first.size(), want_first.size());
  for (const auto& [s, id] : want_last) EXPECT_EQ(last.find(t, s), id) << s;
  for (const auto& [s, v] : want_first) EXPECT_EQ(first.find(t, s), v) << s;
  // Absent texts: longer than any entry, or not spelled.
  EXPECT_EQ(last.find(t, std::string(40, 'a')), -1);
  EXPECT_EQ(last.find(t, "zzzz"), -1);
  // for_each visits each spelling once, with its value.
  size_t seen = 0;
  last.for_each([&](int32_t key, int32_t value) {
    ++seen;
    EXPECT_EQ(want_last.at(std::string(t.at(key))), value);
  });
  EXPECT_EQ(seen, want_last.size());
}

TEST(TextIndex, EmptyIndexFindsNothing) {
  TextTable t;
  t.push("a");
  TextIndex idx;
  EXPECT_EQ(idx.find(t, "a"), -1);
  EXPECT_EQ(idx.size(), 0u);
}

}  // namespace
