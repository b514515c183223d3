#include "cli_common.h"

#include <cstdio>
#include <fstream>
#include <stdexcept>

#include "common/api.h"

namespace anyr {
namespace tool {

void addJsonFlag(CLI::App* cmd, JsonFlag* flag, const std::string& what) {
  flag->option = cmd->add_option("--json", flag->path,
                                 "Write " + what +
                                     " as JSON to FILE; bare --json: the JSON on stdout "
                                     "instead of the text (no progress line either way)")
                     ->expected(0, 1)
                     ->type_name("[FILE]");
}

void emitJson(const JsonFlag& flag, const std::string& text) {
  if (flag.toStdout()) {
    std::fputs(text.c_str(), stdout);
    if (text.empty() || text.back() != '\n') std::fputs("\n", stdout);
    std::fflush(stdout);
    return;
  }
  if (!flag.toFile()) return;
  std::ofstream f(flag.path);
  f << text;
  if (text.empty() || text.back() != '\n') f << "\n";
  if (!f) throw std::runtime_error("cannot write --json " + flag.path);
}

void addRanksFlag(CLI::App* cmd, int* nranks, const std::string& help, int lo, int hi,
                  bool deprecatedDashN) {
  cmd->add_option("--ranks,--nranks", *nranks, help)->check(CLI::Range(lo, hi));
  if (!deprecatedDashN) return;
  const std::string name = cmd->get_name();
  cmd->add_option("-n", *nranks, "Deprecated: --ranks")
      ->check(CLI::Range(lo, hi))
      ->group("")  // hidden from the help
      ->each([name](const std::string& v) {
        std::fprintf(stderr,
                     "anyreduce %s: note: -n %s is deprecated for the number of ranks; use "
                     "--ranks %s (in `anyreduce bench`, -n is the iteration count, as in "
                     "nccl-tests)\n",
                     name.c_str(), v.c_str(), v.c_str());
      });
}

uint64_t parseSizeOrThrow(const std::string& text, const char* flag) {
  uint64_t v = 0;
  if (!parseSize(text, &v))
    throw CLI::ValidationError(flag, "'" + text + "' is not a size (e.g. 1024, 64K, 8M, 1G)");
  return v;
}

void requireWritable(const std::string& path, const char* flag) {
  if (path.empty()) return;
  const bool existed = std::ifstream(path).good();
  const bool ok = std::ofstream(path, std::ios::app).good();
  if (!existed) std::remove(path.c_str());
  if (!ok) throw CLI::ValidationError(flag, "cannot write '" + path + "'");
}

}  // namespace tool
}  // namespace anyr
