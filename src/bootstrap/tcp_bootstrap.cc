// TCP bootstrap: a star through rank 0.
//
// Rendezvous. createUniqueId() binds and listens, puts a random secret in the id, and keeps the
// listening socket in a process-wide registry keyed by that secret. Rank 0's createTcpBootstrap
// adopts the socket when the id was made in its process (or in a process it was forked from);
// otherwise it binds the id's address and port itself. Every other rank connects (retrying
// until the deadline) and sends HELLO with the secret. Rank 0 checks each HELLO (header,
// secret in constant time, nranks, rank not taken); a connection that fails a check gets REJECT
// with the reason and is closed, and rank 0 keeps waiting for the real ranks. Once all ranks
// are in, rank 0 sends WELCOME to each and closes the listener. If the deadline expires first,
// rank 0 throws anyrTimeout naming exactly the ranks that never arrived and sends the same text
// in ABORT to the ranks that did, which throw it too.
//
// allGather. Each rank sends GATHER with its contribution to rank 0; rank 0 reads all of them
// concurrently (poll), checks every size against its own, concatenates them in rank order and
// sends GATHER_ALL to each rank. Any failure seen by rank 0 (a rank missing at the deadline, a
// closed connection, a size mismatch, a malformed message) is sent as ABORT to every rank, so
// that all ranks report the same cause, naming the rank at fault. barrier() is a 0-byte
// allGather.
//
// Deadlines. Every operation is bounded by timeoutMs from its start. Ranks other than 0 wait
// for rank 0's answer a little longer (verdictGraceMs) so that, when rank 0 gives up on a
// missing rank, they receive its ABORT naming that rank instead of timing out on their own
// with less to say.
//
// After any failure the bootstrap is unusable: later calls throw anyrInvalidUsage repeating
// the first failure. One bootstrap must be used by one thread at a time; separate bootstraps
// (for instance several ranks in one process) are independent.
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "bootstrap/message.h"
#include "bootstrap/socket.h"
#include "bootstrap/unique_id.h"
#include "core/error.h"
#include "core/log.h"

namespace anyr {

namespace {

// Listening sockets kept by createUniqueId beyond this count are closed, oldest first, so
// that a process creating many ids it never uses as rank 0 does not run out of descriptors.
constexpr size_t kMaxRegisteredListeners = 64;
// Connections that have not yet sent a complete HELLO; more are refused.
constexpr size_t kMaxPendingConnections = 256;
// Time given to REJECT and ABORT sends (best effort: the peer may be gone).
constexpr int kNoticeSendMs = 1000;

// Extra time a rank other than 0 waits for rank 0's answer beyond timeoutMs: see above.
int verdictGraceMs(int timeoutMs) { return std::min(std::max(timeoutMs / 4, 500), 5000); }

// ---------------------------------------------------------------------------------------------
// Registry of listening sockets made by createUniqueId in this process.

struct RegisteredListener {
  UniqueIdSecret secret;
  SocketAddress addr;
  Socket listener;
};

std::mutex& registryMutex() {
  static std::mutex* mu = new std::mutex;  // leaked on purpose: usable during exit
  return *mu;
}

std::deque<RegisteredListener>& registry() {
  static auto* r = new std::deque<RegisteredListener>;
  return *r;
}

void registerListener(const UniqueIdSecret& secret, const SocketAddress& addr, Socket listener) {
  std::lock_guard<std::mutex> lock(registryMutex());
  auto& r = registry();
  while (r.size() >= kMaxRegisteredListeners) r.pop_front();
  r.push_back(RegisteredListener{secret, addr, std::move(listener)});
}

// The listener registered for this id, removed from the registry; invalid if none.
Socket takeListener(const UniqueIdSecret& secret, const SocketAddress& addr) {
  std::lock_guard<std::mutex> lock(registryMutex());
  auto& r = registry();
  for (auto it = r.begin(); it != r.end(); ++it) {
    if (secretsEqual(it->secret, secret) && it->addr.port() == addr.port()) {
      Socket s = std::move(it->listener);
      r.erase(it);
      return s;
    }
  }
  return Socket();
}

// ---------------------------------------------------------------------------------------------

IoResult sendMessage(int fd, MsgType type, int rank, int nranks, const void* payload, size_t len,
                     const Deadline& deadline, int* err) {
  MsgHeader h;
  h.type = static_cast<uint16_t>(type);
  h.rank = static_cast<uint32_t>(rank);
  h.nranks = static_cast<uint32_t>(nranks);
  h.length = static_cast<uint32_t>(len);
  uint8_t wire[kMsgHeaderBytes];
  encodeHeader(h, wire);
  IoResult r = sendAll(fd, wire, sizeof(wire), deadline, err);
  if (r != IoResult::kDone || len == 0) return r;
  return sendAll(fd, payload, len, deadline, err);
}

std::string rankList(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(ranks[i]);
  }
  return s;
}

class TcpBootstrap final : public Bootstrap {
 public:
  TcpBootstrap(const UniqueIdInfo& info, int rank, int nranks, int timeoutMs)
      : info_(info),
        addrText_(info.addr.toString()),
        rank_(rank),
        nranks_(nranks),
        timeoutMs_(timeoutMs) {}
  ~TcpBootstrap() override = default;  // the sockets close themselves; nothing can throw

  int rank() const override { return rank_; }
  int size() const override { return nranks_; }
  void allGather(const void* in, void* out, size_t bytes) override;
  void barrier() override { allGather(nullptr, nullptr, 0); }

  void rendezvousRoot();
  void rendezvousPeer();

 private:
  // A connection to rank 0 that has not yet sent a complete HELLO.
  struct Pending {
    Socket sock;
    uint8_t buf[kMsgHeaderBytes + kUniqueIdSecretBytes];
    size_t got = 0;
    size_t want = kMsgHeaderBytes;
  };
  // Rank 0's receive state for one rank's GATHER.
  struct Inbound {
    uint8_t hdr[kMsgHeaderBytes];
    size_t hdrGot = 0;
    bool haveHeader = false;
    size_t payloadGot = 0;
    bool done = false;
  };
  enum class PendingStep { kWaiting, kAccepted, kDropped };

  // Records the failure (the bootstrap is unusable from now on) and throws it.
  [[noreturn]] void fail(anyrResult_t code, const std::string& msg);
  // Rank 0: sends ABORT(reason) to every connected rank, closes them, then fails.
  [[noreturn]] void abortAll(anyrResult_t code, const std::string& reason);
  void checkUsable() const;

  PendingStep pumpPending(Pending* p);
  void reject(Pending* p, anyrResult_t code, const std::string& reason);
  void allGatherRoot(const void* in, void* out, size_t bytes);
  void pumpInbound(int r, Inbound* in, uint8_t* dst, size_t bytes);
  void allGatherPeer(const void* in, void* out, size_t bytes);

  // Rank != 0: the next header from rank 0; REJECT and ABORT are read and thrown.
  MsgHeader recvFromRoot(const Deadline& deadline, const char* waitingFor);
  // Rank != 0: reads the payload of the REJECT/ABORT whose header `h` was read; fails with it.
  [[noreturn]] void failWithNotice(const MsgHeader& h, const Deadline& deadline, const char* doing);
  // Rank != 0, after a failed send to rank 0: fails with rank 0's ABORT/REJECT if it sent one.
  void throwPendingNotice(const char* doing);
  [[noreturn]] void failOnRoot(IoResult r, int err, const Deadline& deadline, const char* doing);

  std::string rootText() const { return "rank 0 at " + addrText_; }

  UniqueIdInfo info_;
  std::string addrText_;
  int rank_;
  int nranks_;
  int timeoutMs_;
  std::vector<Socket> peers_;  // rank 0: the connection to rank r at index r
  Socket root_;                // other ranks: the connection to rank 0
  bool failed_ = false;
  std::string failMsg_;
};

void TcpBootstrap::fail(anyrResult_t code, const std::string& msg) {
  failed_ = true;
  failMsg_ = msg;
  ANYR_LOG(Info, rank_, msg);
  throw Error(code, msg);
}

void TcpBootstrap::checkUsable() const {
  if (failed_) {
    throwError(anyrInvalidUsage, "bootstrap: unusable after an earlier failure: " + failMsg_);
  }
}

void TcpBootstrap::abortAll(anyrResult_t code, const std::string& reason) {
  std::vector<uint8_t> payload = encodeReason(code, reason);
  Deadline deadline(kNoticeSendMs);
  for (Socket& s : peers_) {
    if (!s.valid()) continue;
    int err = 0;
    (void)sendMessage(s.fd(), MsgType::kAbort, 0, nranks_, payload.data(), payload.size(), deadline,
                      &err);
    closeGracefully(&s);
  }
  fail(code, "bootstrap: " + reason);
}

// ---------------------------------------------------------------------------------------------
// Rank 0: rendezvous

void TcpBootstrap::reject(Pending* p, anyrResult_t code, const std::string& reason) {
  ANYR_LOG(Warn, 0, "bootstrap: rejected a connection to " << addrText_ << ": " << reason);
  std::vector<uint8_t> payload = encodeReason(code, reason);
  int err = 0;
  (void)sendMessage(p->sock.fd(), MsgType::kReject, 0, nranks_, payload.data(), payload.size(),
                    Deadline(kNoticeSendMs), &err);
  closeGracefully(&p->sock);
}

// Reads what a pending connection has sent; validates its HELLO once complete.
TcpBootstrap::PendingStep TcpBootstrap::pumpPending(Pending* p) {
  for (;;) {
    size_t got = 0;
    int err = 0;
    IoResult r = recvSome(p->sock.fd(), p->buf + p->got, p->want - p->got, &got, &err);
    if (r == IoResult::kTimeout) return PendingStep::kWaiting;  // nothing more for now
    if (r != IoResult::kDone) {
      ANYR_LOG(Info, 0,
               "bootstrap: a connection went away before completing its HELLO ("
                   << ioResultText(r, err) << ")");
      p->sock.close();
      return PendingStep::kDropped;
    }
    p->got += got;
    if (p->got < p->want) continue;

    MsgHeader h;
    std::string why;
    if (!parseHeader(p->buf, kMsgHeaderBytes, &h, &why)) {
      reject(p, anyrRemoteError, "malformed HELLO: " + why);
      return PendingStep::kDropped;
    }
    if (h.type != static_cast<uint16_t>(MsgType::kHello)) {
      reject(p, anyrRemoteError,
             std::string("expected HELLO, got ") + msgTypeName(h.type) + " from rank " +
                 std::to_string(h.rank));
      return PendingStep::kDropped;
    }
    if (h.length != kUniqueIdSecretBytes) {
      reject(p, anyrRemoteError,
             "malformed HELLO: payload of " + std::to_string(h.length) + " bytes, expected " +
                 std::to_string(kUniqueIdSecretBytes));
      return PendingStep::kDropped;
    }
    if (p->want == kMsgHeaderBytes) {
      p->want += kUniqueIdSecretBytes;
      continue;
    }

    UniqueIdSecret secret;
    std::memcpy(secret.data(), p->buf + kMsgHeaderBytes, secret.size());
    int r0 = static_cast<int>(h.rank);
    if (!secretsEqual(secret, info_.secret)) {
      reject(p, anyrInvalidArgument,
             "wrong secret from a connection claiming rank " + std::to_string(r0) +
                 ": its unique id is not the one rank 0 was created with");
      return PendingStep::kDropped;
    }
    if (static_cast<int>(h.nranks) != nranks_) {
      reject(p, anyrInvalidArgument,
             "nranks mismatch: rank 0 was created with " + std::to_string(nranks_) +
                 " ranks, rank " + std::to_string(r0) + " with " + std::to_string(h.nranks));
      return PendingStep::kDropped;
    }
    if (r0 == 0) {
      reject(p, anyrInvalidArgument,
             "a second process claims rank 0 (every rank must be given a distinct rank)");
      return PendingStep::kDropped;
    }
    if (peers_[static_cast<size_t>(r0)].valid()) {
      reject(p, anyrInvalidArgument,
             "rank " + std::to_string(r0) +
                 " is already connected (every rank must be given a distinct rank)");
      return PendingStep::kDropped;
    }
    peers_[static_cast<size_t>(r0)] = std::move(p->sock);
    ANYR_LOG(Trace, 0, "bootstrap: rank " << r0 << " arrived");
    return PendingStep::kAccepted;
  }
}

void TcpBootstrap::rendezvousRoot() {
  Deadline deadline(timeoutMs_);
  Socket listener = takeListener(info_.secret, info_.addr);
  if (nranks_ == 1) return;
  if (!listener.valid()) {
    try {
      listener = listenOn(info_.addr);
    } catch (const Error& e) {
      rethrowWithContext(e, "rank 0 listening on " + addrText_ +
                                " from the unique id (create the id in the rank 0 process, or on"
                                " rank 0's host in a process that has exited)");
    }
  }
  ANYR_LOG(Info, 0,
           "bootstrap: waiting at " << addrText_ << " for " << nranks_ - 1 << " rank(s), up to "
                                    << timeoutMs_ << " ms");
  peers_.resize(static_cast<size_t>(nranks_));
  std::vector<Pending> pending;
  int arrived = 1;
  std::vector<pollfd> fds;
  while (arrived < nranks_) {
    int waitMs = deadline.remainingMs();
    if (waitMs == 0) {
      std::vector<int> missing;
      for (int r = 1; r < nranks_; ++r) {
        if (!peers_[static_cast<size_t>(r)].valid()) missing.push_back(r);
      }
      abortAll(anyrTimeout, "rank(s) " + rankList(missing) + " of " + std::to_string(nranks_) +
                                " did not arrive at " + addrText_ + " within " +
                                std::to_string(timeoutMs_) + " ms");
    }
    // [listener][pending...][ranks already in, watched for an early close]
    fds.clear();
    fds.push_back(pollfd{listener.fd(), POLLIN, 0});
    for (const Pending& p : pending) fds.push_back(pollfd{p.sock.fd(), POLLIN, 0});
    for (int r = 1; r < nranks_; ++r) {
      const Socket& s = peers_[static_cast<size_t>(r)];
      fds.push_back(pollfd{s.valid() ? s.fd() : -1, POLLIN, 0});  // fd -1 is ignored
    }
    int n = ::poll(fds.data(), fds.size(), waitMs);
    if (n < 0 && errno != EINTR) throwErrno("bootstrap: poll while rank 0 waited for the ranks");
    if (n <= 0) continue;

    for (int r = 1; r < nranks_; ++r) {
      const pollfd& f = fds[1 + pending.size() + static_cast<size_t>(r - 1)];
      if (f.fd < 0 || f.revents == 0) continue;
      char c;
      ssize_t k = ::recv(f.fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
      if (k == 0 || (k < 0 && (errno == ECONNRESET || errno == EPIPE))) {
        abortAll(anyrRemoteError,
                 "rank " + std::to_string(r) + " closed the connection before every rank arrived");
      }
      if (k > 0) {
        abortAll(anyrRemoteError, "rank " + std::to_string(r) +
                                      " sent data before every rank arrived (protocol error)");
      }
    }
    size_t nPending = pending.size();
    for (size_t i = 0; i < nPending; ++i) {
      if (fds[1 + i].revents == 0) continue;
      PendingStep step = pumpPending(&pending[i]);
      if (step == PendingStep::kAccepted) ++arrived;
    }
    pending.erase(std::remove_if(pending.begin(), pending.end(),
                                 [](const Pending& p) { return !p.sock.valid(); }),
                  pending.end());
    if (fds[0].revents != 0) {
      for (;;) {
        Socket s = acceptNow(listener);
        if (!s.valid()) break;
        if (pending.size() >= kMaxPendingConnections) {
          ANYR_LOG(Warn, 0,
                   "bootstrap: more than " << kMaxPendingConnections
                                           << " connections without a HELLO; refusing one");
          continue;  // s closes
        }
        pending.push_back(Pending{});
        pending.back().sock = std::move(s);
      }
    }
  }
  // Connections still half-way through a HELLO were not ranks of this communicator.
  for (Pending& p : pending) {
    reject(&p, anyrRemoteError, "every rank arrived before this connection sent a complete HELLO");
  }
  listener.close();

  Deadline sendDeadline(timeoutMs_);
  for (int r = 1; r < nranks_; ++r) {
    int err = 0;
    IoResult res = sendMessage(peers_[static_cast<size_t>(r)].fd(), MsgType::kWelcome, 0, nranks_,
                               nullptr, 0, sendDeadline, &err);
    if (res != IoResult::kDone) {
      abortAll(res == IoResult::kTimeout ? anyrTimeout : anyrRemoteError,
               "rank " + std::to_string(r) + " " + ioResultText(res, err) +
                   " while rank 0 sent WELCOME");
    }
  }
  ANYR_LOG(Info, 0,
           "bootstrap: all " << nranks_ << " ranks arrived in " << deadline.elapsedMs() << " ms");
}

// ---------------------------------------------------------------------------------------------
// Ranks other than 0: rendezvous and helpers

void TcpBootstrap::failWithNotice(const MsgHeader& h, const Deadline& deadline, const char* doing) {
  if (h.length > kMsgMaxReason) {
    fail(anyrRemoteError, "bootstrap: rank " + std::to_string(rank_) + " received a " +
                              msgTypeName(h.type) + " of " + std::to_string(h.length) +
                              " bytes from " + rootText());
  }
  std::vector<uint8_t> payload(h.length);
  int err = 0;
  IoResult r = recvAll(root_.fd(), payload.data(), payload.size(), deadline, &err);
  if (r != IoResult::kDone) failOnRoot(r, err, deadline, doing);
  anyrResult_t code;
  std::string text;
  if (!parseReason(payload.data(), payload.size(), &code, &text)) {
    code = anyrRemoteError;
    text = "(unreadable reason)";
  }
  if (h.type == static_cast<uint16_t>(MsgType::kReject)) {
    fail(code, "bootstrap: rank " + std::to_string(rank_) + " was rejected by " + rootText() +
                   ": " + text);
  }
  fail(code, "bootstrap: rank " + std::to_string(rank_) + ": " + rootText() + " aborted: " + text);
}

void TcpBootstrap::throwPendingNotice(const char* doing) {
  // Only what rank 0 sent before it closed: a short wait is enough.
  Deadline shortWait(100);
  uint8_t wire[kMsgHeaderBytes];
  int err = 0;
  if (recvAll(root_.fd(), wire, sizeof(wire), shortWait, &err) != IoResult::kDone) return;
  MsgHeader h;
  if (!parseHeader(wire, sizeof(wire), &h, nullptr) || h.rank != 0) return;
  if (h.type == static_cast<uint16_t>(MsgType::kAbort) ||
      h.type == static_cast<uint16_t>(MsgType::kReject)) {
    failWithNotice(h, shortWait, doing);
  }
}

void TcpBootstrap::failOnRoot(IoResult r, int err, const Deadline& deadline, const char* doing) {
  if (r == IoResult::kTimeout) {
    fail(anyrTimeout, "bootstrap: rank " + std::to_string(rank_) + " timed out after " +
                          std::to_string(deadline.timeoutMs()) + " ms waiting for " + rootText() +
                          " (" + doing + ")");
  }
  if (r == IoResult::kClosed) {
    fail(anyrRemoteError, "bootstrap: " + rootText() + " closed the connection (rank " +
                              std::to_string(rank_) + " was " + doing + ")");
  }
  fail(anyrSystemError, "bootstrap: rank " + std::to_string(rank_) + " lost " + rootText() + " (" +
                            doing + "): " + ioResultText(r, err));
}

MsgHeader TcpBootstrap::recvFromRoot(const Deadline& deadline, const char* waitingFor) {
  uint8_t wire[kMsgHeaderBytes];
  int err = 0;
  IoResult r = recvAll(root_.fd(), wire, sizeof(wire), deadline, &err);
  if (r != IoResult::kDone) failOnRoot(r, err, deadline, waitingFor);
  MsgHeader h;
  std::string why;
  if (!parseHeader(wire, sizeof(wire), &h, &why)) {
    fail(anyrRemoteError, "bootstrap: rank " + std::to_string(rank_) +
                              " received a malformed message from " + rootText() + ": " + why);
  }
  if (h.rank != 0) {
    fail(anyrRemoteError, "bootstrap: rank " + std::to_string(rank_) + " received a " +
                              msgTypeName(h.type) + " claiming to be from rank " +
                              std::to_string(h.rank) + " from " + rootText());
  }
  if (h.type == static_cast<uint16_t>(MsgType::kReject) ||
      h.type == static_cast<uint16_t>(MsgType::kAbort)) {
    failWithNotice(h, deadline, waitingFor);
  }
  if (static_cast<int>(h.nranks) != nranks_) {
    fail(anyrRemoteError, "bootstrap: rank " + std::to_string(rank_) + " received a " +
                              msgTypeName(h.type) + " for " + std::to_string(h.nranks) +
                              " ranks from " + rootText() + " (this rank has " +
                              std::to_string(nranks_) + ")");
  }
  return h;
}

void TcpBootstrap::rendezvousPeer() {
  Deadline deadline(timeoutMs_);
  Deadline verdict(timeoutMs_ + verdictGraceMs(timeoutMs_));
  std::string lastError = "no attempt";
  root_ = connectWithRetry(info_.addr, deadline, &lastError);
  if (!root_.valid()) {
    fail(anyrTimeout, "bootstrap: rank " + std::to_string(rank_) + " could not connect to " +
                          rootText() + " within " + std::to_string(timeoutMs_) +
                          " ms (last error: " + lastError + ")");
  }
  int err = 0;
  IoResult r = sendMessage(root_.fd(), MsgType::kHello, rank_, nranks_, info_.secret.data(),
                           info_.secret.size(), deadline, &err);
  if (r != IoResult::kDone) {
    if (r != IoResult::kTimeout) throwPendingNotice("sending HELLO");
    failOnRoot(r, err, deadline, "sending HELLO");
  }
  MsgHeader h = recvFromRoot(verdict, "waiting for every rank to arrive");
  if (h.type != static_cast<uint16_t>(MsgType::kWelcome) || h.length != 0) {
    fail(anyrRemoteError, "bootstrap: rank " + std::to_string(rank_) + " expected WELCOME from " +
                              rootText() + ", got " + msgTypeName(h.type) + " of " +
                              std::to_string(h.length) + " bytes");
  }
  ANYR_LOG(Trace, rank_, "bootstrap: welcomed by " << rootText());
}

// ---------------------------------------------------------------------------------------------
// allGather

void TcpBootstrap::allGather(const void* in, void* out, size_t bytes) {
  checkUsable();
  ANYR_REQUIRE_ARG(bytes == 0 || (in != nullptr && out != nullptr), "in/out",
                   "must not be NULL when bytes > 0");
  if (bytes > kMsgMaxPayload / static_cast<size_t>(nranks_)) {
    throwError(anyrInvalidArgument, "bootstrap allGather: " + std::to_string(bytes) +
                                        " bytes per rank x " + std::to_string(nranks_) +
                                        " ranks exceeds the limit of " +
                                        std::to_string(kMsgMaxPayload) + " bytes per exchange");
  }
  if (nranks_ == 1) {
    if (bytes > 0) std::memcpy(out, in, bytes);
    return;
  }
  if (rank_ == 0) {
    allGatherRoot(in, out, bytes);
  } else {
    allGatherPeer(in, out, bytes);
  }
}

// Reads what rank r has sent of its GATHER, into dst (its slot of the output).
void TcpBootstrap::pumpInbound(int r, Inbound* in, uint8_t* dst, size_t bytes) {
  int fd = peers_[static_cast<size_t>(r)].fd();
  std::string who = "rank " + std::to_string(r);
  while (!in->done) {
    size_t got = 0;
    int err = 0;
    IoResult res;
    if (!in->haveHeader) {
      res = recvSome(fd, in->hdr + in->hdrGot, kMsgHeaderBytes - in->hdrGot, &got, &err);
    } else {
      res = recvSome(fd, dst + in->payloadGot, bytes - in->payloadGot, &got, &err);
    }
    if (res == IoResult::kTimeout) return;  // nothing more for now
    if (res == IoResult::kClosed) abortAll(anyrRemoteError, who + " closed the connection");
    if (res == IoResult::kError) {
      abortAll(anyrRemoteError, "connection to " + who + " failed: " + ioResultText(res, err));
    }
    if (in->haveHeader) {
      in->payloadGot += got;
      in->done = in->payloadGot == bytes;
      continue;
    }
    in->hdrGot += got;
    if (in->hdrGot < kMsgHeaderBytes) continue;
    MsgHeader h;
    std::string why;
    if (!parseHeader(in->hdr, kMsgHeaderBytes, &h, &why)) {
      abortAll(anyrRemoteError, "allGather: malformed message from " + who + ": " + why);
    }
    if (h.type != static_cast<uint16_t>(MsgType::kGather) || static_cast<int>(h.rank) != r ||
        static_cast<int>(h.nranks) != nranks_) {
      abortAll(anyrRemoteError, "allGather: expected GATHER from " + who + " of " +
                                    std::to_string(nranks_) + ", got " + msgTypeName(h.type) +
                                    " claiming rank " + std::to_string(h.rank) + " of " +
                                    std::to_string(h.nranks));
    }
    if (h.length != bytes) {
      abortAll(anyrRemoteError, "allGather: " + who + " contributed " + std::to_string(h.length) +
                                    " bytes but rank 0 contributed " + std::to_string(bytes) +
                                    " (every rank must contribute the same number of bytes)");
    }
    in->haveHeader = true;
    in->done = bytes == 0;
  }
}

void TcpBootstrap::allGatherRoot(const void* in, void* out, size_t bytes) {
  Deadline deadline(timeoutMs_);
  uint8_t* o = static_cast<uint8_t*>(out);
  if (bytes > 0) std::memcpy(o, in, bytes);
  std::vector<Inbound> rx(static_cast<size_t>(nranks_));
  std::vector<pollfd> fds;
  std::vector<int> fdRank;
  int left = nranks_ - 1;
  while (left > 0) {
    int waitMs = deadline.remainingMs();
    if (waitMs == 0) {
      std::vector<int> missing;
      for (int r = 1; r < nranks_; ++r) {
        if (!rx[static_cast<size_t>(r)].done) missing.push_back(r);
      }
      abortAll(anyrTimeout,
               "allGather: rank(s) " + rankList(missing) + " of " + std::to_string(nranks_) +
                   " did not send their contribution within " + std::to_string(timeoutMs_) + " ms");
    }
    fds.clear();
    fdRank.clear();
    for (int r = 1; r < nranks_; ++r) {
      if (rx[static_cast<size_t>(r)].done) continue;
      fds.push_back(pollfd{peers_[static_cast<size_t>(r)].fd(), POLLIN, 0});
      fdRank.push_back(r);
    }
    int n = ::poll(fds.data(), fds.size(), waitMs);
    if (n < 0 && errno != EINTR) throwErrno("bootstrap: poll in allGather");
    if (n <= 0) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      int r = fdRank[i];
      Inbound* inb = &rx[static_cast<size_t>(r)];
      pumpInbound(r, inb, o + static_cast<size_t>(r) * bytes, bytes);
      if (inb->done) --left;
    }
  }
  Deadline sendDeadline(timeoutMs_);
  size_t total = bytes * static_cast<size_t>(nranks_);
  for (int r = 1; r < nranks_; ++r) {
    int err = 0;
    IoResult res = sendMessage(peers_[static_cast<size_t>(r)].fd(), MsgType::kGatherAll, 0, nranks_,
                               o, total, sendDeadline, &err);
    if (res != IoResult::kDone) {
      abortAll(res == IoResult::kTimeout ? anyrTimeout : anyrRemoteError,
               "allGather: rank " + std::to_string(r) + " " + ioResultText(res, err) +
                   " while rank 0 sent the result");
    }
  }
}

void TcpBootstrap::allGatherPeer(const void* in, void* out, size_t bytes) {
  Deadline deadline(timeoutMs_);
  Deadline verdict(timeoutMs_ + verdictGraceMs(timeoutMs_));
  int err = 0;
  IoResult r = sendMessage(root_.fd(), MsgType::kGather, rank_, nranks_, in, bytes, deadline, &err);
  if (r != IoResult::kDone) {
    if (r != IoResult::kTimeout) throwPendingNotice("sending its allGather contribution");
    failOnRoot(r, err, deadline, "sending its allGather contribution");
  }
  MsgHeader h = recvFromRoot(verdict, "waiting for the allGather result");
  size_t total = bytes * static_cast<size_t>(nranks_);
  if (h.type != static_cast<uint16_t>(MsgType::kGatherAll) || h.length != total) {
    fail(anyrRemoteError, "bootstrap: rank " + std::to_string(rank_) + " expected GATHER_ALL of " +
                              std::to_string(total) + " bytes from " + rootText() + ", got " +
                              msgTypeName(h.type) + " of " + std::to_string(h.length) + " bytes");
  }
  if (total == 0) return;
  r = recvAll(root_.fd(), out, total, verdict, &err);
  if (r != IoResult::kDone) failOnRoot(r, err, verdict, "receiving the allGather result");
}

}  // namespace

// ---------------------------------------------------------------------------------------------

void createUniqueId(anyrUniqueId* id) {
  ANYR_REQUIRE_ARG(id != nullptr, "uniqueId", "must not be NULL");
  SocketAddress addr = chooseListenAddress();
  Socket listener = listenOn(addr);
  UniqueIdInfo info;
  info.addr = localAddress(listener);  // the port the kernel chose when ANYR_SOCKET_PORT=0
  randomBytes(info.secret.data(), info.secret.size());
  encodeUniqueId(info, id);
  ANYR_LOG(Info, -1, "bootstrap: unique id for " << info.addr.toString());
  registerListener(info.secret, info.addr, std::move(listener));
}

std::unique_ptr<Bootstrap> createTcpBootstrap(const anyrUniqueId& id, int rank, int nranks,
                                              int timeoutMs) {
  ANYR_REQUIRE_ARG(nranks >= 1 && static_cast<uint32_t>(nranks) <= kMsgMaxRanks, "nranks",
                   "must be in [1, " + std::to_string(kMsgMaxRanks) + "]");
  ANYR_REQUIRE_ARG(rank >= 0 && rank < nranks, "rank", "must be in [0, nranks)");
  ANYR_REQUIRE_ARG(timeoutMs > 0, "timeoutMs", "must be positive");
  UniqueIdInfo info = decodeUniqueId(id);
  auto bs = std::make_unique<TcpBootstrap>(info, rank, nranks, timeoutMs);
  if (rank == 0) {
    bs->rendezvousRoot();
  } else {
    bs->rendezvousPeer();
  }
  return bs;
}

}  // namespace anyr
