// The one rule every writer follows (exports, merged exports, adapter and checkpoint saves, the
// report): an output never replaces an input of the operation, nor a file the training run owns.
//
// Paths are compared by what they name on disk, not by spelling: an existing path is its
// (device, inode) after symbolic links, so a symlink, a hard link or a `..` detour to an input is
// the input; a path that does not exist yet is its resolved parent directory's (device, inode)
// plus its last name. A directory input (a PEFT adapter, a Hugging Face model directory) counts
// as itself and every entry in it, so a new file may be written beside its files but none of
// them may be replaced. A refusal names both paths; nothing is written.
//
// Plain POSIX, no qlft headers: the CLI compiles this file too (tools/qlft-finetune/
// core_units.cpp), to refuse before the model loads with the same rule.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace qlft {

// What a path names (see above). valid is false when neither the path nor its parent resolves
// (a write there fails anyway, so it matches nothing).
struct PathId {
  dev_t dev = 0;
  ino_t ino = 0;
  std::string name;  // empty for an existing path; the last component of a path not there yet
  bool valid = false;
  bool operator==(const PathId& o) const {
    return valid && o.valid && dev == o.dev && ino == o.ino && name == o.name;
  }
};
PathId path_id(const std::string& path);

// The files a training run directory (train.output_dir) holds, as the CLI names them
// (tools/qlft-finetune/run_dir.h keeps the same names for the CLI).
inline constexpr const char* kRunOwnedFiles[] = {"checkpoint.safetensors", "metrics.jsonl",
                                                 "adapter", "adapter.gguf", ".qlft.lock"};

class OutputGuard {
 public:
  // `what` says what the input is in the message ("the model", "the adapter (lora.init_from)").
  // A directory adds itself and each entry directly in it. A path that does not exist is kept
  // by its parent + name (a run's metrics.jsonl before its first step).
  void add_input(const std::string& path, const std::string& what);
  // The run-owned files of `dir` but `except` (the file this writer exists to write, e.g. the
  // checkpoint writer's checkpoint.safetensors; nullptr: none is excepted).
  void add_run_dir(const std::string& dir, const char* except);

  // "" when out may be written; else the refusal, "<writer>: <out> is <what> (<input path>)
  // ...", which the caller reports as QLFT_ERR_INVALID_ARGUMENT (the C ABI) or exit code 2 (the
  // CLI). replaced_whole: out is a directory the writer replaces with everything in it (a PEFT
  // adapter), so an input anywhere inside it is refused too.
  std::string refusal(const std::string& out, const char* writer,
                      bool replaced_whole = false) const;

 private:
  struct Input {
    PathId id;
    std::string path, what;
  };
  std::vector<Input> inputs_;
};

}  // namespace qlft
