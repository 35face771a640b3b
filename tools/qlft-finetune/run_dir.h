// The output directory of a training run as one unit (train.output_dir), prepared before the
// model loads so a bad directory costs seconds, not a whole run:
//  - the empty path is refused; the directory is created with its parents;
//  - advisory locks are held for the run: flock on the directory itself (so deleting the lock
//    file lets no second run in) and on <dir>/.qlft.lock, which holds the holder's pid: a
//    second run into the same directory is refused naming that pid. Creating the lock file is
//    also the writability check, so the error is the system's real reason (read-only file
//    system, not a directory, permission denied); it is opened O_NOFOLLOW and must be a regular
//    file with no other hard link (a planted symlink or link is refused, never written through);
//  - a directory holding a started or finished run (checkpoint, metrics, adapters) is refused
//    unless the run is resumed or overwrite is asked for (then those files are removed first);
//  - temporary files and directories of dead writers (`*.tmp.<pid>` of the atomic writers, a
//    PEFT adapter moved aside as `adapter.old.<pid>`: put back when no adapter replaced it) are
//    removed when they carry qlft's marker and their writer is gone (src/formats/temp_marker.h);
//    nothing else with such a name is touched.
// Plain POSIX; no qlft.h (tests compile it on its own).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cli {

// What a run leaves in its directory (the names the CLI writes).
inline constexpr const char* kCheckpointFile = "checkpoint.safetensors";
inline constexpr const char* kMetricsFile = "metrics.jsonl";
inline constexpr const char* kAdapterDir = "adapter";
inline constexpr const char* kAdapterGguf = "adapter.gguf";
inline constexpr const char* kLockFile = ".qlft.lock";

struct RunDirOptions {
  bool resume = false;     // --resume: an existing run is continued
  bool overwrite = false;  // --overwrite: an existing run is deleted and replaced
};

class RunDir {
 public:
  RunDir() = default;
  ~RunDir();  // releases the lock (the lock file stays; only the flock matters)
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;

  // Everything above, in that order. On failure returns false with *error saying why (naming
  // the path) and holds nothing.
  bool open(const std::string& dir, const RunDirOptions& opt, std::string* error);

  const std::string& path() const { return dir_; }
  std::string file(const char* name) const { return dir_ + "/" + name; }
  // Entries removed by open() as leftovers of dead runs (for the log and for tests).
  const std::vector<std::string>& removed() const { return removed_; }
  // True when open() found a run (checkpoint, metrics or adapters) in the directory.
  bool had_run() const { return had_run_; }
  // After a failed open(): true when the request was refused (empty path, a run already
  // there), false when the file system failed (not writable, a file in the way, locked).
  bool refused() const { return refused_; }

 private:
  void release();  // closes the locks after a failed open()

  std::string dir_;
  int lock_fd_ = -1;
  int dir_fd_ = -1;  // the directory, flocked
  bool had_run_ = false;
  bool refused_ = false;
  std::vector<std::string> removed_;
};

// Creates dir and its missing parents (mkdir -p). false with *error naming the component that
// failed and the system's reason.
bool make_dirs(const std::string& dir, std::string* error);

bool file_exists(const std::string& path);

// True when a and b name the same existing file or directory (same device and inode).
bool same_file(const std::string& a, const std::string& b);
// True when inner is outer_dir or lies under it (paths resolved; need not exist).
bool is_inside(const std::string& inner, const std::string& outer_dir);

// metrics.jsonl, appended one record per line with checked writes: a failed or short write is
// reported (the caller stops the run) and the partial line is cut off again.
class MetricsLog {
 public:
  ~MetricsLog();
  // truncate_from_step > 0: an existing file keeps only its complete records of steps before
  // that step (a resumed run rewrites the later ones); 0 starts the file empty.
  bool open(const std::string& path, uint64_t keep_before_step, std::string* error);
  bool append(const std::string& line, std::string* error);  // line without '\n'
  bool is_open() const { return fd_ >= 0; }
  void close();

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;  // bytes of complete records
};

// Keeps the lines of a metrics.jsonl text that are complete records (end in '\n', hold
// "step": N) with N < keep_before_step. Exposed for tests.
std::string metrics_records_before(const std::string& text, uint64_t keep_before_step);

// A JSON number, or null for NaN and infinities (JSON has no NaN).
std::string json_number(double v, const char* fmt = "%.6g");

}  // namespace cli
