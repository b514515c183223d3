// File descriptors passed between the ranks' processes of one host (the virtual-memory
// transport's exported allocations, vmm_peer_memory.cc).
//
// Each rank listens on a Unix-domain socket. By default it is a path socket in
// <base>/anyreduce-<uid>/ (base: ANYR_IPC_SOCKET_DIR, else /tmp), a directory that only this
// user can enter: created 0700, refused unless it is a real directory owned by this effective
// uid, the socket file itself 0600. ANYR_IPC_SOCKET=abstract selects an abstract name instead
// (Linux; reachable from every process of the same network namespace, for processes that share
// a network namespace but no directory). Names and a fresh random secret per receiver travel
// through the bootstrap, which is authenticated by the unique id; every sender then connects to
// every peer and sends its descriptor with SCM_RIGHTS and the receiver's secret.
//
// The receiver serves its socket from a thread, from the first gather until the end, every
// connection at once (poll): a connection whose peer credentials (SO_PEERCRED) do not show this
// process's effective uid is closed unread; one that does not deliver its message within
// fdwire::kConnectionDeadlineMs is closed; at most fdwire::kMaxConnections are held, the oldest
// dropped first. So a stranger that connects and stays silent delays nobody. A message is kept
// only if it carries the receiver's secret (compared in constant time) from a rank it expects,
// and, where sender and receiver share a PID namespace, only if the connecting process is the
// pid that rank published. Elsewhere no process id is involved: this works between processes in
// different PID namespaces (containers that do not share one), where legacy CUDA IPC is reported
// to fail.
//
// A path socket is removed when the exchange ends; one left behind by a killed process is
// removed by the next exchange that uses the directory (fdwire::removeStaleSockets).
//
// Every wait is bounded by the deadline; a descriptor that did not arrive is reported per rank.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bootstrap/socket.h"
#include "device/handles.h"

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

// The directory of path sockets: <ANYR_IPC_SOCKET_DIR, else /tmp>/anyreduce-<euid> (not
// created here); "" when ANYR_IPC_SOCKET=abstract. Throws anyrInvalidArgument naming the
// variable when ANYR_IPC_SOCKET is neither path nor abstract, or when the resulting socket path
// would not fit a socket address.
std::string fdSocketDir();

// The exchange's records, its sending step and its checks, exposed for tests that play a
// misbehaving peer or a stranger.
namespace fdwire {

constexpr uint32_t kMagic = 0x41524644u;  // "ARFD"
constexpr int kTokenBytes = 16;
constexpr size_t kNameBytes = 104;  // fits sockaddr_un's path (108) with its terminator

// A connection must deliver its whole message within this long after it was accepted; a real
// sender writes it right after connecting. Shorter than any sensible communicator timeout.
constexpr int kConnectionDeadlineMs = 1000;
// Connections a receiver holds open at once; past it the oldest is dropped.
constexpr size_t kMaxConnections = 64;
// A socket file in the directory is judged by a connection attempt only once it is this old
// (a live process binds and then listens: in between, a connection is refused).
constexpr int kStaleProbeAgeSeconds = 60;

// What every rank publishes through the bootstrap. Crosses process boundaries: fixed layout.
struct Listing {
  int32_t listening;  // 0: not listening; 1: at the abstract name `name`; 2: at the path `name`
  int32_t hasFd;      // 1: this rank sends a descriptor
  uint8_t token[kTokenBytes];  // senders must present it to this rank
  char name[kNameBytes];       // abstract (its leading NUL left out) or a file path
  int32_t pid;                 // getpid() of the publisher; 0: not known
  uint32_t uid;                // geteuid() of the publisher
  uint64_t pidNs;              // inode of its /proc/self/ns/pid; 0: not known
  uint64_t userNs;             // inode of its /proc/self/ns/user; 0: not known
  char error[128];             // why not listening, or why no descriptor
};
static_assert(sizeof(Listing) == 280, "Listing layout");

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

// "" when `msg` is a descriptor message for the receiver `me` of `n` ranks whose secret is
// `token`, else why not. The secret is compared in constant time (CRYPTO_memcmp).
std::string checkMessage(const FdMessage& msg, int n, int me, const uint8_t* token);

// Accept-time rule: "" when a connection whose peer credentials are `peer` may be served by a
// process of effective uid `myUid` (the same uid only), else why not.
std::string checkPeerUid(const ucred& peer, uid_t myUid);

// Message-time rule: "" when `peer` may be the process that published `sender`, else why not.
// Where both share a PID namespace (`sender.pidNs` == `myPidNs`, known) and the sender published
// its pid, the connecting process must be that pid; elsewhere pids cannot be compared.
std::string checkSenderProcess(const ucred& peer, const Listing& sender, uint64_t myPidNs);

// The inode of /proc/self/ns/<kind> ("pid", "user"); 0 when it cannot be read.
uint64_t namespaceId(const char* kind);

// Creates `dir` (0700) if missing and checks it: a directory (not a symlink) owned by `uid`,
// its mode tightened to 0700 if looser. "" when usable, else why not (naming the path).
std::string prepareSocketDir(const std::string& dir, uid_t uid);

// The file name of a path socket: fd-<pid namespace, hex>-<pid>-<rank>-<8 hex>.sock.
std::string socketFileName(uint64_t pidNs, int pid, int rank, uint32_t nonce);

// Removes from `dir` the socket files this module's naming identifies whose process is gone:
// files owned by `uid` named by socketFileName, where either the pid is in `myPidNs` (known) and
// no longer exists, or the file is at least kStaleProbeAgeSeconds old and a connection to it is
// refused (nobody listens). A socket that accepts a connection, a file of another owner, and
// anything else are left alone. Returns the names removed.
std::vector<std::string> removeStaleSockets(const std::string& dir, uid_t uid, uint64_t myPidNs);

}  // namespace fdwire

}  // namespace anyr
