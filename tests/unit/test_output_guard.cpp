// The writers' rule (issue 44): formats/output_guard (an output never names an input, after
// symlinks, hard links and `..`), formats/temp_marker (cleanup removes a killed writer's
// temporary and never a user's file) and AtomicFile's use of both (exclusive temporaries, the
// replaced file's permissions kept).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "formats/atomic_file.h"
#include "formats/output_guard.h"
#include "formats/temp_marker.h"
#include "support/test_support.h"

namespace fs = std::filesystem;
using qlft::OutputGuard;

namespace {

void touch(const std::string& p, const std::string& text = "x") {
  std::ofstream(p) << text;
}
bool refused(const OutputGuard& g, const std::string& out, bool whole = false) {
  return !g.refusal(out, "test", whole).empty();
}
mode_t mode_of(const std::string& p) {
  struct stat st;
  EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

}  // namespace

TEST(OutputGuard, AnInputIsRefusedUnderEverySpelling) {
  const std::string d = qlft_test::temp_dir("guard_spellings");
  fs::create_directories(d + "/models/sub");
  touch(d + "/models/m.gguf", "model");
  fs::create_symlink("models/m.gguf", d + "/link.gguf");
  fs::create_hard_link(d + "/models/m.gguf", d + "/hard.gguf");
  OutputGuard g;
  g.add_input(d + "/models/m.gguf", "the model");
  EXPECT_TRUE(refused(g, d + "/models/m.gguf"));
  EXPECT_TRUE(refused(g, d + "/link.gguf"));
  EXPECT_TRUE(refused(g, d + "/hard.gguf"));
  EXPECT_TRUE(refused(g, d + "/models/sub/../m.gguf"));
  EXPECT_TRUE(refused(g, d + "/./models//m.gguf"));
  EXPECT_FALSE(refused(g, d + "/models/other.gguf"));
  EXPECT_FALSE(refused(g, d + "/models/sub"));
  const std::string why = g.refusal(d + "/link.gguf", "export");
  EXPECT_NE(why.find("export: " + d + "/link.gguf is the model (" + d + "/models/m.gguf"),
            std::string::npos)
      << why;
}

TEST(OutputGuard, ADirectoryInputIsItselfAndItsFilesButNewNamesBesideThemAreFine) {
  const std::string d = qlft_test::temp_dir("guard_dir");
  fs::create_directories(d + "/ad");
  touch(d + "/ad/adapter_model.safetensors");
  touch(d + "/ad/adapter_config.json");
  OutputGuard g;
  g.add_input(d + "/ad/", "the adapter");
  EXPECT_TRUE(refused(g, d + "/ad/adapter_model.safetensors"));  // issue 44 item 1
  EXPECT_TRUE(refused(g, d + "/ad"));
  EXPECT_FALSE(refused(g, d + "/ad/adapter.gguf"));
  // A directory replaced whole may not hold an input.
  EXPECT_TRUE(refused(g, d, /*whole=*/true));
  EXPECT_FALSE(refused(g, d));
  fs::create_symlink("ad", d + "/alias");
  EXPECT_TRUE(refused(g, d + "/alias/adapter_config.json"));
}

TEST(OutputGuard, NotYetExistingFilesCompareByDirectoryAndName) {
  const std::string d = qlft_test::temp_dir("guard_new");
  fs::create_directories(d + "/run");
  fs::create_symlink("run", d + "/runlink");
  OutputGuard g;
  g.add_run_dir(d + "/run", "checkpoint.safetensors");
  EXPECT_TRUE(refused(g, d + "/runlink/metrics.jsonl"));  // none there yet: parent + name
  EXPECT_TRUE(refused(g, d + "/run/.qlft.lock"));
  EXPECT_FALSE(refused(g, d + "/run/checkpoint.safetensors"));  // the excepted one
  EXPECT_FALSE(refused(g, d + "/run/report.html"));
  EXPECT_FALSE(refused(g, d + "/missing/metrics.jsonl"));  // nowhere to write: no verdict
}

// A writer killed mid-write (here: a child that exits without committing) leaves a marked
// temporary; the next write of the same file removes it, and nothing else.
TEST(TempMarker, AKilledWritersTemporaryIsRemovedByTheNextWriteAndUserFilesAreNot) {
  const std::string d = qlft_test::temp_dir("temp_marker_killed");
  const std::string out = d + "/m.gguf";
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    qlft::AtomicFile f(out);
    f.write(std::string(4096, 'g'));
    ::_exit(0);  // no destructor: as SIGKILL leaves it
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  const std::string leftover = out + ".tmp." + std::to_string(pid);
  ASSERT_TRUE(fs::exists(leftover));
  EXPECT_TRUE(qlft::temp::is_stale(d, "m.gguf.tmp." + std::to_string(pid)));
  fs::create_directories(d + "/backup.tmp.1");
  touch(d + "/backup.tmp.1/thesis.tex", "thesis");
  touch(d + "/m.gguf.tmp.2024", "user's");  // the target's own pattern, but no marker
  qlft::write_file_atomic(out, "new");
  EXPECT_FALSE(fs::exists(leftover));
  EXPECT_EQ(qlft_test::read_text(out), "new");
  EXPECT_EQ(qlft_test::read_text(d + "/backup.tmp.1/thesis.tex"), "thesis");
  EXPECT_EQ(qlft_test::read_text(d + "/m.gguf.tmp.2024"), "user's");
  // This process's own marked temporary is alive, not stale.
  touch(d + "/own.tmp.1");
  ASSERT_TRUE(qlft::temp::mark_path(d + "/own.tmp.1", "own.tmp.1"));
  EXPECT_FALSE(qlft::temp::is_stale(d, "own.tmp.1"));
  // The committed file carries no marker.
  char buf[256];
  EXPECT_LT(::lgetxattr(out.c_str(), "user.qlft.temp", buf, sizeof buf), 0);
  EXPECT_TRUE(qlft::temp::remove_stale(d, "", true).empty());
}

TEST(TempMarker, NamesOfTheTemporaryForm) {
  std::string stem, kind;
  EXPECT_TRUE(qlft::temp::parse_temp_name("a.gguf.tmp.12", "a.gguf", &stem, &kind));
  EXPECT_EQ(stem, "a.gguf");
  EXPECT_EQ(kind, "tmp");
  EXPECT_TRUE(qlft::temp::parse_temp_name("adapter.old.3", "", &stem, &kind));
  EXPECT_EQ(kind, "old");
  EXPECT_FALSE(qlft::temp::parse_temp_name("b.gguf.tmp.12", "a.gguf", nullptr, nullptr));
  EXPECT_FALSE(qlft::temp::parse_temp_name("aa.gguf.tmp.12", "a.gguf", nullptr, nullptr));
  EXPECT_FALSE(qlft::temp::parse_temp_name("notes.tmp.txt", "", nullptr, nullptr));
  EXPECT_FALSE(qlft::temp::parse_temp_name(".tmp.1", "", nullptr, nullptr));
}

// The temporary is created exclusively: a symlink planted at its name is not written through.
TEST(AtomicFileGuard, APlantedSymlinkAtTheTemporaryNameIsNotFollowed) {
  const std::string d = qlft_test::temp_dir("atomic_symlink");
  touch(d + "/victim", "precious");
  fs::create_symlink(d + "/victim", d + "/out.bin.tmp." + std::to_string(::getpid()));
  EXPECT_THROW(qlft::write_file_atomic(d + "/out.bin", "data"), qlft::Error);
  EXPECT_EQ(qlft_test::read_text(d + "/victim"), "precious");
  EXPECT_FALSE(fs::exists(d + "/out.bin"));
}

// Issue 44 item 10: a saved file keeps the permissions of the one it replaces.
TEST(AtomicFileGuard, TheReplacedFilesModeIsKept) {
  const std::string d = qlft_test::temp_dir("atomic_mode");
  const std::string p = d + "/checkpoint.safetensors";
  qlft::write_file_atomic(p, "one");
  ASSERT_EQ(::chmod(p.c_str(), 0600), 0);
  qlft::write_file_atomic(p, "two");
  EXPECT_EQ(mode_of(p), 0600u);
  EXPECT_EQ(qlft_test::read_text(p), "two");
  ASSERT_EQ(::chmod(p.c_str(), 0640), 0);
  qlft::write_file_atomic(p, "three");
  EXPECT_EQ(mode_of(p), 0640u);
}
