// Preference pairs from TinyStories for the DPO tests (unit and C ABI): prompt = a story's first
// sentence, chosen = its real second sentence, rejected = the same words shuffled (seeded), as
// preference JSON lines.
#pragma once

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace qlft_test {

inline std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o + "\"";
}

inline std::string make_pairs_jsonl(const std::string& stories_path, size_t max_pairs) {
  std::ifstream in(stories_path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string all = ss.str();
  std::mt19937 rng(49);
  std::string out;
  size_t pairs = 0, pos = 0;
  while (pairs < max_pairs && pos < all.size()) {
    size_t end = all.find("<|endoftext|>", pos);
    if (end == std::string::npos) end = all.size();
    std::string story = all.substr(pos, end - pos);
    pos = end + 13;
    while (!story.empty() && (story[0] == '\n' || story[0] == ' ')) story.erase(0, 1);
    const size_t s1 = story.find(". ");
    if (s1 == std::string::npos) continue;
    const size_t s2 = story.find(". ", s1 + 2);
    if (s2 == std::string::npos) continue;
    const std::string prompt = story.substr(0, s1 + 1);
    const std::string second = story.substr(s1 + 2, s2 - s1 - 1);  // up to and with its '.'
    std::vector<std::string> words;
    std::istringstream ws(second);
    for (std::string w; ws >> w;) words.push_back(w);
    if (words.size() < 4 || second.size() > 120 || prompt.size() > 120) continue;
    std::vector<std::string> shuffled = words;
    while (shuffled == words) std::shuffle(shuffled.begin(), shuffled.end(), rng);
    std::string rejected;
    for (const std::string& w : shuffled) rejected += " " + w;
    out += "{\"prompt\": " + json_str(prompt) + ", \"chosen\": " + json_str(" " + second) +
           ", \"rejected\": " + json_str(rejected) + "}\n";
    ++pairs;
  }
  return out;
}

}  // namespace qlft_test
