// Temporaries that qlft can recognise as its own, so cleanup never removes a user's file.
//
// Every temporary a writer makes (AtomicFile's `<path>.tmp.<pid>`, a PEFT adapter's
// `<dir>.tmp.<pid>/`, an old adapter moved aside as `<dir>.old.<pid>/`) carries the extended
// attribute `user.qlft.temp`: its own name, the pid, the process's start time (clock ticks
// since boot) and the boot id of its maker. Cleanup removes an entry only when its name has
// that form AND its marker names that entry AND the maker is gone (no process with that pid
// and start time in this boot). A user's `notes.tmp.2024` or `backup.tmp.1/` has no marker and
// is never touched; on a file system without user extended attributes a temporary gets no
// marker and a dead writer's leftover stays (it is never removed on a guess).
//
// Plain POSIX, no qlft headers: the CLI's run directory (tools/qlft-finetune/run_dir.cpp)
// compiles this file too.
#pragma once

#include <string>
#include <vector>

namespace qlft::temp {

// "<path>.tmp.<pid>" (this process).
std::string temp_path(const std::string& path);
// "<path>.old.<pid>" (this process): an adapter directory moved aside.
std::string old_path(const std::string& path);

// Marks the open file or directory fd (or the entry at path) as a temporary of this process
// that will be named `as_name` (the last component). false when the file system keeps no
// extended attributes (the temporary is then simply never cleaned up by others).
bool mark(int fd, const std::string& as_name);
bool mark_path(const std::string& path, const std::string& as_name);
// Removes the marker (a temporary that became the real file); best effort.
void unmark_path(const std::string& path);

// True when dir/name is a marked temporary (its marker names `name`) whose maker is gone.
bool is_stale(const std::string& dir, const std::string& name);

// `<base>.tmp.<digits>` or `<base>.old.<digits>` (any base when base is empty); *stem gets the
// part before the marker, *kind "tmp" or "old".
bool parse_temp_name(const std::string& name, const std::string& base, std::string* stem,
                     std::string* kind);

// Removes the stale temporaries in dir (`.tmp.` ones, and `.old.` ones when with_old) of the
// target `base` (empty: of every target), files or whole directories; returns their paths.
std::vector<std::string> remove_stale(const std::string& dir, const std::string& base,
                                      bool with_old);

}  // namespace qlft::temp
