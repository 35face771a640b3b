// YAML run files: flattening, lists, all-or-nothing errors with file and line.
#include <gtest/gtest.h>

#include "config/config_file.h"
#include "core/error.h"

using namespace qlft;

TEST(ConfigFile, NestedMapsFlattenToDottedKeys) {
  Config c;
  load_config_text(c, "quant:\n  type: int8\n  double_quant: false\nthreads: 2\n", "run.yaml");
  EXPECT_EQ(c.get("quant.type"), "int8");
  EXPECT_FALSE(c.get_bool("quant.double_quant"));
  EXPECT_EQ(c.get_int("threads"), 2);
  load_config_text(c, "memory.limit: 3G\n", "run.yaml");  // dotted keys work too
  EXPECT_EQ(c.get_size("memory.limit"), 3ull << 30);
}

TEST(ConfigFile, ErrorsNameFileLineAndKeyAndChangeNothing) {
  Config c;
  c.set("threads", "3");
  try {
    load_config_text(c, "threads: 1\nquant:\n  type: q9\n", "run.yaml");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(e.status(), QLFT_ERR_INVALID_ARGUMENT);
    EXPECT_NE(m.find("run.yaml:3"), std::string::npos) << m;
    EXPECT_NE(m.find("quant.type"), std::string::npos) << m;
  }
  EXPECT_EQ(c.get_int("threads"), 3);  // the valid first line was not applied either
  EXPECT_THROW(load_config_text(c, "no_such: 1\n", "x.yaml"), Error);
  EXPECT_THROW(load_config_text(c, "threads: [1, 2\n", "x.yaml"), Error);
  EXPECT_THROW(load_config_text(c, "- 1\n- 2\n", "x.yaml"), Error);
  EXPECT_THROW(load_config_file(c, "/nonexistent/run.yaml"), Error);
  EXPECT_EQ(c.get_int("threads"), 3);
}
