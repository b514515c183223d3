// The TCP bootstrap's authentication and its defences against strangers (issue 40, parts 2 and
// 3): a fake rank 0 learns nothing about the secret and is refused; forged, replayed and
// injected messages are refused in both directions; idle connections neither stall the
// rendezvous nor take a real rank's place; a failure inside rank 0 after the rendezvous reaches
// every rank as ABORT with its cause. Plus the MACs and the handshake parsers.
//
// Multi-process tests fork one process per rank (processes.h); ports are always 0.
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "bootstrap/auth.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/byte_order.h"
#include "bootstrap/message.h"
#include "bootstrap/socket.h"
#include "bootstrap/unique_id.h"
#include "bootstrap_raw.h"
#include "processes.h"

namespace anyr {
namespace {

using namespace anyr::proctest;  // NOLINT: the harness
using namespace anyr::rawtest;   // NOLINT: raw protocol clients

// An id whose creator process has exited: its port is free, so whoever binds it plays rank 0
// (the documented way to make an id on rank 0's host outside the rank 0 process).
anyrUniqueId idFromExitedProcess() {
  Processes creator;
  creator.spawn([]() -> std::string {
    anyrUniqueId made = loopbackId();
    return std::string(made.internal, sizeof(made.internal));
  });
  auto res = creator.waitAll(10000);
  anyrUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (res[0].code == 0 && res[0].message.size() == sizeof(id.internal)) {
    std::memcpy(id.internal, res[0].message.data(), sizeof(id.internal));
  }
  return id;
}

Socket acceptWithin(const Socket& listener, int timeoutMs) {
  pollfd p{listener.fd(), POLLIN, 0};
  if (::poll(&p, 1, timeoutMs) <= 0) return Socket();
  return acceptNow(listener);
}

// Everything `fd` delivers until EOF or `timeoutMs`; *eof tells which.
std::vector<uint8_t> drain(int fd, int timeoutMs, bool* eof) {
  std::vector<uint8_t> all;
  Deadline deadline(timeoutMs);
  *eof = false;
  while (!deadline.expired()) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, deadline.remainingMs()) <= 0) break;
    uint8_t buf[4096];
    ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      all.insert(all.end(), buf, buf + n);
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
      *eof = true;
      break;
    }
  }
  return all;
}

// Whether any `window`-byte run of the secret appears in `bytes`.
bool containsPartOfSecret(const std::vector<uint8_t>& bytes, const UniqueIdSecret& secret,
                          size_t window) {
  for (size_t i = 0; i + window <= secret.size(); ++i) {
    if (std::search(bytes.begin(), bytes.end(), secret.begin() + static_cast<std::ptrdiff_t>(i),
                    secret.begin() + static_cast<std::ptrdiff_t>(i + window)) != bytes.end()) {
      return true;
    }
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// A fake rank 0: another process holds the id's port (its creator exited) and plays rank 0.

struct FakeRootOutcome {
  std::vector<uint8_t> hello;  // what the victim sent first
  std::vector<uint8_t> after;  // everything it sent after the fake's answer
  bool eof = false;            // the victim closed the connection
  ChildResult victim;
  UniqueIdSecret secret{};  // the id's
  std::string addr;         // the id's address, which the fake holds
};

// The victim is rank 1 of 2 with the real id; `answer` is what the fake sends after the HELLO.
FakeRootOutcome runFakeRoot(const std::function<std::vector<uint8_t>(const MsgHeader&)>& answer) {
  FakeRootOutcome out;
  anyrUniqueId id = idFromExitedProcess();
  UniqueIdInfo info = decodeUniqueId(id);
  out.secret = info.secret;
  out.addr = info.addr.toString();
  Socket listener = listenOn(info.addr);  // the impostor takes the free port
  Processes procs;
  procs.spawn([id]() -> std::string {
    auto bs = createTcpBootstrap(id, 1, 2, 5000);
    std::vector<int> v = bs->allGatherValue<int>(7);
    return "the victim accepted the fake rank 0; its allGather returned " + std::to_string(v[0]);
  });
  Socket s = acceptWithin(listener, 5000);
  if (s.valid()) {
    out.hello.resize(kMsgHeaderBytes + kNonceBytes);
    int err = 0;
    if (recvAll(s.fd(), out.hello.data(), out.hello.size(), Deadline(5000), &err) ==
        IoResult::kDone) {
      MsgHeader h;
      parseHeader(out.hello.data(), kMsgHeaderBytes, &h, nullptr);
      sendBytes(s.fd(), answer(h));
      out.after = drain(s.fd(), 3000, &out.eof);
    }
  }
  out.victim = procs.waitAll(10000)[0];
  return out;
}

// No 8-byte run of the secret in what the fake received, which is the HELLO and nothing else.
void expectNothingSecret(const FakeRootOutcome& o) {
  ASSERT_EQ(o.hello.size(), kMsgHeaderBytes + kNonceBytes) << "the victim never connected";
  std::vector<uint8_t> all = o.hello;
  all.insert(all.end(), o.after.begin(), o.after.end());
  EXPECT_FALSE(containsPartOfSecret(all, o.secret, 8))
      << "the fake rank 0 received bytes of the secret";
  MsgHeader h;
  ASSERT_TRUE(parseHeader(o.hello.data(), kMsgHeaderBytes, &h, nullptr));
  EXPECT_EQ(h.type, static_cast<uint16_t>(MsgType::kHello));
  EXPECT_EQ(h.length, kNonceBytes) << "a HELLO carries the rank's nonce and nothing else";
  EXPECT_TRUE(o.after.empty()) << "the victim sent " << o.after.size()
                               << " more bytes to a process that did not prove the secret";
  EXPECT_TRUE(o.eof) << "the victim must close the connection to the fake rank 0";
}

TEST(BootstrapAuth, FakeRootWithAForgedChallengeLearnsNothingAndIsRefused) {
  FakeRootOutcome o = runFakeRoot([](const MsgHeader& h) {
    // The best a process without the secret can do: a CHALLENGE keyed by a guess.
    UniqueIdSecret guess{};
    Nonce rankNonce{};
    Nonce rootNonce = randomNonce();
    Mac mac = challengeMac(guess, rankNonce, rootNonce, h.rank, h.nranks);
    std::vector<uint8_t> payload(rootNonce.begin(), rootNonce.end());
    payload.insert(payload.end(), mac.begin(), mac.end());
    return plainMessage(MsgType::kChallenge, 0, h.nranks, payload.data(), payload.size());
  });
  expectNothingSecret(o);
  EXPECT_EQ(o.victim.code, anyrRemoteError) << o.victim.describe();
  EXPECT_TRUE(contains(o.victim.message, "rank 1 refused the process at " + o.addr + ":") &&
              contains(o.victim.message,
                       "its CHALLENGE does not prove that it holds the unique "
                       "id's secret"))
      << o.victim.message;
  EXPECT_TRUE(contains(o.victim.message, "nothing that depends on the secret was sent to it"))
      << o.victim.message;
}

TEST(BootstrapAuth, FakeRootThatSkipsTheChallengeIsRefused) {
  // The attack that worked on protocol version 1: WELCOME at once, then GATHER_ALL with the
  // attacker's value. The victim sends nothing that depends on the secret and refuses it.
  FakeRootOutcome o = runFakeRoot([](const MsgHeader& h) {
    std::vector<uint8_t> out = plainMessage(MsgType::kWelcome, 0, h.nranks, nullptr, 0);
    out.resize(out.size() + kMacBytes, 0);  // a MAC it cannot compute
    int values[2] = {666, 7};
    std::vector<uint8_t> ga =
        plainMessage(MsgType::kGatherAll, 0, h.nranks, values, sizeof(values));
    ga.resize(ga.size() + kMacBytes, 0);
    out.insert(out.end(), ga.begin(), ga.end());
    return out;
  });
  expectNothingSecret(o);
  EXPECT_EQ(o.victim.code, anyrRemoteError) << o.victim.describe();
  EXPECT_TRUE(contains(o.victim.message, "rank 1 expected a CHALLENGE from " + o.addr) &&
              contains(o.victim.message, ", got WELCOME; refused it"))
      << o.victim.message;
}

TEST(BootstrapAuth, RejectBeforeTheChallengeIsReportedAsUnauthenticated) {
  // Rank 0 rejects a connection before it knows the rank holds the secret (a malformed or
  // late HELLO) without a MAC; the rank reports it, saying that it could not verify it.
  FakeRootOutcome o = runFakeRoot([](const MsgHeader& h) {
    std::vector<uint8_t> reason = encodeReason(anyrInvalidArgument, "go away");
    return plainMessage(MsgType::kReject, 0, h.nranks, reason.data(), reason.size());
  });
  expectNothingSecret(o);
  EXPECT_EQ(o.victim.code, anyrInvalidArgument) << o.victim.describe();
  EXPECT_EQ(o.victim.message, "bootstrap: rank 1 was rejected by rank 0 at " + o.addr +
                                  " (a REJECT, not authenticated): go away");
}

// ---------------------------------------------------------------------------------------------
// A man in the middle: rank 1 reaches rank 0 through a relay that can drop, change, replay or
// inject whole messages. Everything it relays is checked for bytes of the secret.

enum class Tamper {
  kNone,
  kReplayGatherAll,        // rank 0 -> 1: the second GATHER_ALL replaced by the first
  kForgeGatherAll,         // rank 0 -> 1: a payload byte of the first GATHER_ALL flipped
  kInjectWelcome,          // rank 0 -> 1: a WELCOME with a made-up MAC before the real one
  kReplayWelcome,          // rank 0 -> 1: the WELCOME delivered again in place of GATHER_ALL
  kForgeGather,            // rank 1 -> 0: a payload byte of the first GATHER flipped
  kReplayGather,           // rank 1 -> 0: the second GATHER replaced by the first
  kUnauthenticatedReject,  // rank 0 -> 1: a REJECT in place of the first GATHER_ALL
};

// Relays between the accepted connection `a` (rank 1) and a new one to `root` until either side
// closes or `ms` pass, applying `tamper`. Runs in its own process.
std::string relay(const Socket& listener, const SocketAddress& root, const UniqueIdSecret& secret,
                  Tamper tamper, int ms) {
  Socket a = acceptWithin(listener, 5000);
  if (!a.valid()) return "rank 1 never connected to the relay";
  std::string err;
  Socket b = connectWithRetry(root, Deadline(5000), &err);
  if (!b.valid()) return "relay could not reach rank 0: " + err;
  std::vector<uint8_t> seen;
  // Per direction: bytes received not yet forwarded, and the messages of interest seen.
  std::vector<uint8_t> upBuf, downBuf;  // up: rank 1 -> 0; down: 0 -> rank 1
  std::vector<uint8_t> firstGatherAll, firstGather, welcome;
  int gatherAllCount = 0, gatherCount = 0, tampered = 0;
  Deadline deadline(ms);
  bool open = true;
  while (open && !deadline.expired()) {
    pollfd fds[2] = {{a.fd(), POLLIN, 0}, {b.fd(), POLLIN, 0}};
    if (::poll(fds, 2, deadline.remainingMs()) <= 0) continue;
    for (int side = 0; side < 2; ++side) {
      if (fds[side].revents == 0) continue;
      int from = side == 0 ? a.fd() : b.fd();
      int to = side == 0 ? b.fd() : a.fd();
      std::vector<uint8_t>& buf = side == 0 ? upBuf : downBuf;
      uint8_t chunk[65536];
      ssize_t n = ::recv(from, chunk, sizeof(chunk), MSG_DONTWAIT);
      if (n <= 0) {
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        open = false;
        break;
      }
      seen.insert(seen.end(), chunk, chunk + n);
      buf.insert(buf.end(), chunk, chunk + n);
      // Forward whole messages, tampering as asked.
      for (;;) {
        MsgHeader h;
        if (buf.size() < kMsgHeaderBytes || !parseHeader(buf.data(), buf.size(), &h, nullptr))
          break;
        size_t whole = wireBytes(h);
        if (buf.size() < whole) break;
        std::vector<uint8_t> msg(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(whole));
        buf.erase(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(whole));
        const auto type = static_cast<MsgType>(h.type);
        if (side == 1 && type == MsgType::kWelcome) {
          welcome = msg;
          if (tamper == Tamper::kInjectWelcome) {
            std::vector<uint8_t> fake = msg;
            std::fill(fake.end() - kMacBytes, fake.end(), 0x5a);
            sendBytes(to, fake);
            ++tampered;
          }
        } else if (side == 1 && type == MsgType::kGatherAll) {
          ++gatherAllCount;
          if (gatherAllCount == 1) firstGatherAll = msg;
          if (tamper == Tamper::kReplayGatherAll && gatherAllCount == 2) {
            msg = firstGatherAll;
            ++tampered;
          } else if (tamper == Tamper::kForgeGatherAll && gatherAllCount == 1 && h.length > 0) {
            msg[kMsgHeaderBytes] ^= 0x01;
            ++tampered;
          } else if (tamper == Tamper::kReplayWelcome && gatherAllCount == 1) {
            msg = welcome;
            ++tampered;
          } else if (tamper == Tamper::kUnauthenticatedReject && gatherAllCount == 1) {
            std::vector<uint8_t> reason = encodeReason(anyrInvalidArgument, "go away");
            msg = plainMessage(MsgType::kReject, 0, h.nranks, reason.data(), reason.size());
            ++tampered;
          }
        } else if (side == 0 && type == MsgType::kGather) {
          ++gatherCount;
          if (gatherCount == 1) firstGather = msg;
          if (tamper == Tamper::kForgeGather && gatherCount == 1 && h.length > 0) {
            msg[kMsgHeaderBytes] ^= 0x01;
            ++tampered;
          } else if (tamper == Tamper::kReplayGather && gatherCount == 2) {
            msg = firstGather;
            ++tampered;
          }
        }
        if (!sendBytes(to, msg)) {
          open = false;
          break;
        }
      }
    }
  }
  std::string report = "tampered " + std::to_string(tampered);
  if (containsPartOfSecret(seen, secret, 8)) report += "; SECRET SEEN";
  if (seen.size() < kMsgHeaderBytes) report += "; nothing relayed";
  return report;
}

struct MitmResult {
  ChildResult rank0, rank1, relay;
  std::string relayAddr;  // where rank 1 connects: "rank 0's address" as it knows it
};

// Ranks 0 and 1 (2 ranks) do two allGathers of 8 bytes each; rank 1's id names the relay.
MitmResult runMitm(Tamper tamper) {
  MitmResult m;
  anyrUniqueId id = loopbackId();
  UniqueIdInfo info = decodeUniqueId(id);
  Socket relayListener = listenOn(SocketAddress::loopbackV4(0));
  UniqueIdInfo viaRelay = info;
  viaRelay.addr = localAddress(relayListener);
  m.relayAddr = viaRelay.addr.toString();
  anyrUniqueId relayed;
  encodeUniqueId(viaRelay, &relayed);
  Processes procs;
  const SocketAddress rootAddr = info.addr;
  const UniqueIdSecret secret = info.secret;
  size_t relayProc = procs.spawn([&relayListener, rootAddr, secret, tamper]() -> std::string {
    return relay(relayListener, rootAddr, secret, tamper, 8000);
  });
  relayListener.close();
  auto rankBody = [](const anyrUniqueId& useId, int r) {
    return [useId, r]() -> std::string {
      auto bs = createTcpBootstrap(useId, r, 2, 4000);
      for (int round = 0; round < 2; ++round) {
        uint64_t mine = 1000u * static_cast<uint64_t>(round + 1) + static_cast<uint64_t>(r);
        std::vector<uint64_t> all = bs->allGatherValue(mine);
        for (int q = 0; q < 2; ++q) {
          expect(all[q] == 1000u * static_cast<uint64_t>(round + 1) + static_cast<uint64_t>(q),
                 "round " + std::to_string(round) + ": rank " + std::to_string(q) + "'s value is " +
                     std::to_string(all[q]));
        }
      }
      return "ok";
    };
  };
  size_t r0 = procs.spawn(rankBody(id, 0));
  size_t r1 = procs.spawn(rankBody(relayed, 1));
  auto res = procs.waitAll(20000);
  m.rank0 = res[r0];
  m.rank1 = res[r1];
  m.relay = res[relayProc];
  return m;
}

void expectCleanRelay(const MitmResult& m, int tampered) {
  std::printf("[ info ] rank 0: %s\n[ info ] rank 1: %s\n[ info ] relay: %s\n",
              m.rank0.describe().c_str(), m.rank1.describe().c_str(), m.relay.message.c_str());
  EXPECT_TRUE(m.relay.finished && m.relay.code == 0) << m.relay.describe();
  EXPECT_TRUE(contains(m.relay.message, "tampered " + std::to_string(tampered))) << m.relay.message;
  EXPECT_FALSE(contains(m.relay.message, "SECRET SEEN")) << m.relay.message;
  EXPECT_FALSE(contains(m.relay.message, "nothing relayed")) << m.relay.message;
}

TEST(BootstrapAuth, RelayThatChangesNothingIsTransparentAndSeesNoSecret) {
  MitmResult m = runMitm(Tamper::kNone);
  EXPECT_TRUE(m.rank0.finished && m.rank0.code == 0) << m.rank0.describe();
  EXPECT_TRUE(m.rank1.finished && m.rank1.code == 0) << m.rank1.describe();
  expectCleanRelay(m, 0);
}

// Rank 1 must refuse what the relay did to a message from rank 0, naming the address it came
// from and the rank it claimed.
void expectRank1Refuses(Tamper tamper, const std::string& what) {
  MitmResult m = runMitm(tamper);
  expectCleanRelay(m, 1);
  EXPECT_EQ(m.rank1.code, anyrRemoteError) << m.rank1.describe();
  EXPECT_TRUE(contains(m.rank1.message, what + " claiming rank 0 from " + m.relayAddr))
      << m.rank1.message;
}

TEST(BootstrapAuth, ReplayedGatherAllIsRefused) {
  expectRank1Refuses(Tamper::kReplayGatherAll,
                     "rank 1 refused a forged, replayed or reordered GATHER_ALL");
}

TEST(BootstrapAuth, ForgedGatherAllIsRefused) {
  expectRank1Refuses(Tamper::kForgeGatherAll,
                     "rank 1 refused a forged, replayed or reordered GATHER_ALL");
}

TEST(BootstrapAuth, InjectedWelcomeIsRefused) {
  expectRank1Refuses(Tamper::kInjectWelcome,
                     "rank 1 refused a forged, replayed or reordered WELCOME");
}

TEST(BootstrapAuth, ReplayedWelcomeIsRefused) {
  expectRank1Refuses(Tamper::kReplayWelcome,
                     "rank 1 refused a forged, replayed or reordered WELCOME");
}

TEST(BootstrapAuth, UnauthenticatedRejectAfterTheHandshakeIsRefused) {
  MitmResult m = runMitm(Tamper::kUnauthenticatedReject);
  expectCleanRelay(m, 1);
  EXPECT_EQ(m.rank1.code, anyrRemoteError) << m.rank1.describe();
  EXPECT_TRUE(contains(m.rank1.message, "rank 1 refused a REJECT claiming rank 0 from " +
                                            m.relayAddr +
                                            " after the handshake: a REJECT carries no MAC"))
      << m.rank1.message;
}

// Rank 0 must refuse what the relay did to a message from rank 1, naming the address it came
// from (the relay's, as rank 0 sees it) and the rank it claimed; rank 1 learns it in ABORT.
void expectRank0Refuses(Tamper tamper) {
  MitmResult m = runMitm(tamper);
  expectCleanRelay(m, 1);
  const std::string text =
      "allGather: refused a forged, replayed or reordered GATHER claiming "
      "rank 1 from 127.0.0.1:";
  EXPECT_EQ(m.rank0.code, anyrRemoteError) << m.rank0.describe();
  EXPECT_TRUE(contains(m.rank0.message, "bootstrap: " + text)) << m.rank0.message;
  EXPECT_TRUE(contains(m.rank0.message, "(rank 1's connection): its MAC does not verify"))
      << m.rank0.message;
  EXPECT_EQ(m.rank1.code, anyrRemoteError) << m.rank1.describe();
  EXPECT_TRUE(contains(m.rank1.message, "aborted: " + text)) << m.rank1.message;
}

TEST(BootstrapAuth, ForgedGatherIsRefusedByRankZero) { expectRank0Refuses(Tamper::kForgeGather); }

TEST(BootstrapAuth, ReplayedGatherIsRefusedByRankZero) {
  expectRank0Refuses(Tamper::kReplayGather);
}

// ---------------------------------------------------------------------------------------------
// Strangers: connections that never authenticate.

TEST(BootstrapAuth, ThreeHundredIdleConnectionsNeitherDelayNorRefuseRealRanks) {
  const int kHelloMs = 500;
  ScopedEnv hello("ANYR_BOOTSTRAP_HELLO_MS", std::to_string(kHelloMs).c_str());
  anyrUniqueId id = loopbackId();
  const UniqueIdInfo info = decodeUniqueId(id);
  // 300 connections wait in rank 0's queue before any rank: half silent, half with a HELLO
  // (they never answer the CHALLENGE), all of them older than the real ranks' connections.
  std::vector<Socket> idle;
  for (int i = 0; i < 300; ++i) {
    std::string err;
    idle.push_back(connectWithRetry(info.addr, Deadline(5000), &err));
    ASSERT_TRUE(idle.back().valid()) << "connection " << i << ": " << err;
    if (i % 2 == 1) {
      Nonce n = randomNonce();
      ASSERT_TRUE(sendBytes(idle.back().fd(),
                            plainMessage(MsgType::kHello, 1 + i % 2, 3, n.data(), n.size())));
    }
  }
  auto res = runTcpRanks(id, 3, 10000, 30000, [](Bootstrap& bs, int r) -> std::string {
    bs.barrier();
    return "ok";
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(res[r].finished && res[r].code == 0) << "rank " << r << ": " << res[r].describe();
    // Rank 0 closes the strangers while it waits; the rendezvous takes at most their deadline
    // longer (here: no longer at all, as they are evicted for the real ranks).
    EXPECT_LT(res[r].elapsedMs, kHelloMs + 1500) << "rank " << r << ": " << res[r].describe();
  }
  // Every stranger was closed (REJECT, then end of stream).
  int closed = 0;
  for (Socket& s : idle) {
    bool eof = false;
    drain(s.fd(), 3000, &eof);
    if (eof) ++closed;
  }
  EXPECT_EQ(closed, 300);
}

// A rank half-way through its handshake (CHALLENGE received, PROOF not yet sent) while more
// silent connections arrive than rank 0 has slots for: the silent ones are closed to make room
// for each other, never the rank, which then completes its handshake and gets WELCOME.
TEST(BootstrapAuth, SilentConnectionsArrivingMidHandshakeDoNotCloseTheRank) {
  ScopedEnv hello("ANYR_BOOTSTRAP_HELLO_MS", "5000");
  anyrUniqueId id = loopbackId();
  const UniqueIdInfo info = decodeUniqueId(id);
  Processes procs;
  procs.spawn([id]() -> std::string {
    auto bs = createTcpBootstrap(id, 0, 2, 15000);
    return "ok";
  });
  std::vector<Socket> silent;
  auto connectSilent = [&](int count) {
    for (int i = 0; i < count; ++i) {
      std::string err;
      silent.push_back(connectWithRetry(info.addr, Deadline(5000), &err));
      ASSERT_TRUE(silent.back().valid()) << "connection " << silent.size() << ": " << err;
    }
  };
  connectSilent(255);  // with the rank's, every slot taken
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  RawRank rr;
  RawChallenged c;
  const std::string hs = rawHello(info, 1, 2, &rr, &c);
  ASSERT_EQ(hs, "") << "HELLO / CHALLENGE";
  connectSilent(300);  // while the rank holds its PROOF: rank 0 takes them all in
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_EQ(rawProof(info, c, &rr), "");
  MsgHeader h;
  std::vector<uint8_t> payload;
  const std::string welcome = recvFromRootRaw(&rr, &h, &payload, 10000);
  EXPECT_EQ(welcome, "ok") << "the rank half-way through its handshake was closed";
  EXPECT_EQ(h.type, static_cast<uint16_t>(MsgType::kWelcome)) << msgTypeName(h.type);
  auto res = procs.waitAll(20000);
  EXPECT_TRUE(res[0].finished && res[0].code == 0) << "rank 0: " << res[0].describe();
}

TEST(BootstrapAuth, SilentConnectionIsClosedAtItsOwnDeadline) {
  const int kHelloMs = 300;
  ScopedEnv hello("ANYR_BOOTSTRAP_HELLO_MS", std::to_string(kHelloMs).c_str());
  anyrUniqueId id = loopbackId();
  Processes procs;
  for (int r = 0; r < 2; ++r) {
    procs.spawn([id, r]() -> std::string {
      if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
      auto bs = createTcpBootstrap(id, r, 2, 10000);
      bs->barrier();
      return "ok";
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // rank 0 is waiting
  std::string err;
  Socket silent = connectWithRetry(decodeUniqueId(id).addr, Deadline(5000), &err);
  ASSERT_TRUE(silent.valid()) << err;
  auto start = Clock::now();
  std::string reply = readReply(silent.fd(), 8000);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  EXPECT_EQ(reply,
            "REJECT: no complete handshake within 300 ms of connecting "
            "(ANYR_BOOTSTRAP_HELLO_MS)");
  EXPECT_LT(ms, kHelloMs + 1000) << "held " << ms << " ms, not until every rank arrived";
  auto res = procs.waitAll(20000);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(res[r].finished && res[r].code == 0) << "rank " << r << ": " << res[r].describe();
  }
}

TEST(BootstrapAuth, HandshakeDeadlineVariableIsChecked) {
  for (const char* bad : {"0", "-5", "600001", "soon"}) {
    ScopedEnv hello("ANYR_BOOTSTRAP_HELLO_MS", bad);
    anyrUniqueId id = loopbackId();
    try {
      createTcpBootstrap(id, 0, 2, 1000);
      ADD_FAILURE() << "ANYR_BOOTSTRAP_HELLO_MS=" << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), anyrInvalidArgument) << e.what();
      EXPECT_TRUE(contains(e.what(), std::string("ANYR_BOOTSTRAP_HELLO_MS='") + bad + "'"))
          << e.what();
    }
  }
}

// ---------------------------------------------------------------------------------------------
// A failure inside rank 0 after ranks connected reaches them as ABORT with its cause. The
// failure is a real one: with RLIMIT_NOFILE lowered below the number of descriptors rank 0
// polls, poll() fails with EINVAL.

void lowerDescriptorLimit() {
  rlimit lim;
  getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = 1;
  setrlimit(RLIMIT_NOFILE, &lim);
}

TEST(BootstrapAuth, RankZeroFailureInAllGatherIsSentAsAbort) {
  anyrUniqueId id = loopbackId();
  auto res = runTcpRanks(id, 3, 5000, 20000, [](Bootstrap& bs, int r) -> std::string {
    if (r == 0) lowerDescriptorLimit();
    bs.barrier();
    return "barrier completed";
  });
  EXPECT_EQ(res[0].code, anyrSystemError) << res[0].describe();
  EXPECT_EQ(res[0].message, "bootstrap: poll in allGather: Invalid argument");
  for (int r = 1; r < 3; ++r) {
    EXPECT_EQ(res[r].code, anyrSystemError) << res[r].describe();
    EXPECT_TRUE(contains(res[r].message, "aborted: poll in allGather: Invalid argument"))
        << res[r].message;
    EXPECT_LT(res[r].elapsedMs, 4000) << "rank " << r << " waited for its deadline";
  }
}

TEST(BootstrapAuth, RankZeroFailureDuringRendezvousIsSentAsAbort) {
  // Rank 1 arrives; rank 2 never does. Half a second in, rank 0's descriptor limit drops and a
  // connection wakes its poll, which then fails.
  anyrUniqueId id = loopbackId();
  const SocketAddress addr = decodeUniqueId(id).addr;
  Processes procs;
  for (int r = 0; r < 2; ++r) {
    procs.spawn([id, r, addr]() -> std::string {
      if (r == 0) {
        std::thread([addr] {
          std::this_thread::sleep_for(std::chrono::milliseconds(500));
          int fd = ::socket(addr.family(), SOCK_STREAM, 0);  // before the limit drops
          lowerDescriptorLimit();
          (void)::connect(fd, reinterpret_cast<const sockaddr*>(&addr.storage), addr.len);
        }).detach();
      }
      auto bs = createTcpBootstrap(id, r, 3, 5000);
      return "rendezvous completed without rank 2";
    });
  }
  auto res = procs.waitAll(20000);
  EXPECT_EQ(res[0].code, anyrSystemError) << res[0].describe();
  EXPECT_EQ(res[0].message, "bootstrap: poll while rank 0 waited for the ranks: Invalid argument");
  EXPECT_EQ(res[1].code, anyrSystemError) << res[1].describe();
  EXPECT_TRUE(contains(res[1].message, "rank 0 at " + addr.toString() +
                                           " aborted: poll while rank 0 waited for the ranks: "
                                           "Invalid argument"))
      << res[1].message;
  EXPECT_LT(res[1].elapsedMs, 4000) << "rank 1 waited for its deadline";
}

// ---------------------------------------------------------------------------------------------
// MACs and the handshake's parsers

Nonce nonceOf(uint8_t seed) {
  Nonce n;
  for (size_t i = 0; i < n.size(); ++i) n[i] = static_cast<uint8_t>(seed + 3 * i);
  return n;
}

// HMAC-SHA-256 computed by OpenSSL's one-shot HMAC(), independently of auth.cc.
Mac referenceHmac(const uint8_t* key, size_t keyLen, const std::vector<uint8_t>& data) {
  Mac out{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), key, static_cast<int>(keyLen), data.data(), data.size(), out.data(), &len);
  EXPECT_EQ(len, out.size());
  return out;
}

std::vector<uint8_t> concat(const std::string& label, const Nonce& a, const Nonce& b, uint32_t rank,
                            uint32_t nranks) {
  std::vector<uint8_t> d(label.begin(), label.end());
  d.insert(d.end(), a.begin(), a.end());
  d.insert(d.end(), b.begin(), b.end());
  uint8_t n[8];
  putU32(n, rank);
  putU32(n + 4, nranks);
  d.insert(d.end(), n, n + 8);
  return d;
}

TEST(BootstrapAuth, HandshakeMacsAreHmacSha256OfTheDocumentedInputs) {
  UniqueIdSecret k;
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<uint8_t>(0xa0 + i);
  const Nonce np = nonceOf(1), nr = nonceOf(100);
  EXPECT_EQ(challengeMac(k, np, nr, 3, 8),
            referenceHmac(k.data(), k.size(), concat("anyreduce bootstrap v2 root", np, nr, 3, 8)));
  EXPECT_EQ(proofMac(k, np, nr, 3, 8),
            referenceHmac(k.data(), k.size(), concat("anyreduce bootstrap v2 peer", nr, np, 3, 8)));
  EXPECT_EQ(
      deriveSessionKey(k, np, nr, 3, 8),
      referenceHmac(k.data(), k.size(), concat("anyreduce bootstrap v2 session", nr, np, 3, 8)));
  // Every input matters; the roles differ.
  const Mac c = challengeMac(k, np, nr, 3, 8);
  EXPECT_NE(c, proofMac(k, np, nr, 3, 8));
  EXPECT_NE(c, challengeMac(k, nr, np, 3, 8));
  EXPECT_NE(c, challengeMac(k, np, nr, 2, 8));
  EXPECT_NE(c, challengeMac(k, np, nr, 3, 9));
  UniqueIdSecret k2 = k;
  k2[31] ^= 1;
  EXPECT_NE(c, challengeMac(k2, np, nr, 3, 8));
  EXPECT_NE(randomNonce(), randomNonce());
}

TEST(BootstrapAuth, SealedMessagesOpenOnlyWithTheirKeyDirectionAndSequence) {
  SessionKey key;
  for (size_t i = 0; i < key.size(); ++i) key[i] = static_cast<uint8_t>(i * 7);
  const char payload[] = "every rank's handles";
  std::vector<uint8_t> msg = sealMessage(key, Direction::kFromRoot, 5, MsgType::kGatherAll, 0, 4,
                                         payload, sizeof(payload));
  ASSERT_EQ(msg.size(), kMsgHeaderBytes + sizeof(payload) + kMacBytes);
  MsgHeader h;
  std::string why;
  ASSERT_TRUE(openMessage(key, Direction::kFromRoot, 5, msg.data(), msg.size(), &h, &why)) << why;
  EXPECT_EQ(h.type, static_cast<uint16_t>(MsgType::kGatherAll));
  EXPECT_EQ(h.length, sizeof(payload));
  EXPECT_EQ(std::memcmp(msg.data() + kMsgHeaderBytes, payload, sizeof(payload)), 0);
  // Replayed later (another sequence number), reflected (the other direction), another
  // connection's key.
  EXPECT_FALSE(openMessage(key, Direction::kFromRoot, 6, msg.data(), msg.size(), &h, &why));
  EXPECT_EQ(why, "MAC does not verify (forged, replayed or reordered)");
  EXPECT_FALSE(openMessage(key, Direction::kFromRoot, 4, msg.data(), msg.size(), &h, &why));
  EXPECT_FALSE(openMessage(key, Direction::kToRoot, 5, msg.data(), msg.size(), &h, &why));
  SessionKey other = key;
  other[0] ^= 0x80;
  EXPECT_FALSE(openMessage(other, Direction::kFromRoot, 5, msg.data(), msg.size(), &h, &why));
  // Any changed bit, header, payload or MAC.
  for (size_t i = 0; i < msg.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::vector<uint8_t> t = msg;
      t[i] ^= static_cast<uint8_t>(1u << bit);
      EXPECT_FALSE(openMessage(key, Direction::kFromRoot, 5, t.data(), t.size(), &h, nullptr))
          << "byte " << i << " bit " << bit;
    }
  }
  // Cut short, extended, or of a type that carries no MAC.
  EXPECT_FALSE(openMessage(key, Direction::kFromRoot, 5, msg.data(), msg.size() - 1, &h, &why));
  EXPECT_TRUE(contains(why, "its header announces")) << why;
  std::vector<uint8_t> longer = msg;
  longer.push_back(0);
  EXPECT_FALSE(openMessage(key, Direction::kFromRoot, 5, longer.data(), longer.size(), &h, &why));
  std::vector<uint8_t> reject =
      sealMessage(key, Direction::kFromRoot, 5, MsgType::kReject, 0, 4, payload, sizeof(payload));
  EXPECT_FALSE(openMessage(key, Direction::kFromRoot, 5, reject.data(), reject.size(), &h, &why));
  EXPECT_EQ(why, "REJECT carries no MAC");
}

TEST(BootstrapMessage, HandshakePayloadsParseAtTheirExactLength) {
  EXPECT_TRUE(msgTypeAuthenticated(static_cast<uint16_t>(MsgType::kWelcome)));
  EXPECT_TRUE(msgTypeAuthenticated(static_cast<uint16_t>(MsgType::kGather)));
  EXPECT_TRUE(msgTypeAuthenticated(static_cast<uint16_t>(MsgType::kGatherAll)));
  EXPECT_TRUE(msgTypeAuthenticated(static_cast<uint16_t>(MsgType::kAbort)));
  for (MsgType t : {MsgType::kHello, MsgType::kReject, MsgType::kChallenge, MsgType::kProof}) {
    EXPECT_FALSE(msgTypeAuthenticated(static_cast<uint16_t>(t)))
        << msgTypeName(static_cast<uint16_t>(t));
  }
  std::vector<uint8_t> bytes(kNonceBytes + kMacBytes);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i);
  auto header = [](MsgType t, size_t len) {
    MsgHeader h;
    h.type = static_cast<uint16_t>(t);
    h.rank = 0;
    h.nranks = 2;
    h.length = static_cast<uint32_t>(len);
    return h;
  };
  HandshakeFields f;
  std::string why;
  ASSERT_TRUE(parseHandshake(header(MsgType::kChallenge, 64), bytes.data(), 64, &f, &why)) << why;
  EXPECT_EQ(f.nonce[0], 0);
  EXPECT_EQ(f.nonce[31], 31);
  EXPECT_EQ(f.mac[0], 32);
  EXPECT_EQ(f.mac[31], 63);
  ASSERT_TRUE(parseHandshake(header(MsgType::kHello, 32), bytes.data(), 32, &f, &why)) << why;
  EXPECT_EQ(f.nonce[5], 5);
  EXPECT_EQ(f.mac[5], 0);
  ASSERT_TRUE(parseHandshake(header(MsgType::kProof, 32), bytes.data(), 32, &f, &why)) << why;
  EXPECT_EQ(f.mac[5], 5);
  EXPECT_FALSE(parseHandshake(header(MsgType::kHello, 33), bytes.data(), 33, &f, &why));
  EXPECT_EQ(why, "malformed HELLO: payload of 33 bytes, expected 32");
  EXPECT_FALSE(parseHandshake(header(MsgType::kChallenge, 64), bytes.data(), 63, &f, &why));
  EXPECT_EQ(why, "truncated CHALLENGE: 63 of 64 payload bytes");
  EXPECT_FALSE(parseHandshake(header(MsgType::kProof, 32), nullptr, 32, &f, &why));
  EXPECT_FALSE(parseHandshake(header(MsgType::kWelcome, 0), bytes.data(), 0, &f, &why));
  EXPECT_EQ(why, "WELCOME is not a handshake message");
}

}  // namespace
}  // namespace anyr
