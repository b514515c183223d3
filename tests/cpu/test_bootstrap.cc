// Bootstrap tests: the TCP rendezvous and allGather across real processes on loopback, the
// unique id codec, and the message header parser.
//
// Every multi-process test forks one process per rank (processes.h): no test can hang. Ports
// are always 0 (any free port): tests can run in parallel.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/message.h"
#include "bootstrap/socket.h"
#include "bootstrap/unique_id.h"
#include "bootstrap_raw.h"
#include "expect_error.h"
#include "processes.h"

namespace anyr {
namespace {

using namespace anyr::proctest;  // NOLINT: the harness
using namespace anyr::rawtest;   // NOLINT: raw protocol clients

uint8_t pattern(int rank, int round, size_t i) {
  return static_cast<uint8_t>(rank * 131 + round * 17 + i * 7 + (i >> 8));
}

// allGather of `bytes` distinct bytes per rank; checks every byte of every rank's slot.
void checkedAllGather(Bootstrap* bs, int round, size_t bytes) {
  int n = bs->size();
  std::vector<uint8_t> in(bytes);
  for (size_t i = 0; i < bytes; ++i) in[i] = pattern(bs->rank(), round, i);
  std::vector<uint8_t> out(bytes * static_cast<size_t>(n), 0xee);
  bs->allGather(in.data(), out.data(), bytes);
  for (int q = 0; q < n; ++q) {
    for (size_t i = 0; i < bytes; ++i) {
      uint8_t got = out[static_cast<size_t>(q) * bytes + i];
      if (got != pattern(q, round, i)) {
        expect(false, "rank " + std::to_string(bs->rank()) + " round " + std::to_string(round) +
                          ": byte " + std::to_string(i) + " of rank " + std::to_string(q) + " is " +
                          std::to_string(got) + ", expected " +
                          std::to_string(pattern(q, round, i)));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// TCP bootstrap across processes

TEST(TcpBootstrap, FourRanksAllGatherBarrierAndRounds) {
  const int kRanks = 4;
  anyrUniqueId id = loopbackId();
  auto res = runTcpRanks(id, kRanks, 10000, 30000, [](Bootstrap& bs, int r) -> std::string {
    expect(bs.rank() == r && bs.size() == kRanks, "rank()/size()");
    const size_t sizes[] = {1, 13, 4096, 0, 1 << 20, 7};
    int round = 0;
    for (size_t bytes : sizes) checkedAllGather(&bs, round++, bytes);
    for (int i = 0; i < 3; ++i) bs.barrier();
    std::vector<int> v = bs.allGatherValue<int>(10 * r + 1);
    for (int q = 0; q < kRanks; ++q) expect(v[q] == 10 * q + 1, "allGatherValue");
    char buf[16] = {0};
    if (r == 2) std::strcpy(buf, "from rank two");
    bs.broadcast(buf, sizeof(buf), 2);
    expect(std::string(buf) == "from rank two", "broadcast from rank 2");
    checkedAllGather(&bs, round++, 100);
    return "ok";
  });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(res[r].finished && res[r].code == 0) << "rank " << r << ": " << res[r].describe();
  }
}

TEST(TcpBootstrap, SingleRankNeedsNoPeers) {
  anyrUniqueId id = loopbackId();
  auto bs = createTcpBootstrap(id, 0, 1, 1000);
  int v = 42;
  EXPECT_EQ(bs->allGatherValue(v), std::vector<int>{42});
  bs->barrier();
}

// A loopback id made in a child process that has exited since: nobody listens on its port.
void idMadeByAProcessThatExited(anyrUniqueId* id) {
  Processes creator;
  creator.spawn([]() -> std::string {
    anyrUniqueId made = loopbackId();
    return std::string(made.internal, sizeof(made.internal));
  });
  auto res = creator.waitAll(10000);
  ASSERT_TRUE(res[0].finished && res[0].code == 0) << res[0].describe();
  ASSERT_EQ(res[0].message.size(), sizeof(id->internal));
  std::memcpy(id->internal, res[0].message.data(), sizeof(id->internal));
}

TEST(TcpBootstrap, RankZeroBindsThePortWhenTheIdWasMadeElsewhere) {
  // The id comes from a process that exits: rank 0 finds no registered listener and binds the
  // id's address and port itself.
  anyrUniqueId id;
  ASSERT_NO_FATAL_FAILURE(idMadeByAProcessThatExited(&id));
  auto res = runTcpRanks(id, 3, 10000, 30000, [](Bootstrap& bs, int r) -> std::string {
    checkedAllGather(&bs, 0, 64);
    bs.barrier();
    return "ok";
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(res[r].finished && res[r].code == 0) << "rank " << r << ": " << res[r].describe();
  }
}

TEST(TcpBootstrap, WrongSecretIsRejectedWhileRealRanksComplete) {
  anyrUniqueId id = loopbackId();
  UniqueIdInfo info = decodeUniqueId(id);
  info.secret[5] ^= 0x5a;
  anyrUniqueId forged;
  encodeUniqueId(info, &forged);

  Processes procs;
  size_t impostor = procs.spawn([forged]() -> std::string {
    auto bs = createTcpBootstrap(forged, 1, 2, 5000);
    return "impostor was let in";
  });
  size_t rank0 = procs.spawn([id]() -> std::string {
    auto bs = createTcpBootstrap(id, 0, 2, 10000);
    checkedAllGather(bs.get(), 0, 32);
    return "ok";
  });
  size_t rank1 = procs.spawn([id]() -> std::string {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // after the impostor
    auto bs = createTcpBootstrap(id, 1, 2, 10000);
    checkedAllGather(bs.get(), 0, 32);
    return "ok";
  });
  auto res = procs.waitAll(30000);
  EXPECT_TRUE(res[rank0].finished && res[rank0].code == 0) << res[rank0].describe();
  EXPECT_TRUE(res[rank1].finished && res[rank1].code == 0) << res[rank1].describe();
  // Rank 0 proves itself first; with another secret the impostor cannot verify that proof
  // (nor can rank 0 tell a wrong id from a fake rank 0), so it refuses rank 0 and sends nothing
  // that depends on its secret.
  EXPECT_TRUE(res[impostor].finished) << res[impostor].describe();
  EXPECT_EQ(res[impostor].code, anyrRemoteError) << res[impostor].describe();
  EXPECT_TRUE(contains(res[impostor].message,
                       "rank 1 refused the process at " + info.addr.toString() +
                           ": its CHALLENGE does not prove that it holds the unique id's secret"))
      << res[impostor].message;
  EXPECT_LT(res[impostor].elapsedMs, 4000) << "the refusal should be prompt";
}

TEST(TcpBootstrap, DuplicateRankAndNranksMismatchAreRejected) {
  anyrUniqueId id = loopbackId();
  Processes procs;
  std::vector<size_t> real;
  real.push_back(procs.spawn([id]() -> std::string {
    auto bs = createTcpBootstrap(id, 0, 3, 10000);
    checkedAllGather(bs.get(), 0, 8);
    return "ok";
  }));
  real.push_back(procs.spawn([id]() -> std::string {
    auto bs = createTcpBootstrap(id, 1, 3, 10000);
    checkedAllGather(bs.get(), 0, 8);
    return "ok";
  }));
  size_t dup = procs.spawn([id]() -> std::string {
    std::this_thread::sleep_for(std::chrono::milliseconds(400));  // after the real rank 1
    auto bs = createTcpBootstrap(id, 1, 3, 5000);
    return "duplicate was let in";
  });
  size_t mismatch = procs.spawn([id]() -> std::string {
    auto bs = createTcpBootstrap(id, 2, 4, 5000);
    return "nranks mismatch was let in";
  });
  real.push_back(procs.spawn([id]() -> std::string {
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // after the bad ones
    auto bs = createTcpBootstrap(id, 2, 3, 10000);
    checkedAllGather(bs.get(), 0, 8);
    return "ok";
  }));
  auto res = procs.waitAll(30000);
  for (size_t i : real) {
    EXPECT_TRUE(res[i].finished && res[i].code == 0) << "rank " << i << ": " << res[i].describe();
  }
  EXPECT_EQ(res[dup].code, anyrInvalidArgument) << res[dup].describe();
  EXPECT_TRUE(contains(res[dup].message, "rank 1 is already connected")) << res[dup].message;
  EXPECT_EQ(res[mismatch].code, anyrInvalidArgument) << res[mismatch].describe();
  EXPECT_TRUE(contains(res[mismatch].message,
                       "nranks mismatch: rank 0 was created with 3 ranks, rank 2 with 4"))
      << res[mismatch].message;
}

TEST(TcpBootstrap, MalformedConnectionsAreRejectedWhileRealRanksComplete) {
  anyrUniqueId id = loopbackId();
  SocketAddress addr = decodeUniqueId(id).addr;

  // Raw clients connect before any rank runs, so rank 0 meets them first.
  struct Raw {
    const char* name;
    std::vector<uint8_t> bytes;
    bool shutWrite;        // close the sending side after the bytes
    std::string expected;  // substring of what the client must receive
  };
  std::string http = "GET / HTTP/1.1\r\nHost: anyreduce\r\n\r\n";
  http.resize(64, 'x');
  std::vector<uint8_t> hello =
      headerBytes(kMsgMagic, kMsgProtocolVersion, MsgType::kHello, 1, 3, kNonceBytes);
  std::vector<uint8_t> fullHello = hello;
  fullHello.resize(kMsgHeaderBytes + kNonceBytes, 0x11);
  // A PROOF made without the secret (the CHALLENGE's nonce is not even known yet).
  const std::vector<uint8_t> guessedMac(kMacBytes, 0x22);
  std::vector<uint8_t> helloAndGuess = fullHello;
  std::vector<uint8_t> guess = plainMessage(MsgType::kProof, 1, 3, guessedMac.data(), kMacBytes);
  helloAndGuess.insert(helloAndGuess.end(), guess.begin(), guess.end());
  std::vector<uint8_t> helloAndOtherRank = fullHello;
  std::vector<uint8_t> other = plainMessage(MsgType::kProof, 2, 3, guessedMac.data(), kMacBytes);
  helloAndOtherRank.insert(helloAndOtherRank.end(), other.begin(), other.end());
  const std::string version = std::to_string(kMsgProtocolVersion);
  std::vector<Raw> raws = {
      {"garbage", std::vector<uint8_t>(http.begin(), http.end()), false,
       "REJECT: malformed HELLO: bad magic"},
      {"header cut short", std::vector<uint8_t>(hello.begin(), hello.begin() + 10), true, "EOF"},
      {"length over the limit",
       headerBytes(kMsgMagic, kMsgProtocolVersion, MsgType::kHello, 1, 3, kMsgMaxPayload + 1),
       false, "REJECT: malformed HELLO: payload length 67108865 exceeds the maximum 67108864"},
      {"bad version", headerBytes(kMsgMagic, 99, MsgType::kHello, 1, 3, kNonceBytes), false,
       "REJECT: malformed HELLO: protocol version 99, expected " + version},
      {"version 1 HELLO (the secret in clear)",
       headerBytes(kMsgMagic, 1, MsgType::kHello, 1, 3, 32), false,
       "REJECT: malformed HELLO: protocol version 1, expected " + version},
      {"rank out of range",
       headerBytes(kMsgMagic, kMsgProtocolVersion, MsgType::kHello, 5, 3, kNonceBytes), false,
       "REJECT: malformed HELLO: rank 5 out of range for 3 ranks"},
      {"not a HELLO",
       headerBytes(kMsgMagic, kMsgProtocolVersion, MsgType::kGather, 1, 3, kNonceBytes), false,
       "REJECT: expected HELLO, got GATHER"},
      {"HELLO of the wrong length",
       headerBytes(kMsgMagic, kMsgProtocolVersion, MsgType::kHello, 1, 3, 8), false,
       "REJECT: malformed HELLO: payload of 8 bytes, expected 32"},
      {"truncated and held open", std::vector<uint8_t>(hello.begin(), hello.begin() + 5), false,
       "REJECT: every rank arrived before this connection sent a complete HELLO"},
      {"silent",
       {},
       false,
       "REJECT: every rank arrived before this connection sent a complete HELLO"},
      {"PROOF without the secret", helloAndGuess, false,
       "REJECT: wrong secret: the connection from 127.0.0.1:"},
      {"PROOF for another rank", helloAndOtherRank, false,
       "REJECT: PROOF for rank 2 of 3 after a HELLO for rank 1 of 3"},
      {"HELLO, then silent", fullHello, false,
       "REJECT: every rank arrived before this connection sent its PROOF"},
  };
  std::vector<Socket> clients;
  for (const Raw& raw : raws) {
    std::string err;
    Socket s = connectWithRetry(addr, Deadline(5000), &err);
    ASSERT_TRUE(s.valid()) << raw.name << ": " << err;
    int e = 0;
    ASSERT_EQ(sendAll(s.fd(), raw.bytes.data(), raw.bytes.size(), Deadline(5000), &e),
              IoResult::kDone)
        << raw.name;
    if (raw.shutWrite) ::shutdown(s.fd(), SHUT_WR);
    clients.push_back(std::move(s));
  }

  Processes procs;
  for (int r = 0; r < 3; ++r) {
    procs.spawn([id, r]() -> std::string {
      // Ranks 1 and 2 come a little later, so that rank 0 certainly meets the raw clients
      // while it still waits (and the test does not depend on that ordering either way).
      if (r > 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      auto bs = createTcpBootstrap(id, r, 3, 10000);
      checkedAllGather(bs.get(), 0, 24);
      bs->barrier();
      return "ok";
    });
  }
  auto res = procs.waitAll(30000);
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(res[r].finished && res[r].code == 0) << "rank " << r << ": " << res[r].describe();
  }
  for (size_t i = 0; i < raws.size(); ++i) {
    std::string reply = readReply(clients[i].fd(), 5000);
    EXPECT_TRUE(contains(reply, raws[i].expected))
        << raws[i].name << ": got \"" << reply << "\", expected \"" << raws[i].expected << "\"";
  }
}

// Ranks `present` of `nranks` start; the others never do.
void runMissingRanks(int nranks, const std::vector<int>& present, const std::string& missingText) {
  const int kTimeoutMs = 1500;
  anyrUniqueId id = loopbackId();
  std::string addr = decodeUniqueId(id).addr.toString();
  Processes procs;
  for (int r : present) {
    procs.spawn([id, r, nranks]() -> std::string {
      auto bs = createTcpBootstrap(id, r, nranks, kTimeoutMs);
      return "rendezvous completed without the missing rank(s)";
    });
  }
  auto res = procs.waitAll(15000);
  std::string expected0 = "bootstrap: " + missingText + " of " + std::to_string(nranks) +
                          " did not arrive at " + addr + " within 1500 ms";
  ASSERT_EQ(present[0], 0);
  EXPECT_TRUE(res[0].finished) << res[0].describe();
  EXPECT_EQ(res[0].code, anyrTimeout) << res[0].describe();
  EXPECT_EQ(res[0].message, expected0);
  EXPECT_GE(res[0].elapsedMs, kTimeoutMs - 100);
  EXPECT_LT(res[0].elapsedMs, kTimeoutMs + 3000) << "rank 0 must give up at its deadline";
  for (size_t i = 1; i < present.size(); ++i) {
    EXPECT_TRUE(res[i].finished) << res[i].describe();
    EXPECT_EQ(res[i].code, anyrTimeout) << res[i].describe();
    EXPECT_TRUE(contains(res[i].message, "rank 0 at " + addr + " aborted: " + missingText + " of " +
                                             std::to_string(nranks) + " did not arrive"))
        << res[i].message;
    EXPECT_LT(res[i].elapsedMs, kTimeoutMs + 3000);
  }
}

TEST(TcpBootstrap, MissingRankTimesOutNamingExactlyThatRank) {
  runMissingRanks(3, {0, 1}, "rank(s) 2");
}

TEST(TcpBootstrap, MissingRanksAreAllNamed) { runMissingRanks(4, {0, 2}, "rank(s) 1, 3"); }

// n ranks on `id` (every wait bounded at 5 s): rank `closer` exits once the bootstrap is up,
// closing its connections, and must exit cleanly; the others enter an allGather.
std::vector<ChildResult> rankClosingBeforeAllGather(const anyrUniqueId& id, int n, int closer) {
  auto res = runTcpRanks(id, n, 5000, 20000, [closer](Bootstrap& bs, int r) -> std::string {
    if (r == closer) return "ok";  // exits: its connections close
    checkedAllGather(&bs, 0, 16);
    return "allGather completed without rank " + std::to_string(closer);
  });
  EXPECT_EQ(res[closer].code, 0) << res[closer].describe();
  return res;
}

TEST(TcpBootstrap, RankClosingBeforeAllGatherIsNamed) {
  auto res = rankClosingBeforeAllGather(loopbackId(), 3, 2);
  EXPECT_EQ(res[0].code, anyrRemoteError) << res[0].describe();
  EXPECT_EQ(res[0].message, "bootstrap: rank 2 closed the connection");
  EXPECT_EQ(res[1].code, anyrRemoteError) << res[1].describe();
  EXPECT_TRUE(contains(res[1].message, "aborted: rank 2 closed the connection")) << res[1].message;
  EXPECT_LT(res[0].elapsedMs, 4000) << "a closed connection must be noticed before the deadline";
}

TEST(TcpBootstrap, RankZeroClosingIsNamedByTheOthers) {
  anyrUniqueId id = loopbackId();
  std::string addr = decodeUniqueId(id).addr.toString();
  auto res = rankClosingBeforeAllGather(id, 2, 0);
  EXPECT_EQ(res[1].code, anyrRemoteError) << res[1].describe();
  EXPECT_TRUE(contains(res[1].message, "bootstrap: rank 0 at " + addr + " closed the connection"))
      << res[1].message;
  EXPECT_LT(res[1].elapsedMs, 4000) << "a closed connection must be noticed before the deadline";
}

TEST(TcpBootstrap, RankSilentInAllGatherTimesOutNamingIt) {
  anyrUniqueId id = loopbackId();
  auto res = runTcpRanks(id, 3, 1500, 20000, [](Bootstrap& bs, int r) -> std::string {
    if (r == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // misses the deadline
    }
    checkedAllGather(&bs, 0, 16);
    return "allGather completed";
  });
  const std::string text =
      "allGather: rank(s) 2 of 3 did not send their contribution within 1500 ms";
  EXPECT_EQ(res[0].code, anyrTimeout) << res[0].describe();
  EXPECT_EQ(res[0].message, "bootstrap: " + text);
  EXPECT_EQ(res[1].code, anyrTimeout) << res[1].describe();
  EXPECT_TRUE(contains(res[1].message, "aborted: " + text)) << res[1].message;
  // The late rank finds rank 0's ABORT when it finally calls allGather.
  EXPECT_EQ(res[2].code, anyrTimeout) << res[2].describe();
  EXPECT_TRUE(contains(res[2].message, "aborted: " + text)) << res[2].message;
}

TEST(TcpBootstrap, SizeMismatchNamesTheRankAndLeavesTheBootstrapUnusable) {
  anyrUniqueId id = loopbackId();
  auto res = runTcpRanks(id, 3, 5000, 20000, [](Bootstrap& bs, int r) -> std::string {
    std::vector<uint8_t> in(r == 1 ? 8 : 4, 1), out(3 * in.size());
    try {
      bs.allGather(in.data(), out.data(), in.size());
    } catch (const Error& first) {
      try {
        bs.barrier();
      } catch (const Error& again) {
        expect(again.code() == anyrInvalidUsage,
               "later call: code " + std::to_string(again.code()));
        expect(contains(again.what(), "unusable after an earlier failure"), again.what());
        throw first;
      }
      expect(false, "barrier after a failure succeeded");
    }
    return "mismatched allGather succeeded";
  });
  const std::string text = "rank 1 contributed 8 bytes but rank 0 contributed 4";
  EXPECT_EQ(res[0].code, anyrRemoteError) << res[0].describe();
  EXPECT_TRUE(contains(res[0].message, "bootstrap: allGather: " + text)) << res[0].message;
  for (int r = 1; r < 3; ++r) {
    EXPECT_EQ(res[r].code, anyrRemoteError) << res[r].describe();
    EXPECT_TRUE(contains(res[r].message, "aborted: allGather: " + text)) << res[r].message;
  }
}

TEST(TcpBootstrap, RankThatCannotReachRankZeroNamesIt) {
  // An id whose listener is gone and that nobody serves: rank 1 retries until its deadline.
  anyrUniqueId id;
  ASSERT_NO_FATAL_FAILURE(idMadeByAProcessThatExited(&id));
  std::string addr = decodeUniqueId(id).addr.toString();
  auto start = Clock::now();
  try {
    createTcpBootstrap(id, 1, 2, 800);
    FAIL() << "connected to nobody";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), anyrTimeout);
    EXPECT_TRUE(
        contains(e.what(), "rank 1 could not connect to rank 0 at " + addr + " within 800 ms"))
        << e.what();
  }
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(3000));
}

TEST(TcpBootstrap, BadArgumentsAreRejected) {
  anyrUniqueId id = loopbackId();
  auto code = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.code();
    }
    return anyrSuccess;
  };
  EXPECT_EQ(code([&] { createTcpBootstrap(id, 2, 2, 1000); }), anyrInvalidArgument);
  EXPECT_EQ(code([&] { createTcpBootstrap(id, -1, 2, 1000); }), anyrInvalidArgument);
  EXPECT_EQ(code([&] { createTcpBootstrap(id, 0, 0, 1000); }), anyrInvalidArgument);
  EXPECT_EQ(code([&] { createTcpBootstrap(id, 0, 5000, 1000); }), anyrInvalidArgument);
  EXPECT_EQ(code([&] { createTcpBootstrap(id, 0, 2, 0); }), anyrInvalidArgument);
  anyrUniqueId zero;
  std::memset(&zero, 0, sizeof(zero));
  try {
    createTcpBootstrap(zero, 1, 2, 1000);
    FAIL() << "a zero id was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), anyrInvalidArgument);
    EXPECT_STREQ(e.what(), "unique id: bad magic (not an anyreduce unique id)");
  }
}

TEST(TcpBootstrap, Ipv6Loopback) {
  SocketAddress v6;
  ASSERT_TRUE(SocketAddress::fromLiteral("::1", 0, &v6));
  try {
    Socket probe = listenOn(v6);
  } catch (const Error& e) {
    GTEST_SKIP() << "no IPv6 loopback here: " << e.what();
  }
  anyrUniqueId id;
  {
    ScopedEnv a("ANYR_SOCKET_ADDR", "::1");
    ScopedEnv p("ANYR_SOCKET_PORT", nullptr);
    createUniqueId(&id);
  }
  UniqueIdInfo info = decodeUniqueId(id);
  EXPECT_EQ(info.addr.family(), AF_INET6);
  EXPECT_EQ(info.addr.toString().rfind("[::1]:", 0), 0u) << info.addr.toString();
  auto res = runTcpRanks(id, 2, 10000, 20000, [](Bootstrap& bs, int r) -> std::string {
    checkedAllGather(&bs, 0, 100);
    return "ok";
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(res[r].finished && res[r].code == 0) << "rank " << r << ": " << res[r].describe();
  }
}

// ---------------------------------------------------------------------------------------------
// Unique id

uint32_t fnv1a(const uint8_t* p, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 16777619u;
  }
  return h;
}

// Rewrites the checksum after a test altered a field, so that the field check is reached.
void resealChecksum(anyrUniqueId* id) {
  uint8_t* p = reinterpret_cast<uint8_t*>(id->internal);
  uint32_t sum = fnv1a(p, offsetof(UniqueIdWire, checksum));
  uint8_t* c = p + offsetof(UniqueIdWire, checksum);
  c[0] = static_cast<uint8_t>(sum >> 24);
  c[1] = static_cast<uint8_t>(sum >> 16);
  c[2] = static_cast<uint8_t>(sum >> 8);
  c[3] = static_cast<uint8_t>(sum);
}

std::string decodeError(const anyrUniqueId& id) {
  try {
    decodeUniqueId(id);
  } catch (const Error& e) {
    return std::to_string(e.code()) + " " + e.what();
  }
  return "accepted";
}

TEST(UniqueId, RoundTripsIpv4AndIpv6) {
  for (const char* lit : {"10.1.2.3", "2001:db8::7"}) {
    UniqueIdInfo in;
    ASSERT_TRUE(SocketAddress::fromLiteral(lit, 41234, &in.addr));
    for (size_t i = 0; i < in.secret.size(); ++i) in.secret[i] = static_cast<uint8_t>(i * 3 + 1);
    anyrUniqueId id;
    encodeUniqueId(in, &id);
    UniqueIdInfo out = decodeUniqueId(id);
    EXPECT_EQ(out.addr.toString(), in.addr.toString());
    EXPECT_EQ(out.addr.port(), 41234);
    EXPECT_TRUE(secretsEqual(out.secret, in.secret));
  }
}

TEST(UniqueId, DecodeRejectsGarbage) {
  const std::string bad = std::to_string(anyrInvalidArgument) + " ";
  anyrUniqueId id;
  std::memset(&id, 0, sizeof(id));
  EXPECT_EQ(decodeError(id), bad + "unique id: bad magic (not an anyreduce unique id)");
  std::mt19937 rng(7);
  for (int t = 0; t < 1000; ++t) {
    for (char& c : id.internal) c = static_cast<char>(rng());
    EXPECT_NE(decodeError(id), "accepted");
  }

  UniqueIdInfo info;
  ASSERT_TRUE(SocketAddress::fromLiteral("127.0.0.1", 5000, &info.addr));
  anyrUniqueId good;
  encodeUniqueId(info, &good);
  ASSERT_EQ(decodeError(good), "accepted");

  id = good;
  id.internal[5] = 9;  // version
  EXPECT_EQ(decodeError(id).rfind(bad + "unique id: format version 9", 0), 0u) << decodeError(id);
  id = good;
  id.internal[40] ^= 1;  // a secret byte, checksum not updated
  EXPECT_EQ(decodeError(id), bad + "unique id: checksum mismatch (the id was altered in transit)");
  id = good;
  id.internal[100] = 1;  // beyond the layout
  EXPECT_TRUE(contains(decodeError(id), "unused byte 100 is not zero")) << decodeError(id);
  id = good;
  id.internal[6] = 5;  // family
  resealChecksum(&id);
  EXPECT_EQ(decodeError(id), bad + "unique id: address family 5 (expected 4 or 6)");
  id = good;
  id.internal[8] = id.internal[9] = 0;  // port
  resealChecksum(&id);
  EXPECT_EQ(decodeError(id), bad + "unique id: port 0");
}

TEST(UniqueId, CreateListensOnLoopbackWithAFreshSecret) {
  anyrUniqueId a = loopbackId();
  anyrUniqueId b = loopbackId();
  UniqueIdInfo ia = decodeUniqueId(a);
  UniqueIdInfo ib = decodeUniqueId(b);
  EXPECT_FALSE(secretsEqual(ia.secret, ib.secret));
  EXPECT_NE(ia.addr.port(), ib.addr.port());
  EXPECT_EQ(ia.addr.toString().rfind("127.0.0.1:", 0), 0u) << ia.addr.toString();
  std::string err;
  Socket s = connectWithRetry(ia.addr, Deadline(2000), &err);  // the listener is there
  EXPECT_TRUE(s.valid()) << err;
}

TEST(UniqueId, ListenAddressFollowsTheEnvironment) {
  ScopedEnv a("ANYR_SOCKET_ADDR", nullptr);
  ScopedEnv i("ANYR_SOCKET_IFNAME", nullptr);
  ScopedEnv p("ANYR_SOCKET_PORT", nullptr);
  EXPECT_EQ(chooseListenAddress().toString(), "127.0.0.1:0");
  {
    ScopedEnv port("ANYR_SOCKET_PORT", "41999");
    EXPECT_EQ(chooseListenAddress().toString(), "127.0.0.1:41999");
  }
  {
    ScopedEnv port("ANYR_SOCKET_PORT", "70000");
    EXPECT_THROW(chooseListenAddress(), Error);
  }
  {
    ScopedEnv addr("ANYR_SOCKET_ADDR", "127.0.0.5");
    ScopedEnv ifname("ANYR_SOCKET_IFNAME", "anyr_nosuch0");  // ADDR wins
    EXPECT_EQ(chooseListenAddress().toString(), "127.0.0.5:0");
  }
  {
    ScopedEnv addr("ANYR_SOCKET_ADDR", "[::1]");
    EXPECT_EQ(chooseListenAddress().family(), AF_INET6);
  }
  {
    ScopedEnv addr("ANYR_SOCKET_ADDR", "not-an-address");
    expectError([] { chooseListenAddress(); }, anyrInvalidArgument,
                "ANYR_SOCKET_ADDR='not-an-address'", "accepted a bad ANYR_SOCKET_ADDR");
  }
  {
    ScopedEnv addr("ANYR_SOCKET_ADDR", "0.0.0.0");
    EXPECT_THROW(chooseListenAddress(), Error);
  }
  {
    ScopedEnv ifname("ANYR_SOCKET_IFNAME", "anyr_nosuch0");
    expectError([] { chooseListenAddress(); }, anyrInvalidArgument,
                "ANYR_SOCKET_IFNAME='anyr_nosuch0'", "accepted a missing interface");
  }
  if (if_nametoindex("lo") != 0) {
    ScopedEnv ifname("ANYR_SOCKET_IFNAME", "lo");
    EXPECT_EQ(chooseListenAddress().toString(), "127.0.0.1:0");
  }
}

// ---------------------------------------------------------------------------------------------
// Message header parser

std::string parseError(const std::vector<uint8_t>& bytes) {
  MsgHeader h;
  std::string why;
  if (parseHeader(bytes.data(), bytes.size(), &h, &why)) return "ok";
  return why;
}

TEST(BootstrapMessage, ValidHeaderRoundTrips) {
  std::vector<uint8_t> b =
      headerBytes(kMsgMagic, kMsgProtocolVersion, MsgType::kGatherAll, 3, 4, 1234);
  MsgHeader h;
  std::string why;
  ASSERT_TRUE(parseHeader(b.data(), b.size(), &h, &why)) << why;
  EXPECT_EQ(h.type, static_cast<uint16_t>(MsgType::kGatherAll));
  EXPECT_EQ(h.rank, 3u);
  EXPECT_EQ(h.nranks, 4u);
  EXPECT_EQ(h.length, 1234u);
  EXPECT_EQ(b[0], 'A');  // big-endian magic reads "ANYB"
  EXPECT_EQ(b[3], 'B');
}

TEST(BootstrapMessage, RejectsBadHeaders) {
  // Any type number, known or not.
  auto hdr = [](uint32_t magic, uint16_t version, uint16_t type, uint32_t rank, uint32_t nranks,
                uint32_t length) {
    return rawtest::headerBytes(magic, version, static_cast<MsgType>(type), rank, nranks, length);
  };
  const uint16_t v = kMsgProtocolVersion;
  const uint16_t gather = static_cast<uint16_t>(MsgType::kGather);
  EXPECT_EQ(parseError(hdr(kMsgMagic, v, gather, 0, 1, 0)), "ok");
  EXPECT_EQ(parseError(hdr(0x12345678, v, gather, 0, 1, 0)),
            "bad magic 0x12345678 (not an anyreduce bootstrap message)");
  EXPECT_EQ(
      parseError(hdr(kMsgMagic, 1, gather, 0, 1, 0)).rfind("protocol version 1, expected 2", 0),
      0u);
  EXPECT_EQ(
      parseError(hdr(kMsgMagic, 3, gather, 0, 1, 0)).rfind("protocol version 3, expected 2", 0),
      0u);
  EXPECT_EQ(parseError(hdr(kMsgMagic, v, 0, 0, 1, 0)), "unknown message type 0");
  EXPECT_EQ(parseError(hdr(kMsgMagic, v, 7, 0, 1, 0)), "ok");  // CHALLENGE
  EXPECT_EQ(parseError(hdr(kMsgMagic, v, 8, 0, 1, 0)), "ok");  // PROOF
  EXPECT_EQ(parseError(hdr(kMsgMagic, v, 9, 0, 1, 0)), "unknown message type 9");
  EXPECT_EQ(parseError(hdr(kMsgMagic, v, gather, 4, 4, 0)), "rank 4 out of range for 4 ranks");
  EXPECT_EQ(parseError(hdr(kMsgMagic, v, gather, 3, 4, 0)), "ok");
  EXPECT_EQ(parseError(hdr(kMsgMagic, v, gather, 0, 0, 0)), "nranks 0 outside [1, 4096]");
  EXPECT_EQ(parseError(hdr(kMsgMagic, v, gather, 0, 4097, 0)), "nranks 4097 outside [1, 4096]");
  EXPECT_EQ(parseError(hdr(kMsgMagic, v, gather, 4095, 4096, 0)), "ok");
  EXPECT_EQ(parseError(hdr(kMsgMagic, v, gather, 0, 2, kMsgMaxPayload)), "ok");
  EXPECT_EQ(parseError(hdr(kMsgMagic, v, gather, 0, 2, kMsgMaxPayload + 1)),
            "payload length 67108865 exceeds the maximum 67108864");
  EXPECT_EQ(parseError(hdr(kMsgMagic, v, gather, 0, 2, 0xffffffffu)),
            "payload length 4294967295 exceeds the maximum 67108864");
  std::vector<uint8_t> cut = hdr(kMsgMagic, v, gather, 0, 1, 0);
  cut.resize(kMsgHeaderBytes - 1);
  EXPECT_EQ(parseError(cut), "truncated header: 19 of 20 bytes");
  EXPECT_EQ(parseError({}), "truncated header: 0 of 20 bytes");
  std::string why;
  EXPECT_FALSE(parseHeader(nullptr, 100, nullptr, &why));
  EXPECT_FALSE(parseHeader(nullptr, 0, nullptr, nullptr));  // null outputs are allowed
}

TEST(BootstrapMessage, RandomBytesNeverParseIntoOutOfRangeFields) {
  std::mt19937 rng(12345);
  std::vector<uint8_t> b(kMsgHeaderBytes);
  int accepted = 0;
  for (int t = 0; t < 200000; ++t) {
    for (uint8_t& x : b) x = static_cast<uint8_t>(rng());
    if (t % 2 == 0) {  // half with the right magic and version, to reach the later checks
      b[0] = 'A', b[1] = 'N', b[2] = 'Y', b[3] = 'B', b[4] = 0, b[5] = kMsgProtocolVersion;
      b[6] = 0;
      b[12] = b[13] = 0;
      b[8] = b[9] = 0;
      b[7] = static_cast<uint8_t>(b[7] & 0x0f);
      b[16] = static_cast<uint8_t>(b[16] & 0x07);
    }
    MsgHeader h;
    if (!parseHeader(b.data(), b.size(), &h, nullptr)) continue;
    ++accepted;
    ASSERT_EQ(h.magic, kMsgMagic);
    ASSERT_EQ(h.version, kMsgProtocolVersion);
    ASSERT_STRNE(msgTypeName(h.type), "unknown");
    ASSERT_GE(h.nranks, 1u);
    ASSERT_LE(h.nranks, kMsgMaxRanks);
    ASSERT_LT(h.rank, h.nranks);
    ASSERT_LE(h.length, kMsgMaxPayload);
  }
  EXPECT_GT(accepted, 0) << "the generator never reached a valid header";
}

TEST(BootstrapMessage, ReasonRoundTripsAndRejectsBadCodes) {
  std::vector<uint8_t> p = encodeReason(anyrTimeout, "rank 3 did not arrive");
  anyrResult_t code;
  std::string text;
  ASSERT_TRUE(parseReason(p.data(), p.size(), &code, &text));
  EXPECT_EQ(code, anyrTimeout);
  EXPECT_EQ(text, "rank 3 did not arrive");
  p[3] = 0;  // anyrSuccess is not a failure
  EXPECT_FALSE(parseReason(p.data(), p.size(), &code, &text));
  p[3] = anyrNumResults;
  EXPECT_FALSE(parseReason(p.data(), p.size(), &code, &text));
  EXPECT_FALSE(parseReason(p.data(), 3, &code, &text));
  std::vector<uint8_t> big = encodeReason(anyrRemoteError, std::string(1 << 20, 'x'));
  EXPECT_EQ(big.size(), kMsgMaxReason);
  EXPECT_TRUE(parseReason(big.data(), big.size(), &code, &text));
}

// A rank that stops in the middle of a message (a header announcing 16 bytes, then 5 bytes, then
// nothing) is a deadline case of its own: the receiver is inside a partial read, not waiting
// for a message to start. Rank 0 must still give up at its deadline and name the rank, and the
// other real rank must learn why.
TEST(TcpBootstrap, RankStallingMidMessageTimesOutNamingIt) {
  const int kTimeoutMs = 1500;
  anyrUniqueId id = loopbackId();
  const UniqueIdInfo info = decodeUniqueId(id);
  Processes procs;
  size_t staller = procs.spawn([info]() -> std::string {
    RawRank rr;
    const std::string hs = rawHandshake(info, 1, 3, &rr);
    expect(hs.empty(), "handshake: " + hs);
    MsgHeader h;
    std::vector<uint8_t> payload;
    const std::string welcome = recvFromRootRaw(&rr, &h, &payload, 10000);
    expect(welcome == "ok" && h.type == static_cast<uint16_t>(MsgType::kWelcome),
           "expected WELCOME, got " + welcome + " " + msgTypeName(h.type));
    std::vector<uint8_t> part =
        headerBytes(kMsgMagic, kMsgProtocolVersion, MsgType::kGather, 1, 3, 16);
    part.insert(part.end(), 5, 0x42);
    expect(sendBytes(rr.sock.fd(), part), "send partial GATHER");
    std::this_thread::sleep_for(std::chrono::milliseconds(kTimeoutMs + 3000));  // hold it open
    return "held";
  });
  std::vector<size_t> real;
  for (int r : {0, 2}) {
    real.push_back(procs.spawn([id, r]() -> std::string {
      auto bs = createTcpBootstrap(id, r, 3, kTimeoutMs);
      checkedAllGather(bs.get(), 0, 16);
      return "allGather completed without rank 1's full contribution";
    }));
  }
  auto res = procs.waitAll(30000);
  EXPECT_TRUE(res[staller].finished && res[staller].code == 0) << res[staller].describe();
  for (size_t k : real) {
    EXPECT_TRUE(res[k].finished) << res[k].describe();
    EXPECT_EQ(res[k].code, anyrTimeout) << res[k].describe();
    EXPECT_TRUE(contains(res[k].message, "rank(s) 1 of 3")) << res[k].message;
    EXPECT_LT(res[k].elapsedMs, kTimeoutMs + 3000) << res[k].describe();
  }
  std::printf("[ info ] rank 0: %s\n[ info ] rank 2: %s\n", res[real[0]].message.c_str(),
              res[real[1]].message.c_str());
}

}  // namespace
}  // namespace anyr
