// Flags and checks every `anyreduce` command shares: `--json [FILE]`, the number of ranks,
// sizes, output files, the timing flags.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace anyr {
namespace tool {

// `--json [FILE]`: with FILE the command writes its JSON record there (its text still goes to
// stdout); bare, the JSON goes to stdout in place of the text.
struct JsonFlag {
  std::string path;
  CLI::Option* option = nullptr;
  bool given() const { return option != nullptr && option->count() > 0; }
  bool toStdout() const { return given() && path.empty(); }
  bool toFile() const { return given() && !path.empty(); }
};
// Adds --json to `cmd` into *flag (which must outlive the parse); `what` names the record.
void addJsonFlag(CLI::App* cmd, JsonFlag* flag, const std::string& what);
// Writes `text` (a JSON document) where the flag says: stdout or its file. Throws
// std::runtime_error when the file cannot be written.
void emitJson(const JsonFlag& flag, const std::string& text);

// `--ranks N` (also `--nranks N`) into *nranks, in lo..hi. The number of ranks has no short
// form: in `bench`, -n is the iteration count as in nccl-tests. Where -n meant ranks (tune,
// explain, doctor), `-n N` still sets them, hidden from the help, with a note on stderr that it
// is deprecated.
void addRanksFlag(CLI::App* cmd, int* nranks, const std::string& help, int lo, int hi,
                  bool deprecatedDashN);

// A size such as 1024, 64K, 8M, 1G (the library's anyrParseSize); throws CLI::ValidationError
// naming `flag` otherwise.
uint64_t parseSizeOrThrow(const std::string& text, const char* flag);

// An output file is checked before a run, which may take minutes, rather than after it: its
// directory must exist and take the file (a file made only for the check is removed). Throws
// CLI::ValidationError naming `flag`.
void requireWritable(const std::string& path, const char* flag);

}  // namespace tool
}  // namespace anyr
