// Data readers: formats and their detection, .txt separators, and bad records -- every kind is
// an error naming the file and line (record index in a .json array), or skipped and counted.
#include <gtest/gtest.h>

#include <fstream>

#include "config/config.h"
#include "core/error.h"
#include "data/dataset.h"
#include "data/packing.h"
#include "data/records.h"
#include "support/test_support.h"

using namespace qlft;
using namespace qlft::data;

namespace {

std::string write(const std::string& dir, const std::string& name, const std::string& text) {
  std::string p = dir + "/" + name;
  qlft_test::write_file(p, text.data(), text.size());
  return p;
}

// The error of reading path, or "" when it reads.
std::string read_error(const std::string& path, ReadOptions opt, int32_t* status = nullptr) {
  DropLog log;
  try {
    read_records(path, opt, log);
  } catch (const Error& e) {
    if (status) *status = e.status();
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

}  // namespace

TEST(DataRecords, DetectsFormatsFromTheFirstRecord) {
  std::string dir = qlft_test::temp_dir("data_detect");
  struct Case {
    const char* file;
    const char* text;
    DataFormat want;
  } cases[] = {
      {"t.jsonl", "{\"text\": \"hello\"}\n{\"text\": \"world\"}\n", DataFormat::Text},
      {"a.jsonl", "{\"instruction\": \"i\", \"input\": \"\", \"output\": \"o\"}\n",
       DataFormat::Alpaca},
      {"c.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n",
       DataFormat::Chat},
      {"s.jsonl",
       "{\"conversations\": [{\"from\": \"human\", \"value\": \"hi\"}, "
       "{\"from\": \"gpt\", \"value\": \"yo\"}]}\n",
       DataFormat::Chat},
      {"a.json", "[{\"instruction\": \"i\", \"output\": \"o\"}]", DataFormat::Alpaca},
      {"l.json", "{\"text\": \"json lines in a .json file\"}\n", DataFormat::Text},
      {"p.txt", "plain\n", DataFormat::Text},
  };
  for (const auto& c : cases) {
    DropLog log;
    DataFormat got = DataFormat::Auto;
    auto recs = read_records(write(dir, c.file, c.text), {}, log, &got);
    EXPECT_EQ(got, c.want) << c.file;
    ASSERT_FALSE(recs.empty()) << c.file;
    EXPECT_EQ(recs[0].format, c.want) << c.file;
  }
  DropLog log;
  auto recs = read_records(dir + "/s.jsonl", {}, log);
  ASSERT_EQ(recs[0].messages.size(), 2u);
  EXPECT_EQ(recs[0].messages[0].role, "user");
  EXPECT_EQ(recs[0].messages[1].role, "assistant");
  EXPECT_EQ(recs[0].messages[1].content, "yo");

  std::string e = read_error(write(dir, "u.jsonl", "{\"foo\": 1}\n"), {});
  EXPECT_TRUE(contains(e, "u.jsonl:1")) << e;
  EXPECT_TRUE(contains(e, "foo")) << e;
}

TEST(DataRecords, TextSeparators) {
  std::string dir = qlft_test::temp_dir("data_txt");
  std::string p = write(dir, "a.txt", "first doc\nline two\n\n  \nsecond\r\n\n\nthird\n");
  ReadOptions o;
  DropLog log;
  auto r = read_records(p, o, log);  // default: blank lines
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].text, "first doc\nline two");
  EXPECT_EQ(r[1].text, "second");
  EXPECT_EQ(r[2].text, "third");
  EXPECT_EQ(r[0].where, p + ":1");
  EXPECT_EQ(r[1].where, p + ":5");
  EXPECT_EQ(r[2].where, p + ":8");

  std::string q = write(dir, "b.txt", "Once upon.\nThe end.\n<|endoftext|>\nTwo.\n<|endoftext|>\n");
  o.split = TextSplit::AtSeparator;
  o.separator = "<|endoftext|>";
  r = read_records(q, o, log);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].text, "Once upon.\nThe end.");
  EXPECT_EQ(r[1].text, "Two.");
  EXPECT_EQ(r[1].where, q + ":4");

  o.split = TextSplit::Whole;
  o.max_record_bytes = 4;  // the whole file is one document, however long
  r = read_records(q, o, log);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].text, "Once upon.\nThe end.\n<|endoftext|>\nTwo.\n<|endoftext|>\n");
  EXPECT_EQ(unescape("a\\n\\tb\\\\"), "a\n\tb\\");
}

// One file per kind of bad record, the bad one on a known line: the error names file:line.
TEST(DataRecords, EveryBadRecordKindNamesFileAndLine) {
  std::string dir = qlft_test::temp_dir("data_bad");
  const std::string good = "{\"instruction\": \"i\", \"input\": \"\", \"output\": \"o\"}\n";
  struct Case {
    const char* name;
    std::string line;
    const char* says;
  } cases[] = {
      {"invalid_json", "{\"instruction\": \"i\", \"output\": }", "invalid JSON"},
      {"missing_field", "{\"instruction\": \"i\"}", "missing field \"output\""},
      {"wrong_type", "{\"instruction\": \"i\", \"output\": 3}", "must be a string"},
      {"not_object", "[1, 2]", "must be a JSON object"},
      {"empty_text", "{\"instruction\": \"i\", \"output\": \"  \"}", "is empty"},
      {"too_long", "{\"instruction\": \"" + std::string(300, 'x') + "\", \"output\": \"o\"}",
       "longer than data.max_record_bytes"},
  };
  ReadOptions o;
  o.max_record_bytes = 200;
  for (const auto& c : cases) {
    std::string p =
        write(dir, std::string(c.name) + ".jsonl", good + "\n" + good + c.line + "\n" + good);
    int32_t status = 0;
    std::string e = read_error(p, o, &status);
    EXPECT_EQ(status, QLFT_ERR_FORMAT) << c.name;
    EXPECT_TRUE(contains(e, p + ":4:")) << c.name << ": " << e;  // line 2 is blank
    EXPECT_TRUE(contains(e, c.says)) << c.name << ": " << e;
  }
  // Chat records: bad roles and bad message lists.
  std::string chat_bad[] = {
      "{\"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}",
      "{\"messages\": \"hi\"}",
      "{\"messages\": []}",
      "{\"messages\": [{\"role\": \"user\"}]}",
      "{\"messages\": [{\"role\": \"user\", \"content\": null}]}",
  };
  const std::string chat_good = "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}\n";
  for (const auto& line : chat_bad) {
    std::string p = write(dir, "chat.jsonl", chat_good + line + "\n");
    std::string e = read_error(p, o);
    EXPECT_TRUE(contains(e, p + ":2:")) << line << ": " << e;
  }
  // .json arrays: the record index; a broken array: the line of the parse error.
  std::string p =
      write(dir, "arr.json", "[{\"text\": \"a\"},\n {\"text\": 5},\n {\"text\": \"c\"}]");
  std::string e = read_error(p, o);
  EXPECT_TRUE(contains(e, p + " record index 1:")) << e;
  p = write(dir, "broken.json", "[{\"text\": \"a\"},\n {\"text\": \"b\"\n]");
  e = read_error(p, o);
  EXPECT_TRUE(contains(e, p + ":3:")) << e;
  // .txt documents over the size limit.
  p = write(dir, "long.txt", "short\n\n" + std::string(300, 'y') + "\n");
  e = read_error(p, o);
  EXPECT_TRUE(contains(e, p + ":3:")) << e;
}

TEST(DataRecords, SkipModeCountsEveryBadRecord) {
  std::string dir = qlft_test::temp_dir("data_skip");
  std::string text =
      "{\"text\": \"good one\"}\n"
      "{\"text\": \n"
      "{\"txt\": \"x\"}\n"
      "{\"text\": [1]}\n"
      "{\"text\": \"\"}\n"
      "{\"text\": \"" +
      std::string(500, 'z') +
      "\"}\n"
      "{\"text\": \"good two\"}\n";
  ReadOptions o;
  o.skip_bad = true;
  o.max_record_bytes = 100;
  DropLog log;
  auto recs = read_records(write(dir, "m.jsonl", text), o, log);
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[1].text, "good two");
  EXPECT_EQ(log.count, 5u);
  EXPECT_EQ(log.by_reason["invalid_json"], 1u);
  EXPECT_EQ(log.by_reason["missing_field"], 1u);
  EXPECT_EQ(log.by_reason["wrong_type"], 1u);
  EXPECT_EQ(log.by_reason["empty_text"], 1u);
  EXPECT_EQ(log.by_reason["too_long"], 1u);
  ASSERT_EQ(log.examples.size(), 5u);
  EXPECT_TRUE(contains(log.examples[0], "m.jsonl:2:")) << log.examples[0];
  EXPECT_TRUE(contains(log.examples[4], "m.jsonl:6:")) << log.examples[4];
}

// Records the template refuses and documents over seq_len (overflow=reject) go through the same
// policy; the dataset statistics report them.
TEST(DataRecords, TemplateAndLengthProblemsInTheDataset) {
  std::string dir = qlft_test::temp_dir("data_tmpl");
  std::string p = write(dir, "c.jsonl",
                        "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, "
                        "{\"role\": \"assistant\", \"content\": \"b\"}]}\n"
                        "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, "
                        "{\"role\": \"user\", \"content\": \"b\"}]}\n"
                        "{\"messages\": [{\"role\": \"user\", \"content\": \"long\"}, "
                        "{\"role\": \"assistant\", \"content\": \"" +
                            std::string(200, 'w') + "\"}]}\n");
  ByteEncoder enc;
  DataOptions o;
  o.path = p;
  o.chat_template = TemplateKind::Llama2;
  o.seq_len = 64;
  o.overflow = Overflow::Reject;
  try {
    Dataset::build(o, enc);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_FORMAT);
    EXPECT_TRUE(contains(e.what(), p + ":2:")) << e.what();
    EXPECT_TRUE(contains(e.what(), "alternate")) << e.what();
  }
  o.skip_bad = true;
  Dataset ds = Dataset::build(o, enc);
  const DataStats& st = ds.stats();
  EXPECT_EQ(st.records, 3u);
  EXPECT_EQ(st.records_used, 1u);
  EXPECT_EQ(st.records_dropped, 2u);
  EXPECT_EQ(st.dropped_by_reason.at("template"), 1u);
  EXPECT_EQ(st.dropped_by_reason.at("too_long"), 1u);
  EXPECT_EQ(st.chat_template, "llama2");
}

TEST(DataRecords, StatisticsCountTokensAndTrainedTokens) {
  std::string dir = qlft_test::temp_dir("data_stats");
  // Two alpaca records under the alpaca template with a byte encoder: the counts follow from
  // the Stanford prompt strings.
  std::string p = write(dir, "a.jsonl",
                        "{\"instruction\": \"Say hi\", \"input\": \"\", \"output\": \"hi\"}\n"
                        "{\"instruction\": \"Add\", \"input\": \"1+1\", \"output\": \"2\"}\n"
                        "not json\n");
  ByteEncoder enc;
  DataOptions o;
  o.path = p;
  o.skip_bad = true;
  DataStats st = compute_data_stats(o, enc);
  const std::string pre =
      "Below is an instruction that describes a task. Write a response that appropriately "
      "completes the request.\n\n### Instruction:\nSay hi\n\n### Response:\n";
  const std::string pre_in =
      "Below is an instruction that describes a task, paired with an input that provides further "
      "context. Write a response that appropriately completes the request.\n\n### Instruction:\n"
      "Add\n\n### Input:\n1+1\n\n### Response:\n";
  uint64_t n1 = 1 + pre.size() + 2 + 1, n2 = 1 + pre_in.size() + 1 + 1;  // bos ... output eos
  EXPECT_EQ(st.format, "alpaca");
  EXPECT_EQ(st.chat_template, "alpaca");
  EXPECT_EQ(st.records, 3u);
  EXPECT_EQ(st.records_used, 2u);
  EXPECT_EQ(st.dropped_by_reason.at("invalid_json"), 1u);
  EXPECT_EQ(st.tokens, n1 + n2);
  EXPECT_EQ(st.trained_tokens, (2u + 1) + (1u + 1));  // outputs and their eos
  EXPECT_EQ(st.min_tokens, std::min(n1, n2));
  EXPECT_EQ(st.max_tokens, std::max(n1, n2));
  uint64_t hist = 0;
  for (const auto& b : st.length_histogram) {
    hist += b.count;
    EXPECT_EQ(b.hi, 2 * b.lo);
  }
  EXPECT_EQ(hist, 2u);
  EXPECT_EQ(st.train_rows, 1u);  // both fit one 512-token row

  o.train_on = TrainOn::All;
  st = compute_data_stats(o, enc);
  EXPECT_EQ(st.trained_tokens, n1 + n2 - 2);  // everything but each document's first token
}

TEST(DataRecords, OptionsFromConfigKeys) {
  Config cfg;
  cfg.set("data.path", "/x/y.jsonl");
  cfg.set("data.format", "chat");
  cfg.set("data.template", "llama3");
  cfg.set("data.train_on", "all");
  cfg.set("data.seq_len", "128");
  cfg.set("data.pack", "false");
  cfg.set("data.separator", "<|endoftext|>");
  cfg.set("data.eval_fraction", "0.1");
  cfg.set("data.seed", "7");
  cfg.set("data.epochs", "3");
  cfg.set("data.on_error", "skip");
  cfg.set("data.max_record_bytes", "2K");
  cfg.set("data.overflow", "truncate");
  DataOptions o = qlft::parse_run_spec(cfg).data;
  EXPECT_EQ(o.path, "/x/y.jsonl");
  EXPECT_EQ(o.format, DataFormat::Chat);
  EXPECT_EQ(o.chat_template, TemplateKind::Llama3);
  EXPECT_EQ(o.train_on, TrainOn::All);
  EXPECT_EQ(o.seq_len, 128);
  EXPECT_FALSE(o.pack);
  EXPECT_EQ(o.split, TextSplit::AtSeparator);
  EXPECT_EQ(o.separator, "<|endoftext|>");
  EXPECT_DOUBLE_EQ(o.eval_fraction, 0.1);
  EXPECT_EQ(o.seed, 7u);
  EXPECT_EQ(o.epochs, 3);
  EXPECT_TRUE(o.skip_bad);
  EXPECT_EQ(o.max_record_bytes, 2048u);
  EXPECT_EQ(o.overflow, Overflow::Truncate);
  Config def;
  DataOptions d = qlft::parse_run_spec(def).data;
  EXPECT_EQ(d.split, TextSplit::BlankLines);  // "\n\n": blank lines
  EXPECT_EQ(d.max_record_bytes, 1u << 20);
  def.set("data.separator", "none");
  EXPECT_EQ(qlft::parse_run_spec(def).data.split, TextSplit::Whole);
  def.set("data.separator", "\\n");
  EXPECT_EQ(qlft::parse_run_spec(def).data.split, TextSplit::AtSeparator);
  EXPECT_EQ(qlft::parse_run_spec(def).data.separator, "\n");
  EXPECT_THROW(cfg.set("data.template", "vicuna"), Error);
}

// Garbage in: every outcome is a record list or a qlft::Error, never a crash or another exception.
TEST(DataRecords, GarbageNeverCrashes) {
  std::string dir = qlft_test::temp_dir("data_garbage");
  SplitMix64 rng(42);
  const char* frags[] = {"{",
                         "}",
                         "[",
                         "]",
                         "\"",
                         ":",
                         ",",
                         "\\",
                         "\"text\"",
                         "\"messages\"",
                         "\"role\"",
                         "\"content\"",
                         "\"instruction\"",
                         "\"output\"",
                         "null",
                         "1e999",
                         "\n",
                         "\xff\xfe",
                         "\xe2\x82",
                         "true",
                         " ",
                         "\"user\"",
                         "\"assistant\""};
  for (int f = 0; f < 300; ++f) {
    std::string text;
    int n = 1 + static_cast<int>(rng.below(60));
    for (int i = 0; i < n; ++i) text += frags[rng.below(sizeof(frags) / sizeof(frags[0]))];
    for (const char* ext : {".jsonl", ".json", ".txt"}) {
      std::string p = write(dir, std::string("g") + ext, text);
      for (bool skip : {false, true}) {
        ReadOptions o;
        o.skip_bad = skip;
        o.max_record_bytes = 64;
        DropLog log;
        try {
          read_records(p, o, log);
        } catch (const Error& e) {
          EXPECT_TRUE(e.status() == QLFT_ERR_FORMAT || e.status() == QLFT_ERR_INVALID_ARGUMENT)
              << e.what();
        }
      }
    }
  }
}

TEST(DataRecords, VarsFillPlaceholders) {
  std::string dir = qlft_test::temp_dir("data_vars");
  std::string p = write(dir, "i.json",
                        "[{\"instruction\": \"Who are you?\", \"input\": \"\", \"output\": \"I am "
                        "{{name}}, made by {{author}}. {{name}}!\"}]");
  Config cfg;
  cfg.set("data.path", p);
  cfg.set("data.vars", "name=Qlft, author=the qlft team");
  DataOptions o = qlft::parse_run_spec(cfg).data;
  ASSERT_EQ(o.vars.size(), 2u);
  ByteEncoder enc;
  Dataset ds = Dataset::build(o, enc);
  const TokenStore& st = ds.store();
  std::string text;
  for (size_t i = 0; i < st.ids.size(); ++i)
    if (st.trained[i] && st.ids[i] < 256) text += static_cast<char>(st.ids[i]);
  EXPECT_EQ(text, "I am Qlft, made by the qlft team. Qlft!");
  cfg.set("data.vars", "oops");
  EXPECT_THROW(qlft::parse_run_spec(cfg).data, Error);
}
