// Starts one process per rank for the command-line tool and the multi-process tests. Rank 0's
// process creates the anyreduce unique id (so it keeps the rendezvous socket) and the parent
// hands it to the others. The parent never initializes CUDA (children fork from it), waits
// with a deadline, and kills every child that outlives it: no run can hang.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "anyreduce/anyreduce.h"

namespace anyr {
namespace launch {

struct RankResult {
  int rank = -1;
  int exitCode = -1;  // -1 when killed by a signal
  int signal = 0;
  bool timedOut = false;  // killed by the parent at the deadline
  std::string message;    // what the child wrote to its report channel
};

// A child's body: returns its exit code. `report` appends text to the parent's RankResult.
using RankMain = std::function<int(int rank, int nranks, const anyrUniqueId& id,
                                   const std::function<void(const std::string&)>& report)>;

// Runs `body` in `nranks` forked processes. Must be called before this process initializes
// CUDA. timeoutSec bounds the whole run.
std::vector<RankResult> runRanks(int nranks, const RankMain& body, double timeoutSec);

// Number of GPUs this build can run on, asked in a short-lived child (anyrCheckDevices) so
// this process stays CUDA-free. Returns 0 when there is no driver, no GPU, or a GPU without
// kernels in this build; *why then holds the library's message (what is missing and what to
// do), else "ok".
int countGpus(std::string* why);

// One line per failed rank ("rank 1: exit 3: <message>"); "" when all succeeded.
std::string describeFailures(const std::vector<RankResult>& results);

}  // namespace launch
}  // namespace anyr
