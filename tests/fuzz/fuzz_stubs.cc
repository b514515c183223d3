// The one symbol the fuzzed parsers use from the C API layer (src/api/api.cc, which pulls in
// the whole communicator and CUDA): anyrAlgoName, over the one name table (base/config.cc).
// A fuzz build links only
// the pure host parsers, compiled by clang with sanitizers; nothing here runs on a GPU.
#include "anyreduce/anyreduce.h"
#include "base/config.h"

extern "C" const char* anyrAlgoName(anyrAlgo_t algorithm) { return anyr::algoName(algorithm); }
