// Startup self-test (collective, run at communicator init after admission): every admitted
// peer and host-memory algorithm, and the fused kernels built on the peer algorithms (the host
// path's fused op composes its all-reduce with the standalone epilogue), all-reduce a
// checksum pattern at sizes
// that exercise each kernel; every rank checks its output exactly on the device, with the
// communicator's bounded waits (a shorter self-test deadline); the ranks vote, and a path that
// failed on any rank is disabled on every rank with the reason "self-test failed on rank R: ...".
//
// ANYR_SELFTEST=0 (rank 0's value decides) skips it. ANYR_FAULT_INJECT (tests only) corrupts
// this rank's view of a peer's workspace first, so tests can prove the self-test catches it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace anyr {

class Communicator;
struct SelfCheckResult;

// Upper bound of one self-test wait (ms): min(this, the configured timeout).
// Generous next to the microseconds a healthy run takes, so that ranks time-sliced on one GPU
// or a slow first launch (lazy module loading) do not fail it; paid only when a path fails.
constexpr int kSelfTestTimeoutMs = 5000;

// Parsed ANYR_FAULT_INJECT: "corrupt-peer:R" -> kind CorruptPeer, rank R; "ipc-open:R" ->
// kind IpcOpenFails (rank R's cudaIpcOpenMemHandle calls fail; read by the transport's setup);
// "vmm-granularity:R" -> kind VmmGranularity (rank R reports a coarser vmm allocation
// granularity than its peers; read by the transport's setup); "host-copy-selftest:R" -> kind
// HostCopySelfTest (rank R's self-test input for host-copy is wrong, so host-copy fails the
// self-test on every rank and the protocol state is reset after the host one-shot ran);
// "fabric-fail:R" -> kind FabricFails (rank R fails the fabric measurement silently before the
// fabric under load, so its peers' device waits for it run out; core/fabric.cc);
// "fabric-slow-writes:R" -> kind FabricSlowWrites (rank R's measured peer write bandwidths are
// divided by 50 before the ranks combine them).
// Throws anyrInvalidArgument naming the variable for any other text. "" -> kind None.
struct FaultInjection {
  enum Kind {
    None,
    CorruptPeer,
    IpcOpenFails,
    VmmGranularity,
    HostCopySelfTest,
    FabricFails,
    FabricSlowWrites
  } kind = None;
  int rank = -1;
};
FaultInjection parseFaultInjection(const std::string& text);

// Runs the self-test on `c` (collective) and updates its admission and fused-kernel switches.
class SelfTest {
 public:
  explicit SelfTest(Communicator& c) : c_(c) {}
  void run();

 private:
  struct Outcome;
  struct Run {
    std::string desc;
    uint64_t count;
  };
  void injectFaults();
  // The device result slots, reset (stream-ordered) for the next runs.
  SelfCheckResult* clearResults();
  Outcome runAlgo(int algo);
  Outcome runFused(int algo);
  Outcome finish(const std::vector<Run>& runs, int launchFailures, const std::string& launchWhy);
  std::string vote(const Outcome& mine, bool* anyFailed);
  void resetProtocolState();
  void setWaitTimeoutMs(int ms);

  Communicator& c_;
  FaultInjection fault_;  // ANYR_FAULT_INJECT, parsed by injectFaults
  void* in_ = nullptr;
  void* out_ = nullptr;
  void* weight_ = nullptr;
  void* norm_ = nullptr;
  void* results_ = nullptr;  // SelfCheckResult[kMaxRuns]
  uint64_t maxBytes_ = 0;
};

}  // namespace anyr
