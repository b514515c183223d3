#include "base/validate.h"

#include <cstdio>

#include "base/error.h"

namespace anyr {

namespace {

std::string hexAddress(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%p", p);
  return buf;
}

}  // namespace

void checkPointerFacts(const PointerFacts& f, const char* name, int device, const char* role) {
  if (!f.queried) {
    throwError(anyrInvalidArgument,
               std::string("argument '") + name + "': not a CUDA pointer (" + f.queryError + ")");
  }
  switch (f.kind) {
    case MemKind::kManaged:
      return;
    case MemKind::kDevice:
      ANYR_REQUIRE_ARG(f.device == device, name,
                       "is memory of device " + std::to_string(f.device) + ", " + role + " is " +
                           std::to_string(device));
      return;
    case MemKind::kHost:
      ANYR_REQUIRE_ARG(false, name,
                       "must point to device memory (got pinned host memory; peers cannot map it)");
      return;
    case MemKind::kUnregistered:
      ANYR_REQUIRE_ARG(false, name,
                       "must point to device memory (got host or unregistered memory)");
      return;
  }
}

void checkStreamDevice(int streamDev, int device) {
  ANYR_REQUIRE_ARG(streamDev == device, "stream",
                   "belongs to device " + std::to_string(streamDev) +
                       ", the communicator's device is " + std::to_string(device));
}

void checkAligned(const void* p, size_t bytes, const char* name) {
  if (p == nullptr || bytes == 0) return;
  ANYR_REQUIRE_ARG(reinterpret_cast<uintptr_t>(p) % bytes == 0, name,
                   "address " + hexAddress(p) + " is not aligned to " + std::to_string(bytes) +
                       " bytes (the element size)");
}

void checkCountFits(size_t count, size_t elementSize, const char* name) {
  if (elementSize == 0) return;
  ANYR_REQUIRE_ARG(count <= SIZE_MAX / elementSize, name,
                   std::to_string(count) + " elements of " + std::to_string(elementSize) +
                       " bytes overflow the address space");
}

void checkDatatype(int datatype) {
  ANYR_REQUIRE_ARG(datatype >= 0 && datatype < anyrNumTypes, "datatype",
                   "unsupported datatype " + std::to_string(datatype) +
                       " (anyrFloat32, anyrFloat16, anyrBfloat16)");
}

void checkVersionedStruct(const char* name, unsigned magic, unsigned wantMagic, size_t size,
                          size_t wantSize, const char* initializer) {
  ANYR_REQUIRE_ARG(magic == wantMagic, name,
                   std::string("not initialized with ") + initializer + " (bad magic)");
  ANYR_REQUIRE_ARG(size == wantSize, name,
                   "size field is " + std::to_string(size) + ", this library expects " +
                       std::to_string(wantSize) + " (header/library mismatch)");
}

void checkOp(int op) {
  ANYR_REQUIRE_ARG(op == anyrSum, "op",
                   "unsupported reduction " + std::to_string(op) + " (only anyrSum)");
}

PointerFacts pointerFacts(const void* p) {
  PointerFacts f;
  cudaPointerAttributes attr{};
  cudaError_t e = cudaPointerGetAttributes(&attr, p);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    f.queried = false;
    f.queryError = cudaGetErrorString(e);
    return f;
  }
  switch (attr.type) {
    case cudaMemoryTypeDevice:
      f.kind = MemKind::kDevice;
      break;
    case cudaMemoryTypeManaged:
      f.kind = MemKind::kManaged;
      break;
    case cudaMemoryTypeHost:
      f.kind = MemKind::kHost;
      break;
    default:
      f.kind = MemKind::kUnregistered;
      break;
  }
  f.device = attr.device;
  return f;
}

anyrResult_t streamQueryResult(cudaError_t e) {
  switch (e) {
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidValue:
    case cudaErrorContextIsDestroyed:
    case cudaErrorStreamCaptureImplicit:
      return anyrInvalidArgument;
    default:
      return anyrCudaError;
  }
}

namespace {
// Clears CUDA's last error (a sticky one stays) and says what the failure was about.
[[noreturn]] void streamQueryFailed(cudaError_t e) {
  (void)cudaGetLastError();
  if (streamQueryResult(e) == anyrInvalidArgument) {
    throwError(anyrInvalidArgument, std::string("argument 'stream': not a valid stream (") +
                                        cudaGetErrorString(e) + ")");
  }
  throwError(anyrCudaError, std::string("querying the stream: ") + cudaGetErrorString(e));
}
}  // namespace

int streamDevice(cudaStream_t stream) {
  int dev = -1;
  const cudaError_t e = cudaStreamGetDevice(stream, &dev);
  if (e != cudaSuccess) streamQueryFailed(e);
  return dev;
}

bool streamCapturing(cudaStream_t stream) {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  const cudaError_t e = cudaStreamIsCapturing(stream, &cs);
  if (e != cudaSuccess) streamQueryFailed(e);
  return cs != cudaStreamCaptureStatusNone;
}

void requireDevicePointer(const void* p, const char* name, int device, const char* role) {
  if (p == nullptr) return;
  checkPointerFacts(pointerFacts(p), name, device, role);
}

DeviceScope::DeviceScope(int device) {
  int current = -1;
  ANYR_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device) {
    ANYR_CUDA_CHECK(cudaSetDevice(device));
    previous_ = current;
  }
}

DeviceScope::~DeviceScope() {
  if (previous_ >= 0 && cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace anyr
