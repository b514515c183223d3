// Argument rules shared by the public calls (docs/RELIABILITY.md, "Input validation"). The
// rules are pure functions of plain facts (what CUDA said about a pointer or a stream), so CPU
// tests check every rule and message without a GPU; thin wrappers ask CUDA for the facts.
// Every failure throws anyr::Error(anyrInvalidArgument, "argument 'NAME': RULE").
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "anyreduce/anyreduce.h"

namespace anyr {

// ---- pure rules ---------------------------------------------------------------------------

enum class MemKind { kUnregistered, kHost, kDevice, kManaged };

struct PointerFacts {
  bool queried = true;     // false: CUDA could not tell what the pointer is
  std::string queryError;  // CUDA's text when !queried
  MemKind kind = MemKind::kUnregistered;
  int device = -1;  // owning device of kDevice memory
};

// `p` (non-NULL) must be device memory of `device`, or managed memory. `role` names the device
// in the message ("the communicator's device", "the stream's device").
void checkPointerFacts(const PointerFacts& f, const char* name, int device,
                       const char* role = "the communicator's device");

// A stream that belongs to `streamDevice` must belong to `device`.
void checkStreamDevice(int streamDevice, int device);

// `p` must be aligned to `bytes` (the element size). NULL passes (checked elsewhere).
void checkAligned(const void* p, size_t bytes, const char* name);

// count * elementSize must fit in size_t (and in the address space past `p`).
void checkCountFits(size_t count, size_t elementSize, const char* name);

// A versioned struct the caller fills (anyrConfig_t, anyrFusedOptions_t), argument `name`: its
// magic must be `wantMagic` (else it was not initialized with `initializer`) and its size this
// library's `wantSize` (else header and library differ).
void checkVersionedStruct(const char* name, unsigned magic, unsigned wantMagic, size_t size,
                          size_t wantSize, const char* initializer);

// datatype and op must be supported by anyrAllReduce.
void checkDatatype(int datatype);
void checkOp(int op);

// ---- CUDA facts ---------------------------------------------------------------------------

PointerFacts pointerFacts(const void* p);

// What a failed question about the caller's stream says: anyrInvalidArgument where CUDA refused
// the handle itself (not a stream, one of a destroyed context, the legacy stream where a capture
// forbids it), thrown as "argument 'stream': not a valid stream (...)"; anyrCudaError for
// everything else (no driver, no device, a sticky error from earlier work), thrown as "querying
// the stream: ...", since the stream may be perfectly good.
anyrResult_t streamQueryResult(cudaError_t e);

// The device of `stream`; throws as streamQueryResult says. Only outside capture (CUDA does not
// answer for a capturing stream).
int streamDevice(cudaStream_t stream);

// True while `stream` is being captured into a CUDA graph; throws as streamQueryResult says.
bool streamCapturing(cudaStream_t stream);

// NULL passes; otherwise checkPointerFacts(pointerFacts(p), name, device).
void requireDevicePointer(const void* p, const char* name, int device,
                          const char* role = "the communicator's device");

// Makes `device` the calling thread's current device for the scope of one call, and restores
// the previous one after (kernels launch on the current device; a caller whose current device
// differs from the communicator's would otherwise get a launch error or the wrong GPU).
// Costs one cudaGetDevice when the device is already current.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace anyr
