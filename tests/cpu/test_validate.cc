// The argument rules of src/base/validate.h, on synthetic facts: every rule refuses with
// anyrInvalidArgument and a message naming the argument and the rule, and accepts what it
// should. (The CUDA-facing wrappers are exercised by tests/gpu/test_reliability_calls.cc.)
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>

#include "base/error.h"
#include "base/validate.h"

namespace anyr {
namespace {

// Expects `f` to throw anyrInvalidArgument with exactly `message`.
void expectRefused(const std::function<void()>& f, const std::string& message) {
  try {
    f();
    ADD_FAILURE() << "accepted; expected: " << message;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), anyrInvalidArgument) << e.what();
    EXPECT_EQ(std::string(e.what()), message);
  }
}

PointerFacts facts(MemKind kind, int device) {
  PointerFacts f;
  f.kind = kind;
  f.device = device;
  return f;
}

TEST(Validate, PointerMustBeDeviceMemoryOfTheCommunicatorsDevice) {
  EXPECT_NO_THROW(checkPointerFacts(facts(MemKind::kDevice, 1), "sendbuff", 1));
  EXPECT_NO_THROW(checkPointerFacts(facts(MemKind::kManaged, -2), "sendbuff", 1));
  expectRefused([] { checkPointerFacts(facts(MemKind::kDevice, 0), "recvbuff", 1); },
                "argument 'recvbuff': is memory of device 0, the communicator's device is 1");
  expectRefused(
      [] { checkPointerFacts(facts(MemKind::kDevice, 3), "x", 2, "the stream's device"); },
      "argument 'x': is memory of device 3, the stream's device is 2");
  expectRefused([] { checkPointerFacts(facts(MemKind::kHost, 0), "weight", 0); },
                "argument 'weight': must point to device memory (got pinned host memory; peers "
                "cannot map it)");
  expectRefused([] { checkPointerFacts(facts(MemKind::kUnregistered, -1), "sendbuff", 0); },
                "argument 'sendbuff': must point to device memory (got host or unregistered "
                "memory)");
  PointerFacts unknown;
  unknown.queried = false;
  unknown.queryError = "invalid argument";
  expectRefused([&] { checkPointerFacts(unknown, "partial", 0); },
                "argument 'partial': not a CUDA pointer (invalid argument)");
}

TEST(Validate, StreamMustBelongToTheCommunicatorsDevice) {
  EXPECT_NO_THROW(checkStreamDevice(1, 1));
  expectRefused([] { checkStreamDevice(0, 1); },
                "argument 'stream': belongs to device 0, the communicator's device is 1");
}

// Only CUDA refusing the stream handle itself makes the stream a bad argument; a GPU or driver
// that cannot answer is a CUDA error (the default stream is always a valid argument).
TEST(Validate, StreamQueryFailuresNameTheStreamOnlyWhenItIsTheCause) {
  for (cudaError_t e : {cudaErrorInvalidResourceHandle, cudaErrorInvalidValue,
                        cudaErrorContextIsDestroyed, cudaErrorStreamCaptureImplicit}) {
    EXPECT_EQ(streamQueryResult(e), anyrInvalidArgument) << cudaGetErrorName(e);
  }
  for (cudaError_t e : {cudaErrorInsufficientDriver, cudaErrorNoDevice, cudaErrorIllegalAddress,
                        cudaErrorLaunchFailure, cudaErrorDevicesUnavailable}) {
    EXPECT_EQ(streamQueryResult(e), anyrCudaError) << cudaGetErrorName(e);
  }
}

// Without a usable GPU (as on the CPU test machines) a question about the default stream is a
// CUDA error, not a bad 'stream' argument.
TEST(Validate, DefaultStreamWithoutAGpuIsACudaError) {
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) {
    GTEST_SKIP() << "a GPU is present: the default stream answers";
  }
  try {
    (void)streamCapturing(nullptr);
    ADD_FAILURE() << "the default stream answered without a GPU";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), anyrCudaError) << e.what();
    EXPECT_EQ(std::string(e.what()).find("argument 'stream'"), std::string::npos) << e.what();
  }
}

TEST(Validate, Alignment) {
  alignas(16) static char buf[64];
  EXPECT_NO_THROW(checkAligned(buf, 4, "sendbuff"));
  EXPECT_NO_THROW(checkAligned(buf + 2, 2, "sendbuff"));
  EXPECT_NO_THROW(checkAligned(nullptr, 4, "sendbuff"));
  try {
    checkAligned(buf + 2, 4, "recvbuff");
    ADD_FAILURE() << "misaligned pointer accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), anyrInvalidArgument);
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("argument 'recvbuff': address 0x", 0), 0u) << m;
    EXPECT_NE(m.find("is not aligned to 4 bytes (the element size)"), std::string::npos) << m;
  }
}

TEST(Validate, CountMustNotOverflow) {
  EXPECT_NO_THROW(checkCountFits(SIZE_MAX / 4, 4, "count"));
  EXPECT_NO_THROW(checkCountFits(0, 2, "count"));
  expectRefused([] { checkCountFits(SIZE_MAX / 4 + 1, 4, "count"); },
                "argument 'count': " + std::to_string(SIZE_MAX / 4 + 1) +
                    " elements of 4 bytes overflow the address space");
}

TEST(Validate, DatatypeAndOp) {
  for (int t : {anyrFloat32, anyrFloat16, anyrBfloat16}) EXPECT_NO_THROW(checkDatatype(t));
  expectRefused([] { checkDatatype(anyrNumTypes); },
                "argument 'datatype': unsupported datatype 3 (anyrFloat32, anyrFloat16, "
                "anyrBfloat16)");
  expectRefused([] { checkDatatype(-1); },
                "argument 'datatype': unsupported datatype -1 (anyrFloat32, anyrFloat16, "
                "anyrBfloat16)");
  EXPECT_NO_THROW(checkOp(anyrSum));
  expectRefused([] { checkOp(1); }, "argument 'op': unsupported reduction 1 (only anyrSum)");
}

}  // namespace
}  // namespace anyr
