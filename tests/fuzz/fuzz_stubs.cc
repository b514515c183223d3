// The one symbol the fuzzed parsers use from the C API layer (src/api/api.cc, which pulls in
// the whole communicator and CUDA): anyrAlgoName, over the algorithm registry's names
// (algo/registry.cc, built here with ANYR_HOST_ONLY: no kernels). A fuzz build links only
// the pure host parsers, compiled by clang with sanitizers; nothing here runs on a GPU.
#include "algo/registry.h"
#include "anyreduce/anyreduce.h"

extern "C" const char* anyrAlgoName(anyrAlgo_t algorithm) { return anyr::algoName(algorithm); }
