// Shared pieces of the qlft-finetune subcommands. Everything here uses only qlft.h.
#pragma once

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "qlft.h"

namespace cli {

// Exit codes scripts can rely on (also listed in README.md).
enum Exit : int {
  kOk = 0,
  kFailure = 1,      // any library error not listed below
  kUsage = 2,        // bad command line or settings
  kIo = 3,           // file missing or unreadable/unwritable
  kFormat = 4,       // a model or data file is malformed
  kOutOfMemory = 5,  // memory.limit or the OS refused
  kNumerical = 6,    // training diverged (non-finite loss or adapter); last finite checkpoint kept
  kCancelled = 130,  // Ctrl-C / cancelled
};
int exit_code_for(int32_t status);

// Prints "qlft-finetune: <what>: <last error>" to stderr and returns the exit code.
int fail(const char* what, int32_t status);

struct ConfigDeleter {
  void operator()(qlft_config* c) const { qlft_config_free(c); }
};
struct RuntimeDeleter {
  void operator()(qlft_runtime* r) const { qlft_runtime_free(r); }
};
struct ModelDeleter {
  void operator()(qlft_model* m) const { qlft_model_free(m); }
};
using ConfigPtr = std::unique_ptr<qlft_config, ConfigDeleter>;
using RuntimePtr = std::unique_ptr<qlft_runtime, RuntimeDeleter>;
using ModelPtr = std::unique_ptr<qlft_model, ModelDeleter>;
struct DatasetDeleter {
  void operator()(qlft_dataset* d) const { qlft_dataset_free(d); }
};
struct TrainerDeleter {
  void operator()(qlft_trainer* t) const { qlft_trainer_free(t); }
};
using DatasetPtr = std::unique_ptr<qlft_dataset, DatasetDeleter>;
using TrainerPtr = std::unique_ptr<qlft_trainer, TrainerDeleter>;

struct Args;

// Runtime, model, dataset and trainer of one command, released in reverse order.
struct TrainSession {
  RuntimePtr runtime;
  ModelPtr model;
  DatasetPtr data;
  TrainerPtr trainer;
  ~TrainSession() {
    trainer.reset();
    data.reset();
    model.reset();
    runtime.reset();
  }
};
// Creates the runtime and loads the model at path into s. Prints errors; returns 0 or an exit
// code.
int open_model(const std::string& path, const qlft_config* cfg, TrainSession* s);
// Opens runtime and model from --model, the dataset from --data (required if need_data), and a
// trainer; with --adapter DIR loads that PEFT adapter. Prints errors; returns 0 or an exit code.
int open_session(const Args& a, const qlft_config* cfg, TrainSession* s, bool need_data);

// "12.0 MiB"
std::string human_bytes(uint64_t b);

// Splits argv into positional arguments and --key value settings that are config keys.
// Unknown --flags are reported as usage errors.
struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::string> flags;                   // non-config flags (e.g. --model)
  std::vector<std::pair<std::string, std::string>> settings;  // config keys in order
};
// known_flags: subcommand flags that are not config keys; bool_flags take no value. More than
// max_positional plain words is an error naming the first extra one (`--data a.txt b.txt`
// would otherwise train on a.txt alone).
bool parse_args(int argc, char** argv, int first, const std::vector<std::string>& known_flags,
                const std::vector<std::string>& bool_flags, Args* out, std::string* error,
                size_t max_positional = 0);
// Builds a config: with --adapter DIR, the settings that DIR records for its base
// (qlft_base_config.json: how the base was stored in training) first, then the --config YAML
// file, then the --key value settings over it. Prints the error and returns nullptr on failure.
ConfigPtr make_config(const Args& a, int* exit_code);

int cmd_inspect(int argc, char** argv);
int cmd_train(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_generate(int argc, char** argv);
int cmd_data_stats(int argc, char** argv);
int cmd_config_doc(int argc, char** argv);
int cmd_eval(int argc, char** argv);
int cmd_export(int argc, char** argv);
int cmd_estimate(int argc, char** argv);
int cmd_report(int argc, char** argv);
// A setting's value as text (the default when unset; "" when the key is unknown), for messages
// and the report. Decisions read run_settings instead: the library interprets the values.
std::string setting(const qlft_config* cfg, const char* key);
// What cfg's settings mean (qlft_config_run_settings): QLFT_OK, or the library's error for
// settings it refuses (nothing printed).
int32_t run_settings(const qlft_config* cfg, qlft_run_settings* out);

// Predicted (and, when m is not NULL, measured) memory per category (cmd_estimate.cpp).
void print_memory_table(FILE* f, const qlft_memory_estimate& e, const qlft_memory_report* m);

}  // namespace cli
