#include "base/env.h"

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>

#include "base/config.h"
#include "base/error.h"

namespace anyr {
namespace env {

const std::vector<Param>& params() {
  // The algorithms' names as the registry has them (through anyrAlgoName).
  static const std::string algoMeaning = "force an algorithm: " + algoNames();
  static const std::vector<Param> table = {
      {"ANYR_DEBUG", "WARN",
       "log level: NONE, WARN, INFO or TRACE (any other value fails communicator creation)"},
      {"ANYR_ALGO", "auto", algoMeaning.c_str()},
      {"ANYR_TIMEOUT_MS", "30000",
       "bound on every wait, host and device, in milliseconds (bootstrap, flags, data)"},
      {"ANYR_ONESHOT_MAX_BYTES", "",
       "largest message for one-shot algorithms (unset or 0: the default, 1 MiB for 2 ranks, else "
       "512 KiB / (ranks - 1), at least 64 KiB; at most 64 MiB); a nonzero value here or in "
       "ANYR_TWOSHOT_MAX_BYTES replaces the seed cost model by fixed thresholds"},
      {"ANYR_TWOSHOT_MAX_BYTES", "",
       "largest message the automatic choice gives two-shot before NCCL (unset or 0: the "
       "default, 32 MiB); a nonzero value here or in ANYR_ONESHOT_MAX_BYTES replaces the seed "
       "cost model by fixed thresholds"},
      {"ANYR_CHUNK_BYTES", "8M",
       "staging buffer per rank for one-shot pull and two-shot; larger messages are chunked"},
      {"ANYR_USE_NCCL", "1", "1: create an NCCL communicator for large messages and fallback"},
      {"ANYR_MAX_BLOCKS", "0", "cap on thread blocks per kernel (0: automatic)"},
      {"ANYR_SOCKET_ADDR", "", "address rank 0 listens on for the rendezvous (default 127.0.0.1)"},
      {"ANYR_SOCKET_IFNAME", "",
       "network interface whose IPv4 address rank 0 listens on (ignored if ANYR_SOCKET_ADDR)"},
      {"ANYR_SOCKET_PORT", "0", "port rank 0 listens on, 0..65535 (0: any free port)"},
      {"ANYR_BOOTSTRAP_HELLO_MS", "1000",
       "rank 0 closes a bootstrap connection that has not completed its handshake (HELLO, then "
       "PROOF of the unique id's secret) within this many ms of connecting, 1..600000 (at most "
       "the timeout), so that connections that never authenticate cannot stall the rendezvous"},
      {"ANYR_HOST_ID", "",
       "the host identity ranks compare to know they share a host (unset: the host name and the "
       "kernel's boot id); set the same value in containers of one host whose host names "
       "differ, so that they use the peer and host-memory transports"},
      {"ANYR_PDL", "1",
       "1: launch the communicator's kernels (every peer and host algorithm, the fused kernels, "
       "the add + RMSNorm epilogue) with programmatic dependent launch where the communicator's "
       "probe launch works, and anyrAddRmsNorm's where the same probe, run once per process and "
       "device, works; 0: plain launches, no probe (timing only, ranks may differ)"},
      {"ANYR_EPILOGUE_HINTS", "auto",
       "cache eviction hints on the standalone add + RMSNorm kernel's loads (anyrAddRmsNorm and "
       "the epilogue after an all-reduce; unquantized output, 16-byte aligned buffers): auto = "
       "where the bytes a launch moves are 5/6 to 3/2 of the GPU's L2 cache, off (0) = never, on "
       "(1) = always; x and the residual evict-first, the weight evict-last (timing only, ranks "
       "may differ)"},
      {"ANYR_PDL_EARLY", "1",
       "with programmatic launch on: 1 = each peer, host and fused kernel lets the next launch "
       "on the stream be scheduled once all of its blocks started (it still waits for the kernel "
       "to complete), except the fused two-shot's dense shape, and anyrAddRmsNorm's kernel where "
       "its grid holds at most one block per SM; 0 = only once its blocks exited (timing only, "
       "ranks may differ)"},
      {"ANYR_PUSH_FENCE", "0",
       "diagnostic: 1 = every thread of the push kernels (one-shot push, two-shot push and their "
       "fused kernels) issues a system-scope fence (__threadfence_system) once it pushed its own "
       "data to the peers (two-shot: the reduce-scatter's pushes), before it clears and polls; "
       "0 = no fence (the protocol needs none; each rank's own value; timing only)"},
      {"ANYR_SELFTEST", "1",
       "1: at init, run every admitted peer algorithm once on a checksum pattern and disable any "
       "that fails on any rank (rank 0's value decides); 0: skip"},
      {"ANYR_TEST_PUSH_EPOCH", "",
       "tests only: the push algorithms' next launch count at creation (0..3221225471; rank 0's "
       "value), so that a test runs calls across the count's wrap"},
      {"ANYR_TEST_RING_USE", "",
       "tests only: the ring's chunk counts and flags at creation (0..4294967295; rank 0's "
       "value), so that a test runs calls across the counts' wrap"},
      {"ANYR_TEST_SYNC_EPOCH", "",
       "tests only: the flag algorithms' launch epoch at creation (rank 0's value), as if that "
       "many launches had passed since their flags were last raised"},
      {"ANYR_TEST_HOST_LL_COUNT", "",
       "tests only: the host one-shot low-latency protocol's launch count at creation "
       "(0..4294967295; rank 0's value), every line of its buffers tagged with it, so that a "
       "test runs calls across the count's wrap and the buffers' sweeps"},
      {"ANYR_FAULT_INJECT", "",
       "tests only: corrupt-peer:R makes rank R's mapping of the next rank's workspace point at "
       "its own, so the self-test must catch it; ipc-open:R makes every cudaIpcOpenMemHandle of "
       "rank R fail, as where legacy CUDA IPC does not work; vmm-granularity:R makes rank R "
       "report a coarser vmm allocation granularity than its peers, as a GPU of another model; "
       "host-copy-selftest:R gives host-copy a wrong self-test input on rank R, so it fails the "
       "self-test after the host one-shot ran and the protocol state is reset; fabric-fail:R "
       "makes rank R fail the fabric measurement at init silently before its fabric under load "
       "(its peers' waits for it run out), so every rank falls back to unmeasured figures; "
       "fabric-slow-writes:R divides rank R's measured peer write bandwidths by 50"},
      {"ANYR_VALIDATE_CALLS", "0",
       "1: every anyrAllReduce, anyrAllReduceAddRmsNorm and anyrCommSetAlgorithm call first "
       "compares its signature (call number, kind, count or tokens/hidden/quantization, dtype, op "
       "or algorithm) across ranks through the bootstrap and fails on a mismatch instead of "
       "hanging (costs one bootstrap round trip per call; on when any rank sets it)"},
      {"ANYR_FABRIC", "measure",
       "the fabric measurement at init, on communicators with a peer workspace: measure (the "
       "record cached with the tuning table in ANYR_TUNING_FILE where its fingerprint matches, "
       "else measured: per ordered pair write and read bandwidth and flag latency, ranks taking "
       "turns, then every rank at once writing to every peer, to its ring neighbour, and one "
       "synchronisation round; `anyreduce tune` refreshes the record), cached (the cached "
       "record only, never measure), off or 0 (neither: nominal link figures and the seed "
       "decide); 1 means measure; rank 0's value is used"},
      {"ANYR_TEST_FABRIC_APPLY", "",
       "tests only: 1 = apply the fabric figures measured at init even where ranks share a GPU "
       "(there they are the GPU's own memory, not a fabric's, and are otherwise only shown; "
       "rank 0's value)"},
      {"ANYR_TUNING_FILE", "",
       "tuning table (JSON, `anyreduce tune`) loaded at init when its fingerprint matches; it "
       "also caches the fabric's measured figures (ANYR_FABRIC)"},
      {"ANYR_TUNE_BUDGET_MS", "0",
       "> 0: without a matching table, tune at init within this many ms (saved to "
       "ANYR_TUNING_FILE if set)"},
      {"ANYR_WIRE", "native",
       "wire format of the host-memory algorithms and one-shot pull: native (exact), fp8 or "
       "int8 (per-block scaled, approximate; docs/WIRE.md)"},
      {"ANYR_PEER_MEMORY", "auto",
       "how the ranks of one host map each other's workspace: auto (cuda-ipc, else vmm where "
       "that maps more pairs), cuda-ipc (legacy CUDA IPC), vmm (cuMemCreate allocations whose "
       "POSIX file descriptors pass over a Unix-domain socket: no shared PID namespace needed), "
       "none (no peer-mapped workspace, as on GPUs without peer access: the host transport and "
       "NCCL remain); 0 and 1 mean none and auto; rank 0's value is used"},
      {"ANYR_IPC_SOCKET", "path",
       "vmm peer memory, the Unix-domain sockets that pass the file descriptors: path (socket "
       "files in an owner-only directory, ANYR_IPC_SOCKET_DIR) or abstract (abstract names, "
       "reachable within one network namespace, for processes that share no directory); "
       "either way only connections of the same user are served"},
      {"ANYR_IPC_SOCKET_DIR", "",
       "vmm peer memory, path sockets: a directory every rank's process can reach (unset: "
       "/tmp); the sockets live in its subdirectory anyreduce-<uid>, created 0700 and refused "
       "if another user owns it; stale sockets of killed processes are removed there"},
      {"ANYR_HOST_ROUND", "2",
       "host one-shot: most 16-byte vectors per thread in one pipelined round (1..64; rank "
       "0's value is used)"},
      {"ANYR_HOST_LL_BYTES", "65536",
       "host one-shot: messages of at most this many bytes (native wire) use the low-latency "
       "protocol, flag in every line (0 = never; a multiple of 16 up to 1048576; rank 0's "
       "value is used)"},
      {"ANYR_HOST_LL_EAGER_BYTES", "65536",
       "host one-shot, low-latency protocol: launches of at most this many bytes poll every "
       "line from every thread (one PCIe round trip after the data landed); larger ones poll "
       "one line a warp first, then read the rest (0 = never; a multiple of 16 up to 1048576; "
       "rank 0's value is used)"},
      {"ANYR_HOST_MEMORY", "1",
       "1: set up the shared host-memory transport (host-oneshot, host-twoshot, host-copy); 0: "
       "do not"},
      {"ANYR_HOST_NUMA", "1",
       "host-memory transport: 1: each rank's region of the shared segment prefers the NUMA "
       "node of that rank's GPU (where the host has several nodes and the node is known; "
       "anyreduce explain shows the placement); 0: the pages come from rank 0's own policy "
       "(rank 0's value is used)"},
      {"ANYR_HOST_COPY_CHUNK_BYTES", "2M",
       "host-copy: bytes per copy-engine chunk, the unit of its pipeline (a multiple of 64 KiB "
       "in 64 KiB..64 MiB; raised if a launch would need more than 1024 chunks; rank 0's value "
       "is used)"},
      {"ANYR_FUSED_CLUSTER", "0",
       "thread-block cluster size of the fused all-reduce + RMSNorm kernels (each row "
       "spread over one cluster's blocks, which exchange its partial sums of squares through "
       "distributed shared memory): 0 = automatic, 1 = off, 2, 4 or 8 (where the probe admits "
       "clusters)"},
      {"ANYR_ISLANDS", "auto",
       "islands of the two-level all-reduce (\"islands\": gather inside each island, exchange "
       "pairwise across islands, all-gather inside): auto = from the topology (GPUs under one "
       "PCIe switch, else one socket); or islands separated by ',', each a rank, a range a-b, "
       "or several joined by '+' (0-3,4-7; 0+2+4+6,1+3+5+7; 0-2,3-5,6-7), every rank of the "
       "communicator in exactly one (else creation fails); rank 0's value is used"},
      {"ANYR_HOST_LAUNCH_BYTES", "16M",
       "host algorithms: most bytes one launch carries (larger messages are several launches; "
       "sizes the host segment and host-copy's device staging; a multiple of 4096 in 64 KiB..1 "
       "GiB; rank 0's value is used); independent of ANYR_CHUNK_BYTES"},
  };
  return table;
}

static const Param* find(const char* name) {
  for (const Param& p : params()) {
    if (std::string(p.name) == name) return &p;
  }
  throwError(anyrInternalError, std::string("environment variable ") + name +
                                    " is read but not declared in the registry");
}

bool isSet(const char* name) {
  find(name);
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

std::string getString(const char* name) {
  const Param* p = find(name);
  const char* v = std::getenv(name);
  if (v != nullptr && *v != '\0') return v;
  return p->defaultValue;
}

int64_t getInt(const char* name) {
  std::string v = getString(name);
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || errno != 0 || end == v.c_str() || *end != '\0') {
    throwError(anyrInvalidArgument,
               std::string("environment variable ") + name + "='" + v + "': must be an integer");
  }
  return x;
}

int32_t getInt32(const char* name) {
  const int64_t x = getInt(name);
  if (x < INT32_MIN || x > INT32_MAX) {
    throwError(anyrInvalidArgument, std::string("environment variable ") + name + "=" +
                                        std::to_string(x) + ": out of range of a 32-bit integer");
  }
  return static_cast<int32_t>(x);
}

bool parseSize(const std::string& text, uint64_t* out) {
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) return false;
  errno = 0;
  char* end = nullptr;
  unsigned long long x = std::strtoull(text.c_str(), &end, 10);
  if (errno != 0) return false;
  std::string suffix(end);
  uint64_t mult = 1;
  if (suffix == "" || suffix == "B") {
    mult = 1;
  } else if (suffix == "K" || suffix == "k" || suffix == "KB" || suffix == "KiB") {
    mult = 1ull << 10;
  } else if (suffix == "M" || suffix == "MB" || suffix == "MiB") {
    mult = 1ull << 20;
  } else if (suffix == "G" || suffix == "GB" || suffix == "GiB") {
    mult = 1ull << 30;
  } else {
    return false;
  }
  if (x > UINT64_MAX / mult) return false;
  *out = x * mult;
  return true;
}

uint64_t getSize(const char* name) {
  std::string v = getString(name);
  uint64_t x = 0;
  if (!parseSize(v, &x)) {
    throwError(anyrInvalidArgument, std::string("environment variable ") + name + "='" + v +
                                        "': must be a size such as 4096, 64K, 8M or 1G");
  }
  return x;
}

}  // namespace env
}  // namespace anyr
