// The CUDA driver calls of the virtual-memory transport (vmm_peer_memory.cc), found at run time
// through the runtime's cudaGetDriverEntryPointByVersion: the library links only the runtime,
// and builds on machines without a driver (CI). Types come from <cuda.h>, a header only.
#pragma once

#include <cuda.h>

#include <string>

namespace anyr {

struct CuDriver {
  decltype(&::cuGetErrorString) getErrorString = nullptr;
  decltype(&::cuDeviceGet) deviceGet = nullptr;
  decltype(&::cuDeviceGetAttribute) deviceGetAttribute = nullptr;
  decltype(&::cuMemGetAllocationGranularity) memGetAllocationGranularity = nullptr;
  decltype(&::cuMemCreate) memCreate = nullptr;
  decltype(&::cuMemRelease) memRelease = nullptr;
  decltype(&::cuMemAddressReserve) memAddressReserve = nullptr;
  decltype(&::cuMemAddressFree) memAddressFree = nullptr;
  decltype(&::cuMemMap) memMap = nullptr;
  decltype(&::cuMemUnmap) memUnmap = nullptr;
  decltype(&::cuMemSetAccess) memSetAccess = nullptr;
  decltype(&::cuMemExportToShareableHandle) memExportToShareableHandle = nullptr;
  decltype(&::cuMemImportFromShareableHandle) memImportFromShareableHandle = nullptr;

  // "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (out of memory)".
  std::string text(const char* call, CUresult r) const;
};

// The entry points, looked up once per process. Returns nullptr when one is missing (a driver
// older than the calls) and sets *why to the name that was not found.
const CuDriver* cuDriver(std::string* why);

}  // namespace anyr
