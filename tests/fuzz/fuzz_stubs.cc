// The one symbol the fuzzed parsers use from the C API layer (src/core/api.cc, which pulls in
// the whole communicator and CUDA): anyrAlgoName, with the same table. A fuzz build links only
// the pure host parsers, compiled by clang with sanitizers; nothing here runs on a GPU.
#include "anyreduce/anyreduce.h"

extern "C" const char* anyrAlgoName(anyrAlgo_t algorithm) {
  static const char* const names[anyrNumAlgos] = {"auto",    "oneshot-push", "oneshot-pull",
                                                  "twoshot", "nccl",         "twoshot-push"};
  if (algorithm < 0 || algorithm >= anyrNumAlgos) return nullptr;
  return names[algorithm];
}
