// The `bench` and `tune` subcommands' flags (bench.cc, bench_fused.cc and dispatch_cmds.cc run
// them).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace anyr {
namespace tool {

// Adds `bench` to `app`: nccl-tests' flags (-b -e -f -g -n -w -c -d -o -G -a) and anyreduce's
// own; the returned function checks what parsing cannot and runs it (the exit code). argv is
// read for the old meaning of -n (ranks), to say that it changed.
std::function<int()> addBenchCommand(CLI::App& app, int argc, char** argv);

// Adds `tune` to `app`; the returned function runs it (the exit code).
std::function<int()> addTuneCommand(CLI::App& app);

}  // namespace tool
}  // namespace anyr
