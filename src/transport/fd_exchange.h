// File descriptors passed between the ranks' processes of one host (the virtual-memory
// transport's exported allocations, vmm_peer_memory.cc).
//
// Each rank listens on a Unix-domain socket: an abstract name (Linux; reachable from every
// process of the same network namespace) or, with ANYR_IPC_SOCKET_DIR, a path in that
// directory (for processes that share a directory but not a network namespace). Names and a
// fresh random secret per receiver travel through the bootstrap, which is authenticated by the
// unique id; every sender then connects to every peer and sends its descriptor with SCM_RIGHTS
// and the receiver's secret, and a receiver keeps only descriptors that carry its secret from
// a rank it expects. No process id is involved: this works between processes in different PID
// namespaces (containers that do not share one), where legacy CUDA IPC is reported to fail.
//
// Every wait is bounded by the deadline; a descriptor that did not arrive is reported per rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bootstrap/socket.h"
#include "transport/device_handles.h"

namespace anyr {

class Bootstrap;

struct FdExchange {
  // fds[r]: rank r's descriptor as received here (close-on-exec); invalid for this rank and
  // where errors[r] says why it did not arrive.
  std::vector<Socket> fds;
  std::vector<std::string> errors;
};

// Collective over `bs`. `fd` is this rank's descriptor to give every peer (not consumed), or
// -1 with `whyNoFd` saying why this rank has none. Local failures (socket, bind, connect, a
// descriptor that did not arrive) are not thrown: they land in errors[], and every rank learns
// through the bootstrap which sends failed, so no rank waits for a descriptor that cannot come.
// Throws only what the bootstrap throws (a peer gone, its deadline).
FdExchange exchangeFds(Bootstrap& bs, int fd, const std::string& whyNoFd, int timeoutMs);

// The directory of path sockets (ANYR_IPC_SOCKET_DIR), "" for abstract names. Throws
// anyrInvalidArgument naming the variable when the resulting path would not fit a socket
// address.
std::string fdSocketDir();

// The exchange's records and its sending step, exposed for tests that play a misbehaving peer.
namespace fdwire {

constexpr uint32_t kMagic = 0x41524644u;  // "ARFD"
constexpr int kTokenBytes = 16;
constexpr size_t kNameBytes = 104;  // fits sockaddr_un's path (108) with its terminator

// What every rank publishes through the bootstrap. Crosses process boundaries: fixed layout.
struct Listing {
  int32_t listening;  // 0: not listening; 1: at the abstract name `name`; 2: at the path `name`
  int32_t hasFd;      // 1: this rank sends a descriptor
  uint8_t token[kTokenBytes];  // senders must present it to this rank
  char name[kNameBytes];       // abstract (its leading NUL left out) or a file path
  char error[128];             // why not listening, or why no descriptor
};
static_assert(sizeof(Listing) == 256, "Listing layout");

// The message carrying a descriptor (as SCM_RIGHTS ancillary data of its first byte).
struct FdMessage {
  uint32_t magic;
  int32_t sender;
  uint8_t token[kTokenBytes];
};
static_assert(sizeof(FdMessage) == 24, "FdMessage layout");

// After the sends: which peers this rank reached, and why not (gathered, in rank order).
struct SendRow {
  uint8_t sent[kMaxLocalRanks];
  char error[kMaxLocalRanks][120];
};
static_assert(sizeof(SendRow) == kMaxLocalRanks * 121, "SendRow layout");

// Connects to the socket `name` (abstract or a path) and sends `msg` with `fd` attached;
// "" on success, else why not. Bounded by the deadline.
std::string sendFd(const std::string& name, bool abstract, int fd, const FdMessage& msg,
                   const Deadline& deadline);

}  // namespace fdwire

}  // namespace anyr
