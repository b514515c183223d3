// The anyreduce command's exit status: one convention for every subcommand, so that a script
// can tell "this machine cannot run it" from "it ran and failed" and from a mistyped command.
// README ("The tool") and every --help (kExitCodesHelp) state it.
#pragma once

namespace anyr {
namespace tool {

constexpr int kExitOk = 0;
// The work ran and failed: a rank failed, a library call failed, a file could not be read.
constexpr int kExitFailed = 1;
// The command line was refused before any GPU work: an unknown flag, a value outside its rule.
constexpr int kExitUsage = 2;
// This machine cannot run the command: no NVIDIA driver, no GPU visible, a GPU this build has
// no kernels for (the library's check says which and what to do), or fewer GPUs than the
// command needs.
constexpr int kExitNoGpu = 3;
// bench: a result was wrong (the table's #wrong column above 0; nccl-tests' "out of bounds").
constexpr int kExitWrongResult = 4;
// bench --check-dispatch: the dispatched choice was slower than its bound.
constexpr int kExitDispatchSlow = 5;

inline const char* exitCodesHelp() {
  return "Exit status: 0 done; 1 the run failed; 2 the command line was refused; 3 this "
         "machine cannot run it (no NVIDIA driver or GPU, a GPU this build has no kernels for, "
         "or too few GPUs); 4 bench found a wrong result; 5 bench --check-dispatch found the "
         "dispatched choice too slow.\n";
}

}  // namespace tool
}  // namespace anyr
