// TCP bootstrap: a star through rank 0.
//
// Rendezvous. createUniqueId() binds and listens, puts a random secret in the id, and keeps the
// listening socket in a process-wide registry keyed by that secret. Rank 0's createTcpBootstrap
// adopts the socket when the id was made in its process (or in a process it was forked from);
// otherwise it binds the id's address and port itself. Every other rank connects (retrying
// until the deadline) and the two authenticate each other without the secret ever crossing the
// wire (bootstrap/auth.h): the rank sends HELLO with its rank, world size and a fresh nonce;
// rank 0 answers CHALLENGE, its own nonce and a MAC keyed by the secret that proves it holds
// it; the rank checks that MAC before it sends anything that depends on the secret, and refuses
// a process that cannot produce it (another program that took the id's port, say) with an error
// naming that process's address; otherwise it answers PROOF, which rank 0 checks. A connection
// that fails a check before it proved the secret (malformed, not a HELLO, a wrong PROOF) gets
// REJECT with the reason and is closed, and rank 0 keeps waiting for the real ranks (a rank
// that receives REJECT reports it as not authenticated: it has no MAC). Once the proof holds,
// rank 0 checks the world size and that the rank is neither 0 nor already taken, and refuses a
// rank that fails this with an (authenticated) ABORT giving the reason. Once all ranks are
// in, rank 0 sends WELCOME to each and closes the listener. If the deadline expires first,
// rank 0 throws anyrTimeout naming exactly the ranks that never arrived and sends the same
// text in ABORT to the ranks that did, which throw it too.
//
// Strangers. A connection that has not completed its handshake has a deadline of its own
// (ANYR_BOOTSTRAP_HELLO_MS from its accept, at most the timeout), after which it gets REJECT
// and is closed; at most kMaxPendingConnections wait at once, and when another one arrives the
// one idle the longest of those without a HELLO is closed. A connection that was challenged
// (a HELLO, answered with CHALLENGE) is never closed for a newcomer: were every waiting
// connection challenged, the newcomer is refused instead, until their deadlines free slots. So
// connections that never authenticate can hold neither rank 0's attention nor a slot a real
// rank needs, nor close a rank half-way through its handshake; a rank is counted only once its
// proof holds.
//
// Messages after the handshake. WELCOME, GATHER, GATHER_ALL and ABORT carry a MAC under the
// connection's session key over their direction, their sequence number on the connection,
// header and payload. The receiver verifies it before it acts on the message: a forged,
// replayed, reflected or reordered message is refused with an error naming the address it came
// from and the rank it claimed, and the bootstrap is unusable from then on (as after any
// failure). A REJECT, which has no MAC, is refused likewise once the handshake is done. Traffic
// is authenticated, not encrypted.
//
// allGather. Each rank sends GATHER with its contribution to rank 0; rank 0 reads all of them
// concurrently (poll), checks every size against its own, concatenates them in rank order and
// sends GATHER_ALL to each rank. Any failure seen by rank 0 (a rank missing at the deadline, a
// closed connection, a size mismatch, a malformed or unauthenticated message, a failed system
// call or any other error inside its bootstrap operations) is sent as ABORT to every connected
// rank, so that all ranks report the same cause, naming the rank at fault. Invalid arguments
// (NULL buffers, too many bytes), found before any exchange, are thrown to the caller alone and
// leave the bootstrap usable. barrier() is a 0-byte allGather.
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
#include <chrono>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "bootstrap/auth.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/message.h"
#include "bootstrap/socket.h"
#include "bootstrap/unique_id.h"

namespace anyr {

namespace {

using Clock = std::chrono::steady_clock;

// Listening sockets kept by createUniqueId beyond this count are closed, oldest first, so
// that a process creating many ids it never uses as rank 0 does not run out of descriptors.
constexpr size_t kMaxRegisteredListeners = 64;
// Connections that have not completed their handshake; when another arrives, the one idle the
// longest is closed.
constexpr size_t kMaxPendingConnections = 256;
// Time given to ABORT sends to connected ranks (best effort: the rank may be gone).
constexpr int kNoticeSendMs = 1000;
// Largest accepted ANYR_BOOTSTRAP_HELLO_MS.
constexpr int64_t kMaxHandshakeMs = 600000;

// Extra time a rank other than 0 waits for rank 0's answer beyond timeoutMs: see above.
int verdictGraceMs(int timeoutMs) { return std::min(std::max(timeoutMs / 4, 500), 5000); }

// ANYR_BOOTSTRAP_HELLO_MS, at most timeoutMs. Throws anyrInvalidArgument naming the variable.
int handshakeDeadlineMs(int timeoutMs) {
  const char* name = "ANYR_BOOTSTRAP_HELLO_MS";
  int64_t v = env::getInt(name);
  if (v < 1 || v > kMaxHandshakeMs) {
    throwError(anyrInvalidArgument, std::string("environment variable ") + name + "='" +
                                        env::getString(name) + "': must be in [1, " +
                                        std::to_string(kMaxHandshakeMs) + "] milliseconds");
  }
  return static_cast<int>(std::min<int64_t>(v, timeoutMs));
}

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
// Sending

MsgHeader makeHeader(MsgType type, int rank, int nranks, size_t len) {
  MsgHeader h;
  h.type = static_cast<uint16_t>(type);
  h.rank = static_cast<uint32_t>(rank);
  h.nranks = static_cast<uint32_t>(nranks);
  h.length = static_cast<uint32_t>(len);
  return h;
}

// A message without MAC: the handshake's and REJECT.
IoResult sendPlain(int fd, MsgType type, int rank, int nranks, const void* payload, size_t len,
                   const Deadline& deadline, int* err) {
  std::vector<uint8_t> wire(kMsgHeaderBytes + len);
  encodeHeader(makeHeader(type, rank, nranks, len), wire.data());
  if (len > 0) std::memcpy(wire.data() + kMsgHeaderBytes, payload, len);
  return sendAll(fd, wire.data(), wire.size(), deadline, err);
}

// A message with its MAC under the connection's session key; consumes a sequence number.
IoResult sendSealed(int fd, Session* session, Direction dir, MsgType type, int rank, int nranks,
                    const void* payload, size_t len, const Deadline& deadline, int* err) {
  uint8_t hdr[kMsgHeaderBytes];
  encodeHeader(makeHeader(type, rank, nranks, len), hdr);
  const Mac mac = messageMac(session->key, dir, session->sendSeq++, hdr, payload, len);
  constexpr size_t kCoalesceBytes = 64u << 10;  // small messages go out in one send
  if (len <= kCoalesceBytes) {
    std::vector<uint8_t> wire(kMsgHeaderBytes + len + kMacBytes);
    std::memcpy(wire.data(), hdr, kMsgHeaderBytes);
    if (len > 0) std::memcpy(wire.data() + kMsgHeaderBytes, payload, len);
    std::memcpy(wire.data() + kMsgHeaderBytes + len, mac.data(), kMacBytes);
    return sendAll(fd, wire.data(), wire.size(), deadline, err);
  }
  IoResult r = sendAll(fd, hdr, sizeof(hdr), deadline, err);
  if (r == IoResult::kDone) r = sendAll(fd, payload, len, deadline, err);
  if (r == IoResult::kDone) r = sendAll(fd, mac.data(), mac.size(), deadline, err);
  return r;
}

std::string rankList(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(ranks[i]);
  }
  return s;
}

// "bootstrap: x" -> "x", so that a reason is not prefixed twice.
std::string withoutPrefix(const std::string& msg) {
  const std::string prefix = "bootstrap: ";
  return msg.compare(0, prefix.size(), prefix) == 0 ? msg.substr(prefix.size()) : msg;
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
  // A connection to rank 0 that has not completed its handshake.
  struct Pending {
    Socket sock;
    std::string from;             // the remote address, for messages
    Deadline handshake{0};        // ANYR_BOOTSTRAP_HELLO_MS from its accept
    Clock::time_point lastHeard;  // accept, or the last bytes received
    bool challenged = false;      // false: reading HELLO; true: CHALLENGE sent, reading PROOF
    uint8_t buf[kMsgHeaderBytes + kNonceBytes + kMacBytes];
    size_t got = 0;
    size_t want = kMsgHeaderBytes;
    uint32_t rank = 0;  // as its HELLO claims
    uint32_t nranks = 0;
    Nonce rankNonce{};
    Nonce rootNonce{};
  };
  // Rank 0's receive state for one rank's GATHER.
  struct Inbound {
    uint8_t hdr[kMsgHeaderBytes];
    size_t hdrGot = 0;
    bool haveHeader = false;
    MsgHeader h;
    bool expected = false;         // a GATHER of this rank of the agreed size
    uint8_t* body = nullptr;       // where its payload goes: the output slot, or scratch
    std::vector<uint8_t> scratch;  // payload of any other message, kept to verify its MAC
    size_t bodyGot = 0;
    uint8_t mac[kMacBytes];
    size_t macGot = 0;
    bool done = false;
  };
  enum class PendingStep { kWaiting, kAccepted, kDropped };

  // Records the failure (the bootstrap is unusable from now on) and throws it.
  [[noreturn]] void fail(anyrResult_t code, const std::string& msg);
  // Rank 0: sends ABORT(reason) to every connected rank, closes them, then fails.
  [[noreturn]] void abortAll(anyrResult_t code, const std::string& reason);
  // Rank 0: runs `op`; any exception it throws that is not already a recorded failure becomes
  // an ABORT to every connected rank (abortAll), so no failure leaves them without its cause.
  template <typename Op>
  void asRoot(Op&& op);
  void checkUsable() const;

  PendingStep pumpPending(Pending* p);
  PendingStep onHandshakeMessage(Pending* p);
  void reject(Pending* p, anyrResult_t code, const std::string& reason, bool warn);
  // Room for one more pending connection: closes the one idle the longest of those that have
  // not been challenged (no HELLO yet) and returns true, or returns false when every pending
  // connection has been challenged.
  bool makeRoom(std::vector<Pending>* pending);
  void rendezvousRootImpl();
  void allGatherRoot(const void* in, void* out, size_t bytes);
  void pumpInbound(int r, Inbound* in, uint8_t* dst, size_t bytes);
  void finishInbound(int r, Inbound* in, size_t bytes);
  void allGatherPeer(const void* in, void* out, size_t bytes);

  // Rank != 0: the next message from rank 0, verified. A message of type `type` with `len`
  // payload bytes has them written to `into` and returns; ABORT (verified) and REJECT fail with
  // their reason; anything else fails naming what arrived.
  void recvFromRoot(const Deadline& deadline, const char* waitingFor, MsgType type, void* into,
                    size_t len);
  // The same, for a message whose header `wire` was already read.
  void finishFromRoot(const uint8_t* wire, const Deadline& deadline, const char* waitingFor,
                      MsgType type, void* into, size_t len);
  // Rank != 0: reads the `len`-byte reason of a REJECT or ABORT; fails if it cannot.
  std::vector<uint8_t> readReason(const MsgHeader& h, const Deadline& deadline, const char* doing);
  // Rank != 0, after a failed send to rank 0: fails with rank 0's ABORT/REJECT if it sent one.
  void throwPendingNotice(const char* doing);
  [[noreturn]] void failOnRoot(IoResult r, int err, const Deadline& deadline, const char* doing);

  std::string rootText() const { return "rank 0 at " + addrText_; }
  std::string me() const { return "rank " + std::to_string(rank_); }

  UniqueIdInfo info_;
  std::string addrText_;
  int rank_;
  int nranks_;
  int timeoutMs_;
  // Rank 0: index r holds rank r's connection, its session and its remote address.
  std::vector<Socket> peers_;
  std::vector<Session> sessions_;
  std::vector<std::string> peerAddr_;
  // Other ranks: the connection to rank 0; `authenticated_` once this rank sent its PROOF.
  Socket root_;
  Session session_;
  bool authenticated_ = false;
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
  for (size_t r = 0; r < peers_.size(); ++r) {
    Socket& s = peers_[r];
    if (!s.valid()) continue;
    int err = 0;
    (void)sendSealed(s.fd(), &sessions_[r], Direction::kFromRoot, MsgType::kAbort, 0, nranks_,
                     payload.data(), payload.size(), deadline, &err);
    closeGracefully(&s);
  }
  fail(code, "bootstrap: " + reason);
}

template <typename Op>
void TcpBootstrap::asRoot(Op&& op) {
  try {
    op();
  } catch (const Error& e) {
    if (failed_) throw;  // already sent to the ranks (abortAll) or recorded
    abortAll(e.code(), withoutPrefix(e.what()));
  } catch (const std::bad_alloc&) {
    if (failed_) throw;
    abortAll(anyrSystemError, "rank 0 ran out of host memory");
  } catch (const std::exception& e) {
    if (failed_) throw;
    abortAll(anyrInternalError, std::string("rank 0: ") + e.what());
  }
}

// ---------------------------------------------------------------------------------------------
// Rank 0: rendezvous

void TcpBootstrap::reject(Pending* p, anyrResult_t code, const std::string& reason, bool warn) {
  if (warn) {
    ANYR_LOG(Warn, 0,
             "bootstrap: rejected a connection from " << p->from << " to " << addrText_ << ": "
                                                      << reason);
  } else {
    ANYR_LOG(
        Info, 0,
        "bootstrap: closed a connection from " << p->from << " to " << addrText_ << ": " << reason);
  }
  std::vector<uint8_t> payload = encodeReason(code, reason);
  int err = 0;
  // One attempt, never a wait: a stranger must not hold rank 0 up.
  (void)sendPlain(p->sock.fd(), MsgType::kReject, 0, nranks_, payload.data(), payload.size(),
                  Deadline(0), &err);
  closeGracefully(&p->sock);
}

bool TcpBootstrap::makeRoom(std::vector<Pending>* pending) {
  // A challenged connection is one round trip from its PROOF, and its own deadline bounds it:
  // closing it for a newcomer would let a burst of silent connections close a real rank half-way
  // through its handshake.
  auto idlest = pending->end();
  for (auto it = pending->begin(); it != pending->end(); ++it) {
    if (it->challenged) continue;
    if (idlest == pending->end() || it->lastHeard < idlest->lastHeard) idlest = it;
  }
  if (idlest == pending->end()) return false;
  reject(&*idlest, anyrRemoteError,
         "closed to make room: more than " + std::to_string(kMaxPendingConnections) +
             " connections were waiting to authenticate and this one, without a HELLO, was idle "
             "the longest",
         false);
  pending->erase(idlest);
  return true;
}

// Reads what a pending connection has sent; handles each complete handshake message.
TcpBootstrap::PendingStep TcpBootstrap::pumpPending(Pending* p) {
  for (;;) {
    size_t got = 0;
    int err = 0;
    IoResult r = recvSome(p->sock.fd(), p->buf + p->got, p->want - p->got, &got, &err);
    if (r == IoResult::kTimeout) return PendingStep::kWaiting;  // nothing more for now
    if (r != IoResult::kDone) {
      ANYR_LOG(Info, 0,
               "bootstrap: a connection from " << p->from << " went away during its handshake ("
                                               << ioResultText(r, err) << ")");
      p->sock.close();
      return PendingStep::kDropped;
    }
    p->lastHeard = Clock::now();
    p->got += got;
    if (p->got < p->want) continue;
    if (p->got > kMsgHeaderBytes) {
      PendingStep step = onHandshakeMessage(p);
      if (step != PendingStep::kWaiting) return step;
      continue;
    }
    // A header is complete: check it before reading its fixed-size payload.
    const char* stage = p->challenged ? "PROOF" : "HELLO";
    const MsgType want = p->challenged ? MsgType::kProof : MsgType::kHello;
    MsgHeader h;
    std::string why;
    if (!parseHeader(p->buf, kMsgHeaderBytes, &h, &why)) {
      reject(p, anyrRemoteError, std::string("malformed ") + stage + ": " + why, true);
      return PendingStep::kDropped;
    }
    if (h.type != static_cast<uint16_t>(want)) {
      reject(p, anyrRemoteError,
             std::string("expected ") + stage + ", got " + msgTypeName(h.type) + " from rank " +
                 std::to_string(h.rank),
             true);
      return PendingStep::kDropped;
    }
    if (p->challenged && (h.rank != p->rank || h.nranks != p->nranks)) {
      reject(p, anyrRemoteError,
             "PROOF for rank " + std::to_string(h.rank) + " of " + std::to_string(h.nranks) +
                 " after a HELLO for rank " + std::to_string(p->rank) + " of " +
                 std::to_string(p->nranks),
             true);
      return PendingStep::kDropped;
    }
    const size_t body = handshakePayloadBytes(h.type);
    if (h.length != body) {
      reject(p, anyrRemoteError,
             std::string("malformed ") + stage + ": payload of " + std::to_string(h.length) +
                 " bytes, expected " + std::to_string(body),
             true);
      return PendingStep::kDropped;
    }
    p->want = kMsgHeaderBytes + body;
  }
}

// A complete HELLO (answered with CHALLENGE) or PROOF (checked; the rank is counted).
TcpBootstrap::PendingStep TcpBootstrap::onHandshakeMessage(Pending* p) {
  MsgHeader h;
  HandshakeFields f;
  std::string why;
  if (!parseHeader(p->buf, kMsgHeaderBytes, &h, &why) ||
      !parseHandshake(h, p->buf + kMsgHeaderBytes, p->got - kMsgHeaderBytes, &f, &why)) {
    reject(p, anyrRemoteError, "malformed handshake: " + why, true);  // checked before: a bug
    return PendingStep::kDropped;
  }
  if (!p->challenged) {
    p->rank = h.rank;
    p->nranks = h.nranks;
    std::copy(f.nonce, f.nonce + kNonceBytes, p->rankNonce.begin());
    p->rootNonce = randomNonce();
    const Mac mac = challengeMac(info_.secret, p->rankNonce, p->rootNonce, p->rank, p->nranks);
    uint8_t payload[kNonceBytes + kMacBytes];
    std::copy(p->rootNonce.begin(), p->rootNonce.end(), payload);
    std::copy(mac.begin(), mac.end(), payload + kNonceBytes);
    int err = 0;
    // A fresh connection's send buffer holds these 84 bytes: one attempt, never a wait.
    IoResult r = sendPlain(p->sock.fd(), MsgType::kChallenge, 0, static_cast<int>(p->nranks),
                           payload, sizeof(payload), Deadline(0), &err);
    if (r != IoResult::kDone) {
      ANYR_LOG(Info, 0,
               "bootstrap: a connection from " << p->from << " claiming rank " << p->rank
                                               << " did not take its CHALLENGE ("
                                               << ioResultText(r, err) << ")");
      p->sock.close();
      return PendingStep::kDropped;
    }
    p->challenged = true;
    p->got = 0;
    p->want = kMsgHeaderBytes;
    return PendingStep::kWaiting;
  }

  const std::string claim =
      "the connection from " + p->from + " claiming rank " + std::to_string(p->rank);
  const Mac expected = proofMac(info_.secret, p->rankNonce, p->rootNonce, p->rank, p->nranks);
  if (!macMatches(expected, f.mac)) {
    reject(p, anyrInvalidArgument,
           "wrong secret: " + claim +
               " sent a PROOF that does not match the unique id rank 0 was created with",
           true);
    return PendingStep::kDropped;
  }
  // The rank holds the secret: from here on every message to it carries a MAC.
  Session session;
  session.key = deriveSessionKey(info_.secret, p->rankNonce, p->rootNonce, p->rank, p->nranks);
  const int r0 = static_cast<int>(p->rank);
  std::string refusal;
  if (static_cast<int>(p->nranks) != nranks_) {
    refusal = "nranks mismatch: rank 0 was created with " + std::to_string(nranks_) +
              " ranks, rank " + std::to_string(r0) + " with " + std::to_string(p->nranks);
  } else if (r0 == 0) {
    refusal = "a second process claims rank 0 (every rank must be given a distinct rank)";
  } else if (peers_[static_cast<size_t>(r0)].valid()) {
    refusal = "rank " + std::to_string(r0) +
              " is already connected (every rank must be given a distinct rank)";
  }
  if (!refusal.empty()) {
    ANYR_LOG(Warn, 0, "bootstrap: refused " << claim << " to " << addrText_ << ": " << refusal);
    std::vector<uint8_t> payload = encodeReason(anyrInvalidArgument, refusal);
    int err = 0;
    (void)sendSealed(p->sock.fd(), &session, Direction::kFromRoot, MsgType::kAbort, 0,
                     static_cast<int>(p->nranks), payload.data(), payload.size(),
                     Deadline(kNoticeSendMs), &err);
    closeGracefully(&p->sock);
    return PendingStep::kDropped;
  }
  peers_[static_cast<size_t>(r0)] = std::move(p->sock);
  sessions_[static_cast<size_t>(r0)] = session;
  peerAddr_[static_cast<size_t>(r0)] = p->from;
  ANYR_LOG(Trace, 0, "bootstrap: rank " << r0 << " arrived from " << p->from);
  return PendingStep::kAccepted;
}

void TcpBootstrap::rendezvousRoot() {
  asRoot([this] { rendezvousRootImpl(); });
}

void TcpBootstrap::rendezvousRootImpl() {
  Deadline deadline(timeoutMs_);
  Socket listener = takeListener(info_.secret, info_.addr);
  if (nranks_ == 1) return;
  const int handshakeMs = handshakeDeadlineMs(timeoutMs_);
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
  sessions_.resize(static_cast<size_t>(nranks_));
  peerAddr_.resize(static_cast<size_t>(nranks_));
  std::vector<Pending> pending;
  auto dropClosed = [&pending] {
    pending.erase(std::remove_if(pending.begin(), pending.end(),
                                 [](const Pending& p) { return !p.sock.valid(); }),
                  pending.end());
  };
  int arrived = 1;
  std::vector<pollfd> fds;
  while (arrived < nranks_) {
    if (deadline.expired()) {
      std::vector<int> missing;
      for (int r = 1; r < nranks_; ++r) {
        if (!peers_[static_cast<size_t>(r)].valid()) missing.push_back(r);
      }
      abortAll(anyrTimeout, "rank(s) " + rankList(missing) + " of " + std::to_string(nranks_) +
                                " did not arrive at " + addrText_ + " within " +
                                std::to_string(timeoutMs_) + " ms");
    }
    int waitMs = deadline.remainingMs();
    for (Pending& p : pending) {
      if (p.handshake.expired()) {
        reject(&p, anyrTimeout,
               std::string("no complete handshake within ") + std::to_string(handshakeMs) +
                   " ms of connecting (ANYR_BOOTSTRAP_HELLO_MS)",
               false);
      } else {
        waitMs = std::min(waitMs, p.handshake.remainingMs());
      }
    }
    dropClosed();
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
        abortAll(anyrRemoteError, "rank " + std::to_string(r) + " (" +
                                      peerAddr_[static_cast<size_t>(r)] +
                                      ") sent data before every rank arrived (protocol error)");
      }
    }
    const size_t nPending = pending.size();
    for (size_t i = 0; i < nPending; ++i) {
      if (fds[1 + i].revents == 0) continue;
      if (pumpPending(&pending[i]) == PendingStep::kAccepted) ++arrived;
    }
    dropClosed();
    if (fds[0].revents != 0) {
      // Bounded, so that a flood of connections cannot keep rank 0 from its deadline.
      for (size_t k = 0; k < kMaxPendingConnections; ++k) {
        SocketAddress from;
        Socket s = acceptNow(listener, &from);
        if (!s.valid()) break;
        if (pending.size() >= kMaxPendingConnections && !makeRoom(&pending)) {
          Pending refused;
          refused.sock = std::move(s);
          refused.from = from.toString();
          reject(&refused, anyrRemoteError,
                 "no room: " + std::to_string(kMaxPendingConnections) +
                     " connections are half-way through their handshake",
                 false);
          continue;
        }
        pending.emplace_back();
        Pending& p = pending.back();
        p.sock = std::move(s);
        p.from = from.toString();
        p.handshake = Deadline(handshakeMs);
        p.lastHeard = Clock::now();
      }
    }
  }
  // Connections still half-way through a handshake were not ranks of this communicator.
  for (Pending& p : pending) {
    reject(&p, anyrRemoteError,
           p.challenged ? "every rank arrived before this connection sent its PROOF"
                        : "every rank arrived before this connection sent a complete HELLO",
           false);
  }
  listener.close();

  Deadline sendDeadline(timeoutMs_);
  for (int r = 1; r < nranks_; ++r) {
    int err = 0;
    IoResult res = sendSealed(peers_[static_cast<size_t>(r)].fd(),
                              &sessions_[static_cast<size_t>(r)], Direction::kFromRoot,
                              MsgType::kWelcome, 0, nranks_, nullptr, 0, sendDeadline, &err);
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

std::vector<uint8_t> TcpBootstrap::readReason(const MsgHeader& h, const Deadline& deadline,
                                              const char* doing) {
  if (h.length > kMsgMaxReason) {
    fail(anyrRemoteError, "bootstrap: " + me() + " received a " + msgTypeName(h.type) + " of " +
                              std::to_string(h.length) + " bytes from " + rootText());
  }
  std::vector<uint8_t> payload(h.length);
  int err = 0;
  IoResult r = recvAll(root_.fd(), payload.data(), payload.size(), deadline, &err);
  if (r != IoResult::kDone) failOnRoot(r, err, deadline, doing);
  return payload;
}

void TcpBootstrap::throwPendingNotice(const char* doing) {
  // Only what rank 0 sent before it closed: a short wait is enough.
  Deadline shortWait(100);
  uint8_t wire[kMsgHeaderBytes];
  int err = 0;
  if (recvAll(root_.fd(), wire, sizeof(wire), shortWait, &err) != IoResult::kDone) return;
  MsgHeader h;
  if (!parseHeader(wire, sizeof(wire), &h, nullptr)) return;
  if (h.type == static_cast<uint16_t>(MsgType::kAbort) ||
      h.type == static_cast<uint16_t>(MsgType::kReject)) {
    // Fails with the notice, or with why it was refused.
    finishFromRoot(wire, shortWait, doing, MsgType::kAbort, nullptr, 0);
  }
}

void TcpBootstrap::failOnRoot(IoResult r, int err, const Deadline& deadline, const char* doing) {
  if (r == IoResult::kTimeout) {
    fail(anyrTimeout, "bootstrap: " + me() + " timed out after " +
                          std::to_string(deadline.timeoutMs()) + " ms waiting for " + rootText() +
                          " (" + doing + ")");
  }
  if (r == IoResult::kClosed) {
    fail(anyrRemoteError,
         "bootstrap: " + rootText() + " closed the connection (" + me() + " was " + doing + ")");
  }
  fail(anyrSystemError,
       "bootstrap: " + me() + " lost " + rootText() + " (" + doing + "): " + ioResultText(r, err));
}

void TcpBootstrap::recvFromRoot(const Deadline& deadline, const char* waitingFor, MsgType type,
                                void* into, size_t len) {
  uint8_t wire[kMsgHeaderBytes];
  int err = 0;
  IoResult r = recvAll(root_.fd(), wire, sizeof(wire), deadline, &err);
  if (r != IoResult::kDone) failOnRoot(r, err, deadline, waitingFor);
  finishFromRoot(wire, deadline, waitingFor, type, into, len);
}

void TcpBootstrap::finishFromRoot(const uint8_t* wire, const Deadline& deadline,
                                  const char* waitingFor, MsgType type, void* into, size_t len) {
  MsgHeader h;
  std::string why;
  if (!parseHeader(wire, kMsgHeaderBytes, &h, &why)) {
    fail(anyrRemoteError,
         "bootstrap: " + me() + " received a malformed message from " + rootText() + ": " + why);
  }
  const std::string what = std::string(msgTypeName(h.type)) + " claiming rank " +
                           std::to_string(h.rank) + " from " + addrText_;
  if (h.type == static_cast<uint16_t>(MsgType::kReject)) {
    std::vector<uint8_t> payload = readReason(h, deadline, waitingFor);
    anyrResult_t code;
    std::string text;
    if (!parseReason(payload.data(), payload.size(), &code, &text)) {
      code = anyrRemoteError;
      text = "(unreadable reason)";
    }
    if (!authenticated_) {
      // Before the CHALLENGE verified, the sender is not known to be rank 0: say so.
      fail(code, "bootstrap: " + me() + " was rejected by " + rootText() +
                     " (a REJECT, not authenticated): " + text);
    }
    // Rank 0 sends REJECT only to connections it has not authenticated.
    fail(anyrRemoteError, "bootstrap: " + me() + " refused a " + what +
                              " after the handshake: a REJECT carries no MAC (its text: " + text +
                              ")");
  }
  if (!msgTypeAuthenticated(h.type)) {
    fail(anyrRemoteError, "bootstrap: " + me() + " refused an unexpected " + what + " while " +
                              waitingFor + " (after the handshake every message carries a MAC)");
  }
  if (h.type == static_cast<uint16_t>(MsgType::kAbort) && h.length > kMsgMaxReason) {
    fail(anyrRemoteError, "bootstrap: " + me() + " received an ABORT of " +
                              std::to_string(h.length) + " bytes from " + rootText());
  }
  // The payload, then the MAC; nothing is acted on before the MAC verifies.
  const bool expected = h.type == static_cast<uint16_t>(type) && h.length == len;
  std::vector<uint8_t> scratch;
  uint8_t* body = static_cast<uint8_t*>(into);
  if (!expected) {
    scratch.resize(h.length);
    body = scratch.data();
  }
  uint8_t mac[kMacBytes];
  int err = 0;
  IoResult r = recvAll(root_.fd(), body, h.length, deadline, &err);
  if (r == IoResult::kDone) r = recvAll(root_.fd(), mac, sizeof(mac), deadline, &err);
  if (r != IoResult::kDone) failOnRoot(r, err, deadline, waitingFor);
  const Mac want =
      messageMac(session_.key, Direction::kFromRoot, session_.recvSeq, wire, body, h.length);
  if (!macMatches(want, mac)) {
    fail(anyrRemoteError,
         "bootstrap: " + me() + " refused a forged, replayed or reordered " + what + " while " +
             waitingFor + ": its MAC does not verify (message " + std::to_string(session_.recvSeq) +
             " from rank 0 on this connection)");
  }
  ++session_.recvSeq;
  if (h.rank != 0) {
    fail(anyrRemoteError, "bootstrap: " + me() + " received a " + msgTypeName(h.type) +
                              " claiming to be from rank " + std::to_string(h.rank) + " from " +
                              rootText());
  }
  if (h.type == static_cast<uint16_t>(MsgType::kAbort)) {
    anyrResult_t code;
    std::string text;
    if (!parseReason(body, h.length, &code, &text)) {
      code = anyrRemoteError;
      text = "(unreadable reason)";
    }
    fail(code, "bootstrap: " + me() + ": " + rootText() + " aborted: " + text);
  }
  if (static_cast<int>(h.nranks) != nranks_) {
    fail(anyrRemoteError, "bootstrap: " + me() + " received a " + msgTypeName(h.type) + " for " +
                              std::to_string(h.nranks) + " ranks from " + rootText() +
                              " (this rank has " + std::to_string(nranks_) + ")");
  }
  if (!expected) {
    fail(anyrRemoteError, "bootstrap: " + me() + " expected " +
                              msgTypeName(static_cast<uint16_t>(type)) + " of " +
                              std::to_string(len) + " bytes from " + rootText() + ", got " +
                              msgTypeName(h.type) + " of " + std::to_string(h.length) + " bytes");
  }
}

void TcpBootstrap::rendezvousPeer() {
  Deadline deadline(timeoutMs_);
  Deadline verdict(timeoutMs_ + verdictGraceMs(timeoutMs_));
  std::string lastError = "no attempt";
  root_ = connectWithRetry(info_.addr, deadline, &lastError);
  if (!root_.valid()) {
    fail(anyrTimeout, "bootstrap: " + me() + " could not connect to " + rootText() + " within " +
                          std::to_string(timeoutMs_) + " ms (last error: " + lastError + ")");
  }
  const Nonce rankNonce = randomNonce();
  int err = 0;
  IoResult r = sendPlain(root_.fd(), MsgType::kHello, rank_, nranks_, rankNonce.data(),
                         rankNonce.size(), deadline, &err);
  if (r != IoResult::kDone) {
    if (r != IoResult::kTimeout) throwPendingNotice("sending HELLO");
    failOnRoot(r, err, deadline, "sending HELLO");
  }

  // CHALLENGE: whoever listens at the id's address proves that it holds the secret before this
  // rank sends anything that depends on it.
  const char* waiting = "waiting for rank 0's CHALLENGE";
  uint8_t wire[kMsgHeaderBytes];
  r = recvAll(root_.fd(), wire, sizeof(wire), verdict, &err);
  if (r != IoResult::kDone) failOnRoot(r, err, verdict, waiting);
  MsgHeader h;
  std::string why;
  if (!parseHeader(wire, sizeof(wire), &h, &why)) {
    fail(anyrRemoteError, "bootstrap: " + me() + " received a malformed message from " + addrText_ +
                              " instead of a CHALLENGE: " + why);
  }
  if (h.type == static_cast<uint16_t>(MsgType::kReject)) {
    finishFromRoot(wire, verdict, waiting, MsgType::kChallenge, nullptr, 0);  // fails with it
  }
  const std::string notProven =
      "; refused it: it has not proven that it holds the unique id's secret, and nothing that "
      "depends on the secret was sent to it";
  if (h.type != static_cast<uint16_t>(MsgType::kChallenge)) {
    fail(anyrRemoteError, "bootstrap: " + me() + " expected a CHALLENGE from " + addrText_ +
                              ", got " + msgTypeName(h.type) + notProven);
  }
  if (h.length != handshakePayloadBytes(h.type) || static_cast<int>(h.nranks) != nranks_ ||
      h.rank != 0) {
    fail(anyrRemoteError, "bootstrap: " + me() + " received a malformed CHALLENGE from " +
                              addrText_ + " (rank " + std::to_string(h.rank) + " of " +
                              std::to_string(h.nranks) + ", " + std::to_string(h.length) +
                              " bytes)" + notProven);
  }
  uint8_t payload[kNonceBytes + kMacBytes];
  r = recvAll(root_.fd(), payload, sizeof(payload), verdict, &err);
  if (r != IoResult::kDone) failOnRoot(r, err, verdict, waiting);
  HandshakeFields f;
  if (!parseHandshake(h, payload, sizeof(payload), &f, &why)) {
    fail(anyrRemoteError, "bootstrap: " + me() + " received a malformed CHALLENGE from " +
                              addrText_ + ": " + why + notProven);
  }
  Nonce rootNonce;
  std::copy(f.nonce, f.nonce + kNonceBytes, rootNonce.begin());
  const auto rank = static_cast<uint32_t>(rank_);
  const auto nranks = static_cast<uint32_t>(nranks_);
  if (!macMatches(challengeMac(info_.secret, rankNonce, rootNonce, rank, nranks), f.mac)) {
    root_.close();
    fail(anyrRemoteError,
         "bootstrap: " + me() + " refused the process at " + addrText_ +
             ": its CHALLENGE does not prove that it holds the unique id's secret, so it is not "
             "rank 0 of this unique id (another process may hold the id's port, for instance "
             "after the id's creator exited) or this rank's unique id is not rank 0's; nothing "
             "that depends on the secret was sent to it");
  }

  // PROOF, then the session: every later message carries a MAC.
  const Mac proof = proofMac(info_.secret, rankNonce, rootNonce, rank, nranks);
  r = sendPlain(root_.fd(), MsgType::kProof, rank_, nranks_, proof.data(), proof.size(), deadline,
                &err);
  session_.key = deriveSessionKey(info_.secret, rankNonce, rootNonce, rank, nranks);
  authenticated_ = true;
  if (r != IoResult::kDone) {
    if (r != IoResult::kTimeout) throwPendingNotice("sending PROOF");
    failOnRoot(r, err, deadline, "sending PROOF");
  }
  recvFromRoot(verdict, "waiting for every rank to arrive", MsgType::kWelcome, nullptr, 0);
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
    asRoot([&] { allGatherRoot(in, out, bytes); });
  } else {
    allGatherPeer(in, out, bytes);
  }
}

// Reads what rank r has sent of its GATHER: the payload into dst (its slot of the output) when
// the header is the expected one, then the MAC.
void TcpBootstrap::pumpInbound(int r, Inbound* in, uint8_t* dst, size_t bytes) {
  int fd = peers_[static_cast<size_t>(r)].fd();
  std::string who = "rank " + std::to_string(r);
  while (!in->done) {
    size_t got = 0;
    int err = 0;
    IoResult res;
    if (!in->haveHeader) {
      res = recvSome(fd, in->hdr + in->hdrGot, kMsgHeaderBytes - in->hdrGot, &got, &err);
    } else if (in->bodyGot < in->h.length) {
      res = recvSome(fd, in->body + in->bodyGot, in->h.length - in->bodyGot, &got, &err);
    } else {
      res = recvSome(fd, in->mac + in->macGot, kMacBytes - in->macGot, &got, &err);
    }
    if (res == IoResult::kTimeout) return;  // nothing more for now
    if (res == IoResult::kClosed) abortAll(anyrRemoteError, who + " closed the connection");
    if (res == IoResult::kError) {
      abortAll(anyrRemoteError, "connection to " + who + " failed: " + ioResultText(res, err));
    }
    if (!in->haveHeader) {
      in->hdrGot += got;
      if (in->hdrGot < kMsgHeaderBytes) continue;
      std::string why;
      if (!parseHeader(in->hdr, kMsgHeaderBytes, &in->h, &why)) {
        abortAll(anyrRemoteError, "allGather: malformed message from " + who + " (" +
                                      peerAddr_[static_cast<size_t>(r)] + "): " + why);
      }
      if (!msgTypeAuthenticated(in->h.type)) {
        abortAll(anyrRemoteError, "allGather: refused an unauthenticated " +
                                      std::string(msgTypeName(in->h.type)) + " claiming rank " +
                                      std::to_string(in->h.rank) + " from " +
                                      peerAddr_[static_cast<size_t>(r)] + " (" + who +
                                      "'s connection): expected GATHER with its MAC");
      }
      in->expected = in->h.type == static_cast<uint16_t>(MsgType::kGather) &&
                     static_cast<int>(in->h.rank) == r &&
                     static_cast<int>(in->h.nranks) == nranks_ && in->h.length == bytes;
      if (in->expected) {
        in->body = dst;
      } else {
        in->scratch.resize(in->h.length);
        in->body = in->scratch.data();
      }
      in->haveHeader = true;
    } else if (in->bodyGot < in->h.length) {
      in->bodyGot += got;
    } else {
      in->macGot += got;
      if (in->macGot == kMacBytes) finishInbound(r, in, bytes);
    }
  }
}

// Rank r's message is complete: verifies its MAC, then that it is the GATHER expected.
void TcpBootstrap::finishInbound(int r, Inbound* in, size_t bytes) {
  const std::string who = "rank " + std::to_string(r);
  Session& s = sessions_[static_cast<size_t>(r)];
  const Mac want =
      messageMac(s.key, Direction::kToRoot, s.recvSeq, in->hdr, in->body, in->h.length);
  if (!macMatches(want, in->mac)) {
    abortAll(anyrRemoteError, "allGather: refused a forged, replayed or reordered " +
                                  std::string(msgTypeName(in->h.type)) + " claiming rank " +
                                  std::to_string(in->h.rank) + " from " +
                                  peerAddr_[static_cast<size_t>(r)] + " (" + who +
                                  "'s connection): its MAC does not verify");
  }
  ++s.recvSeq;
  const MsgHeader& h = in->h;
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
  in->done = true;
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
    IoResult res = sendSealed(peers_[static_cast<size_t>(r)].fd(),
                              &sessions_[static_cast<size_t>(r)], Direction::kFromRoot,
                              MsgType::kGatherAll, 0, nranks_, o, total, sendDeadline, &err);
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
  IoResult r = sendSealed(root_.fd(), &session_, Direction::kToRoot, MsgType::kGather, rank_,
                          nranks_, in, bytes, deadline, &err);
  if (r != IoResult::kDone) {
    if (r != IoResult::kTimeout) throwPendingNotice("sending its allGather contribution");
    failOnRoot(r, err, deadline, "sending its allGather contribution");
  }
  // The result lands in `out` before its MAC is checked; on any failure `out` is unspecified.
  recvFromRoot(verdict, "waiting for the allGather result", MsgType::kGatherAll, out,
               bytes * static_cast<size_t>(nranks_));
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
