// The CLI's run directory (tools/qlft-finetune/run_dir.cpp, compiled into this test): refusals
// with the real reason, the lock naming its holder, runs not overwritten without asking,
// leftovers of dead runs removed, metrics.jsonl trimmed to the records before a resumed step
// and written with checked writes, and JSON numbers that are never NaN.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "formats/temp_marker.h"
#include "run_dir.h"
#include "support/test_support.h"

namespace fs = std::filesystem;
using cli::RunDir;
using cli::RunDirOptions;

namespace {

void touch(const std::string& p, const std::string& text = "x") {
  std::ofstream(p) << text;
}

}  // namespace

TEST(RunDir, EmptyPathIsRefused) {
  RunDir r;
  std::string err;
  EXPECT_FALSE(r.open("", {}, &err));
  EXPECT_TRUE(r.refused());
  EXPECT_NE(err.find("train.output_dir is empty"), std::string::npos) << err;
}

TEST(RunDir, CreatesMissingParentsAndHoldsALockWithItsPid) {
  const std::string root = qlft_test::temp_dir("run_dir_parents");
  const std::string dir = root + "/a/b/c";
  RunDir r;
  std::string err;
  ASSERT_TRUE(r.open(dir + "/", {}, &err)) << err;
  EXPECT_TRUE(fs::is_directory(dir));
  EXPECT_EQ(qlft_test::read_text(dir + "/.qlft.lock"), std::to_string(::getpid()) + "\n");

  // A second run into it (flock is per open file, so this process conflicts with itself).
  RunDir second;
  EXPECT_FALSE(second.open(dir, {}, &err));
  EXPECT_TRUE(second.refused());
  EXPECT_NE(err.find("in use by another run (pid " + std::to_string(::getpid())), std::string::npos)
      << err;
}

TEST(RunDir, TheLockIsReleasedWithTheRun) {
  const std::string dir = qlft_test::temp_dir("run_dir_release");
  std::string err;
  {
    RunDir r;
    ASSERT_TRUE(r.open(dir, {}, &err)) << err;
  }
  RunDir again;
  EXPECT_TRUE(again.open(dir, {}, &err)) << err;
}

TEST(RunDir, AFileInThePathIsRefusedNamingIt) {
  const std::string root = qlft_test::temp_dir("run_dir_file");
  touch(root + "/file");
  RunDir r;
  std::string err;
  EXPECT_FALSE(r.open(root + "/file/run", {}, &err));
  EXPECT_FALSE(r.refused());
  EXPECT_NE(err.find(root + "/file: exists and is not a directory"), std::string::npos) << err;
}

TEST(RunDir, ReadOnlyFileSystemIsRefusedWithTheRealReason) {
  const std::string root = qlft_test::temp_dir("run_dir_ro");
  const std::string mnt = root + "/ro";
  fs::create_directory(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", MS_RDONLY, "size=64k") != 0)
    QLFT_SKIP("needs-root")
        << "cannot mount a read-only tmpfs here (needs root); tests/e2e/run_dir.sh "
           "covers the non-root case with chmod";
  for (const std::string& dir : {mnt, mnt + "/new/run"}) {
    RunDir r;
    std::string err;
    EXPECT_FALSE(r.open(dir, {}, &err)) << dir;
    EXPECT_NE(err.find("Read-only file system"), std::string::npos) << err;
  }
  ::umount(mnt.c_str());
}

TEST(RunDir, AnExistingRunNeedsResumeOrOverwrite) {
  const std::string dir = qlft_test::temp_dir("run_dir_existing");
  touch(dir + "/" + cli::kCheckpointFile, "ckpt");
  touch(dir + "/" + cli::kMetricsFile, "{\"step\": 1}\n");
  std::string err;
  {
    RunDir r;
    EXPECT_FALSE(r.open(dir, {}, &err));
    EXPECT_TRUE(r.refused());
    EXPECT_NE(err.find("holds a run (checkpoint.safetensors, metrics.jsonl)"), std::string::npos)
        << err;
    EXPECT_NE(err.find("--resume"), std::string::npos) << err;
    EXPECT_EQ(qlft_test::read_text(dir + "/" + cli::kCheckpointFile), "ckpt");  // untouched
  }
  {
    RunDirOptions o;
    o.resume = true;
    RunDir r;
    ASSERT_TRUE(r.open(dir, o, &err)) << err;
    EXPECT_TRUE(r.had_run());
    EXPECT_EQ(qlft_test::read_text(dir + "/" + cli::kCheckpointFile),
              "ckpt");  // kept to resume from
  }
  {
    RunDirOptions o;
    o.overwrite = true;
    RunDir r;
    ASSERT_TRUE(r.open(dir, o, &err)) << err;
    EXPECT_FALSE(fs::exists(dir + "/" + cli::kCheckpointFile));
    EXPECT_FALSE(fs::exists(dir + "/" + cli::kMetricsFile));
  }
}

// A temporary as a writer that was killed leaves it: made and marked by a process that is gone.
void dead_writers_temp(const std::string& path, bool dir) {
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (dir)
      fs::create_directories(path);
    else
      touch(path);
    ::_exit(qlft::temp::mark_path(path, path) ? 0 : 1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "cannot mark " << path;
}

TEST(RunDir, LeftoversOfDeadRunsAreRemovedAndAMovedAsideAdapterComesBack) {
  const std::string dir = qlft_test::temp_dir("run_dir_leftovers");
  dead_writers_temp(dir + "/checkpoint.safetensors.tmp.12345", false);
  dead_writers_temp(dir + "/adapter.gguf.tmp.77", false);
  dead_writers_temp(dir + "/adapter.tmp.999", true);
  touch(dir + "/adapter.tmp.999/adapter_model.safetensors");
  // A save that died between moving the old adapter aside and renaming the new one in.
  dead_writers_temp(dir + "/adapter.old.4242", true);
  touch(dir + "/adapter.old.4242/adapter_config.json", "{}");
  touch(dir + "/notes.tmp.txt");  // not a temporary of ours: kept
  RunDirOptions o;
  o.resume = true;
  RunDir r;
  std::string err;
  ASSERT_TRUE(r.open(dir, o, &err)) << err;
  EXPECT_FALSE(fs::exists(dir + "/checkpoint.safetensors.tmp.12345"));
  EXPECT_FALSE(fs::exists(dir + "/adapter.gguf.tmp.77"));
  EXPECT_FALSE(fs::exists(dir + "/adapter.tmp.999"));
  EXPECT_FALSE(fs::exists(dir + "/adapter.old.4242"));
  EXPECT_EQ(qlft_test::read_text(dir + "/adapter/adapter_config.json"), "{}");
  EXPECT_TRUE(fs::exists(dir + "/notes.tmp.txt"));
  EXPECT_EQ(r.removed().size(), 3u);
}

// Issue 44 item 4: names of the temporaries' form that qlft did not make (no marker), or whose
// maker still runs, are a user's files: kept, whole.
TEST(RunDir, UserFilesWithTemporaryNamesAreKept) {
  const std::string dir = qlft_test::temp_dir("run_dir_user_tmp");
  fs::create_directories(dir + "/backup.tmp.1");
  touch(dir + "/backup.tmp.1/thesis.tex", "\\documentclass{article}");
  touch(dir + "/notes.tmp.2024", "notes");
  touch(dir + "/checkpoint.safetensors.tmp.5", "mine");
  touch(dir + "/live.tmp.7", "a live writer's");
  ASSERT_TRUE(qlft::temp::mark_path(dir + "/live.tmp.7", dir + "/live.tmp.7"));  // this process
  // A marker naming another entry (a file renamed after it was marked) does not make it ours.
  dead_writers_temp(dir + "/x.tmp.3", false);
  fs::rename(dir + "/x.tmp.3", dir + "/renamed.tmp.4");
  RunDir r;
  std::string err;
  ASSERT_TRUE(r.open(dir, {}, &err)) << err;
  EXPECT_EQ(qlft_test::read_text(dir + "/backup.tmp.1/thesis.tex"), "\\documentclass{article}");
  EXPECT_EQ(qlft_test::read_text(dir + "/notes.tmp.2024"), "notes");
  EXPECT_EQ(qlft_test::read_text(dir + "/checkpoint.safetensors.tmp.5"), "mine");
  EXPECT_EQ(qlft_test::read_text(dir + "/live.tmp.7"), "a live writer's");
  EXPECT_TRUE(fs::exists(dir + "/renamed.tmp.4"));
  EXPECT_TRUE(r.removed().empty());
}

// Issue 44 item 5: the lock file is never written through a symlink or a hard link.
TEST(RunDir, ALockFileSymlinkOrHardLinkIsRefusedAndItsTargetKept) {
  const std::string root = qlft_test::temp_dir("run_dir_lock_link");
  touch(root + "/victim.txt", "precious");
  fs::create_directories(root + "/sym");
  fs::create_symlink("../victim.txt", root + "/sym/.qlft.lock");
  RunDir r;
  std::string err;
  EXPECT_FALSE(r.open(root + "/sym", {}, &err));
  EXPECT_TRUE(r.refused());
  EXPECT_NE(err.find("is a symbolic link"), std::string::npos) << err;
  EXPECT_EQ(qlft_test::read_text(root + "/victim.txt"), "precious");

  fs::create_directories(root + "/hard");
  fs::create_hard_link(root + "/victim.txt", root + "/hard/.qlft.lock");
  RunDir h;
  EXPECT_FALSE(h.open(root + "/hard", {}, &err));
  EXPECT_TRUE(h.refused());
  EXPECT_NE(err.find("other hard links"), std::string::npos) << err;
  EXPECT_EQ(qlft_test::read_text(root + "/victim.txt"), "precious");

  // A FIFO there does not hang the run.
  fs::create_directories(root + "/fifo");
  ASSERT_EQ(::mkfifo((root + "/fifo/.qlft.lock").c_str(), 0644), 0);
  RunDir f;
  EXPECT_FALSE(f.open(root + "/fifo", {}, &err));
  EXPECT_NE(err.find("not a regular file"), std::string::npos) << err;
}

// Issue 44 item 5: deleting .qlft.lock while a run holds the directory lets no second run in.
TEST(RunDir, DeletingTheLockFileLetsNoSecondRunIn) {
  const std::string dir = qlft_test::temp_dir("run_dir_lock_deleted");
  RunDir first;
  std::string err;
  ASSERT_TRUE(first.open(dir, {}, &err)) << err;
  ASSERT_TRUE(fs::remove(dir + "/.qlft.lock"));
  RunDirOptions o;
  o.overwrite = true;
  RunDir second;
  EXPECT_FALSE(second.open(dir, o, &err));
  EXPECT_TRUE(second.refused());
  EXPECT_NE(err.find("in use by another run"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(dir + "/.qlft.lock"));  // the refused run created nothing
  // From another process too (flock is per open file; a child has its own).
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    RunDir child;
    std::string e;
    ::_exit(!child.open(dir, o, &e) && child.refused() ? 0 : 1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(RunDir, SameFileAndInside) {
  const std::string dir = qlft_test::temp_dir("run_dir_same");
  touch(dir + "/m.gguf");
  EXPECT_TRUE(cli::same_file(dir + "/m.gguf", dir + "/./m.gguf"));
  EXPECT_FALSE(cli::same_file(dir + "/m.gguf", dir + "/other.gguf"));
  EXPECT_TRUE(cli::is_inside(dir + "/out/x", dir));
  EXPECT_TRUE(cli::is_inside(dir, dir + "/"));
  EXPECT_FALSE(cli::is_inside(dir, dir + "/out"));
}

TEST(Metrics, RecordsBeforeAResumedStepAreKeptAndTheRestDropped) {
  const std::string text =
      "{\"step\": 1, \"loss\": 2}\n"
      "{\"step\": 2, \"loss\": 2}\n"
      "garbage\n"
      "{\"step\": 3, \"loss\": 2}\n"
      "{\"step\": 4, \"loss\": 2}\n"
      "{\"step\": 5, \"lo";  // cut off mid-line by a crash
  EXPECT_EQ(cli::metrics_records_before(text, 3),
            "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"loss\": 2}\n");
  EXPECT_EQ(cli::metrics_records_before(text, 1), "");
  EXPECT_EQ(cli::metrics_records_before(text, 100),
            "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"loss\": 2}\n{\"step\": 3, \"loss\": "
            "2}\n{\"step\": 4, \"loss\": 2}\n");
}

TEST(Metrics, OpenOnResumeTrimsThenAppends) {
  const std::string p = qlft_test::temp_dir("metrics_trim") + "/metrics.jsonl";
  touch(p, "{\"step\": 1}\n{\"step\": 2}\n{\"step\": 3}\n{\"step\": 2");
  cli::MetricsLog m;
  std::string err;
  ASSERT_TRUE(m.open(p, 3, &err)) << err;
  ASSERT_TRUE(m.append("{\"step\": 3, \"again\": true}", &err)) << err;
  m.close();
  EXPECT_EQ(qlft_test::read_text(p),
            "{\"step\": 1}\n{\"step\": 2}\n{\"step\": 3, \"again\": true}\n");
}

TEST(Metrics, AFailedWriteIsReportedWithTheReason) {
  cli::MetricsLog m;
  std::string err;
  ASSERT_TRUE(m.open("/dev/full", 0, &err)) << err;
  EXPECT_FALSE(m.append("{\"step\": 1}", &err));
  EXPECT_NE(err.find("/dev/full: write failed: No space left on device"), std::string::npos) << err;
}

TEST(Metrics, JsonNumbersAreNeverNaN) {
  EXPECT_EQ(cli::json_number(NAN), "null");
  EXPECT_EQ(cli::json_number(INFINITY), "null");
  EXPECT_EQ(cli::json_number(-INFINITY), "null");
  EXPECT_EQ(cli::json_number(1.5, "%.6f"), "1.500000");
}
