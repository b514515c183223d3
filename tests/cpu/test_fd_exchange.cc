// The descriptor exchange of the virtual-memory transport (transport/fd_exchange.h), across real
// processes: every rank gives a memfd holding its own text and checks, through the descriptors
// it received, every peer's text. Then the failures: a rank without a descriptor, a peer that
// presents the wrong secret, a peer that says it sent and did not (a bounded wait that names
// it), path sockets in a directory (owner-only, removed afterwards, stale ones of killed
// processes removed at the next start), a directory too long for a socket; and strangers:
// silent connections (one, many) that must delay nobody, connections of another user or of
// another process than the rank's, refused.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "bootstrap/bootstrap.h"
#include "expect_error.h"
#include "processes.h"
#include "transport/fd_exchange.h"

namespace anyr {
namespace {

using namespace anyr::proctest;  // NOLINT: the harness

std::string textOfRank(int r) { return "descriptor of rank " + std::to_string(r) + " #"; }

// A memfd holding `text`.
int memfdWith(const std::string& text) {
  const int fd = ::memfd_create("anyr-fd-test", MFD_CLOEXEC);
  expect(fd >= 0, "memfd_create");
  expect(::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()), "write");
  return fd;
}

std::string readAll(int fd) {
  char buf[256] = {0};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// Every peer's descriptor arrived here and reads its text; "ok" or throws.
std::string checkAllArrived(const FdExchange& ex, int me, int n) {
  for (int q = 0; q < n; ++q) {
    if (q == me) {
      expect(!ex.fds[q].valid(), "no descriptor for the own rank");
      continue;
    }
    expect(ex.errors[q].empty(),
           "rank " + std::to_string(me) + " from " + std::to_string(q) + ": " + ex.errors[q]);
    expect(ex.fds[q].valid(), "a descriptor from rank " + std::to_string(q));
    const std::string got = readAll(ex.fds[q].fd());
    expect(got == textOfRank(q), "rank " + std::to_string(q) + "'s text, got '" + got + "'");
  }
  return "ok";
}

void expectAllOk(const std::vector<ChildResult>& res) {
  for (size_t r = 0; r < res.size(); ++r) {
    EXPECT_TRUE(res[r].finished && res[r].code == 0) << "rank " << r << ": " << res[r].describe();
  }
}

int64_t msSince(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

// The owner-only directory the exchange keeps its path sockets in, under `base`.
std::string privateDir(const std::string& base) {
  return base + "/anyreduce-" + std::to_string(::geteuid());
}

std::string nameOf(const fdwire::Listing& l) {
  return std::string(l.name, strnlen(l.name, sizeof(l.name)));
}

socklen_t addressOf(const std::string& name, bool abstract, sockaddr_un* a) {
  std::memset(a, 0, sizeof(*a));
  a->sun_family = AF_UNIX;
  std::memcpy(a->sun_path + (abstract ? 1 : 0), name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size() + 1);
}

// Connects to the socket `peer` published and says nothing: the connected socket, or -1 with
// errno.
int connectSilently(const fdwire::Listing& peer) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  expect(fd >= 0, "socket");
  sockaddr_un a;
  const socklen_t len = addressOf(nameOf(peer), peer.listening == 1, &a);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), len) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

// Sends rank `sender`'s descriptor `fd` to the rank that published `peer`, with its secret.
std::string sendAs(int sender, const fdwire::Listing& peer, int fd) {
  fdwire::FdMessage msg{fdwire::kMagic, sender, {}};
  std::memcpy(msg.token, peer.token, fdwire::kTokenBytes);
  return fdwire::sendFd(nameOf(peer), peer.listening == 1, fd, msg, Deadline(5000));
}

// The second gather of a rank played by the test that sent to rank 0 (or failed with `err`).
void reportSentToRankZero(Bootstrap& bs, const std::string& err) {
  fdwire::SendRow row{};
  row.sent[0] = err.empty() ? 1 : 0;
  std::snprintf(row.error[0], sizeof(row.error[0]), "%s", err.c_str());
  bs.allGatherValue(row);
}

TEST(FdExchange, EveryRankReceivesEveryPeersDescriptor) {
  for (int n : {2, 5, 8}) {
    ScopedEnv dir("ANYR_IPC_SOCKET_DIR", nullptr);
    ScopedEnv kind("ANYR_IPC_SOCKET", nullptr);  // path sockets in /tmp/anyreduce-<uid>
    const anyrUniqueId id = loopbackId();
    Processes procs;
    for (int r = 0; r < n; ++r) {
      procs.spawn([id, r, n]() -> std::string {
        auto bs = createTcpBootstrap(id, r, n, 10000);
        const int fd = memfdWith(textOfRank(r));
        FdExchange ex = exchangeFds(*bs, fd, "", 10000);
        ::close(fd);  // the received copies stay valid
        return checkAllArrived(ex, r, n);
      });
    }
    expectAllOk(procs.waitAll(30000));
  }
}

TEST(FdExchange, EveryRankReceivesEveryPeersDescriptorOverAbstractNames) {
  ScopedEnv kind("ANYR_IPC_SOCKET", "abstract");
  const int n = 3;
  const anyrUniqueId id = loopbackId();
  expectAllOk(runTcpRanks(id, n, 10000, 30000, [](Bootstrap& bs, int r) -> std::string {
    const int fd = memfdWith(textOfRank(r));
    FdExchange ex = exchangeFds(bs, fd, "", 10000);
    return checkAllArrived(ex, r, n);
  }));
}

TEST(FdExchange, PathSocketsInADirectoryAreRemovedAfterwards) {
  char tmpl[] = "/tmp/anyr-fd-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  {
    ScopedEnv d("ANYR_IPC_SOCKET_DIR", (dir + "/").c_str());  // a trailing slash is dropped
    ScopedEnv kind("ANYR_IPC_SOCKET", nullptr);
    const anyrUniqueId id = loopbackId();
    const int n = 3;
    expectAllOk(runTcpRanks(id, n, 10000, 30000, [](Bootstrap& bs, int r) -> std::string {
      const int fd = memfdWith(textOfRank(r));
      FdExchange ex = exchangeFds(bs, fd, "", 10000);
      return checkAllArrived(ex, r, n);
    }));
  }
  // The owner-only directory stays (other processes of this user may be using it); empty.
  const std::string sub = privateDir(dir);
  EXPECT_EQ(::rmdir(sub.c_str()), 0) << "sockets left in " << sub << ": " << std::strerror(errno);
  EXPECT_EQ(::rmdir(dir.c_str()), 0) << dir << ": " << std::strerror(errno);
}

TEST(FdExchange, DirectoryTooLongForASocketPathIsRefusedNamingTheVariable) {
  const std::string longDir = "/tmp/" + std::string(90, 'd');
  ScopedEnv d("ANYR_IPC_SOCKET_DIR", longDir.c_str());
  ScopedEnv kind("ANYR_IPC_SOCKET", nullptr);
  try {
    fdSocketDir();
    FAIL() << "a directory of " << longDir.size() << " characters was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), anyrInvalidArgument);
    EXPECT_TRUE(contains(e.what(), "ANYR_IPC_SOCKET_DIR")) << e.what();
    EXPECT_TRUE(contains(e.what(), "too long for a socket path")) << e.what();
  }
  // In the exchange the same rule is a per-rank failure the peers hear about, not a hang.
  const anyrUniqueId id = loopbackId();
  const auto res = runTcpRanks(id, 2, 10000, 20000, [](Bootstrap& bs, int r) -> std::string {
    const int fd = memfdWith(textOfRank(r));
    FdExchange ex = exchangeFds(bs, fd, "", 10000);
    const std::string& e = ex.errors[1 - r];
    expect(!ex.fds[1 - r].valid(), "no descriptor arrived");
    expect(contains(e, "could not listen") && contains(e, "ANYR_IPC_SOCKET_DIR"), e);
    return "ok";
  });
  expectAllOk(res);
  for (const ChildResult& r : res) EXPECT_LT(r.elapsedMs, 5000) << r.describe();
}

TEST(FdExchange, RankWithoutADescriptorIsNamedAndNobodyWaitsForIt) {
  const int n = 3;
  const anyrUniqueId id = loopbackId();
  const auto res = runTcpRanks(id, n, 10000, 30000, [](Bootstrap& bs, int r) -> std::string {
    const int fd = r == 1 ? -1 : memfdWith(textOfRank(r));
    // A long deadline: the ranks must not wait for what cannot come.
    FdExchange ex = exchangeFds(bs, fd, "cuMemExportToShareableHandle: test", 60000);
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      if (q == 1) {
        expect(!ex.fds[q].valid(), "nothing from rank 1");
        expect(ex.errors[q] == "rank 1 has no descriptor: cuMemExportToShareableHandle: test",
               "the reason, got '" + ex.errors[q] + "'");
      } else {
        expect(ex.errors[q].empty() && readAll(ex.fds[q].fd()) == textOfRank(q),
               "rank " + std::to_string(q) + "'s descriptor: " + ex.errors[q]);
      }
    }
    return "ok";
  });
  expectAllOk(res);
  for (const ChildResult& r : res) EXPECT_LT(r.elapsedMs, 10000) << r.describe();
}

// Rank 2 is played by the test: it joins the two gathers as the protocol does, but first sends
// rank 0 a descriptor with a wrong secret, then (`thenReal`) the real one, or nothing while
// saying it sent. Rank 0 must ignore the impostor's message, take the real one, or time out
// naming rank 2 within its deadline; rank 1 is not disturbed either way.
void runImpostor(bool thenReal) {
  const int n = 3;
  const int timeoutMs = 1500;
  const anyrUniqueId id = loopbackId();
  Processes procs;
  for (int r = 0; r < 2; ++r) {
    procs.spawn([id, r, thenReal]() -> std::string {
      auto bs = createTcpBootstrap(id, r, n, 10000);
      const int fd = memfdWith(textOfRank(r));
      FdExchange ex = exchangeFds(*bs, fd, "", timeoutMs);
      expect(ex.errors[1 - r].empty() && readAll(ex.fds[1 - r].fd()) == textOfRank(1 - r),
             "the real peer's descriptor: " + ex.errors[1 - r]);
      if (r == 1) {
        expect(ex.errors[2] == "rank 2 could not send its descriptor here: played by the test",
               "got '" + ex.errors[2] + "'");
      } else if (thenReal) {
        expect(ex.errors[2].empty(), "rank 2's real descriptor: " + ex.errors[2]);
        const std::string got = readAll(ex.fds[2].fd());
        expect(got == textOfRank(2), "the real one kept, got '" + got + "'");
      } else {
        expect(ex.errors[2] == "timed out after 1500 ms waiting for rank 2's descriptor",
               "got '" + ex.errors[2] + "'");
      }
      return "ok";
    });
  }
  procs.spawn([id, thenReal]() -> std::string {
    auto bs = createTcpBootstrap(id, 2, n, 10000);
    fdwire::Listing mine{};
    mine.hasFd = 1;  // not listening: nothing is sent here
    const std::vector<fdwire::Listing> all = bs->allGatherValue(mine);
    const fdwire::Listing& zero = all[0];
    const std::string name(zero.name, strnlen(zero.name, sizeof(zero.name)));
    const Deadline deadline(5000);
    fdwire::FdMessage msg{fdwire::kMagic, 2, {}};
    std::memcpy(msg.token, zero.token, fdwire::kTokenBytes);
    msg.token[3] ^= 0x40;  // the wrong secret
    const int bad = memfdWith("impostor");
    expect(fdwire::sendFd(name, zero.listening == 1, bad, msg, deadline).empty(), "send");
    if (thenReal) {
      msg.token[3] ^= 0x40;
      const int real = memfdWith(textOfRank(2));
      expect(fdwire::sendFd(name, zero.listening == 1, real, msg, deadline).empty(), "send");
    }
    fdwire::SendRow row{};
    row.sent[0] = 1;  // says it sent to rank 0, and why not to rank 1
    std::snprintf(row.error[1], sizeof(row.error[1]), "%s", "played by the test");
    bs->allGatherValue(row);
    return "ok";
  });
  const auto res = procs.waitAll(30000);
  expectAllOk(res);
  EXPECT_LT(res[0].elapsedMs, timeoutMs + 3000) << res[0].describe();
}

TEST(FdExchange, WrongSecretIsIgnoredAndTheRealDescriptorKept) { runImpostor(true); }

TEST(FdExchange, PeerThatSaysItSentAndDidNotTimesOutNamingIt) { runImpostor(false); }

// --- Strangers on the socket ---

// Rank 0 runs the exchange; rank 1 is played by the test: after the first gather it opens
// `strangers` silent connections to rank 0's socket, holding them open until rank 0 is done,
// and then sends its real descriptor. Rank 0 must receive it without waiting out any silent
// connection: rank 1's descriptor neither lost nor rank 1 named.
void runSilentStrangers(int strangers, const char* kind) {
  ScopedEnv k("ANYR_IPC_SOCKET", kind);
  ScopedEnv d("ANYR_IPC_SOCKET_DIR", nullptr);
  const int timeoutMs = 8000;
  const anyrUniqueId id = loopbackId();
  Processes procs;
  procs.spawn([id]() -> std::string {
    auto bs = createTcpBootstrap(id, 0, 2, 10000);
    const int fd = memfdWith(textOfRank(0));
    const Clock::time_point t0 = Clock::now();
    FdExchange ex = exchangeFds(*bs, fd, "", timeoutMs);
    const int64_t ms = msSince(t0);
    bs->barrier();  // the strangers stay connected until here
    expect(ex.errors[1].empty(), "rank 1's descriptor: " + ex.errors[1]);
    const std::string got = readAll(ex.fds[1].fd());
    expect(got == textOfRank(1), "rank 1's text, got '" + got + "'");
    expect(ms < fdwire::kConnectionDeadlineMs + 1500,
           "the exchange took " + std::to_string(ms) + " ms");
    return "ok";
  });
  procs.spawn([id, strangers]() -> std::string {
    auto bs = createTcpBootstrap(id, 1, 2, 10000);
    fdwire::Listing mine{};
    mine.hasFd = 1;  // not listening: rank 0 sends nothing here
    const std::vector<fdwire::Listing> all = bs->allGatherValue(mine);
    std::vector<Socket> silent;
    const Deadline connecting(3000);
    std::string connectError;
    while (static_cast<int>(silent.size()) < strangers && !connecting.expired()) {
      const int s = connectSilently(all[0]);
      if (s >= 0) {
        silent.emplace_back(s);
      } else if (errno == EAGAIN) {  // the backlog is full: rank 0 does not accept
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      } else {
        connectError = std::strerror(errno);
        break;
      }
    }
    const std::string err = sendAs(1, all[0], memfdWith(textOfRank(1)));
    reportSentToRankZero(*bs, err);
    bs->barrier();
    expect(static_cast<int>(silent.size()) == strangers, "opened " + std::to_string(silent.size()) +
                                                             " of " + std::to_string(strangers) +
                                                             " silent connections " + connectError);
    expect(err.empty(), "the real send: " + err);
    return "ok";
  });
  expectAllOk(procs.waitAll(30000));
}

TEST(FdExchange, SilentConnectionDelaysNobodyAndTheRealDescriptorArrives) {
  runSilentStrangers(1, "path");
  runSilentStrangers(1, "abstract");
}

TEST(FdExchange, ManySilentConnectionsAtOnceDelayNobody) {
  // More than the listen backlog and than the connections a receiver holds at once.
  runSilentStrangers(200, "path");
  runSilentStrangers(200, "abstract");
}

// Rank 0 of two, in a process of `procs`: exchanges descriptors (every wait bounded at 8 s) and
// must get rank 1's real one, whatever else connected meanwhile.
void spawnRankZeroGettingTheRealDescriptor(Processes& procs, const anyrUniqueId& id) {
  procs.spawn([id]() -> std::string {
    auto bs = createTcpBootstrap(id, 0, 2, 10000);
    FdExchange ex = exchangeFds(*bs, memfdWith(textOfRank(0)), "", 8000);
    expect(ex.errors[1].empty(), "rank 1's descriptor: " + ex.errors[1]);
    const std::string got = readAll(ex.fds[1].fd());
    expect(got == textOfRank(1), "the real one kept, got '" + got + "'");
    return "ok";
  });
}

// A stranger that connects and says nothing is closed after its own deadline while the exchange
// goes on; the real descriptor, sent after that, still arrives.
TEST(FdExchange, SilentStrangerIsDroppedAfterItsOwnDeadline) {
  ScopedEnv k("ANYR_IPC_SOCKET", nullptr);
  ScopedEnv d("ANYR_IPC_SOCKET_DIR", nullptr);
  const anyrUniqueId id = loopbackId();
  Processes procs;
  spawnRankZeroGettingTheRealDescriptor(procs, id);
  procs.spawn([id]() -> std::string {
    auto bs = createTcpBootstrap(id, 1, 2, 10000);
    fdwire::Listing mine{};
    mine.hasFd = 1;
    const std::vector<fdwire::Listing> all = bs->allGatherValue(mine);
    Socket silent(connectSilently(all[0]));
    expect(silent.valid(), std::string("connect: ") + std::strerror(errno));
    const Clock::time_point t0 = Clock::now();
    pollfd p{silent.fd(), POLLIN, 0};
    const bool closed = ::poll(&p, 1, 5000) == 1;  // EOF (or a reset) once rank 0 drops it
    const int64_t ms = msSince(t0);
    const std::string err = sendAs(1, all[0], memfdWith(textOfRank(1)));
    reportSentToRankZero(*bs, err);
    expect(closed, "the silent connection was still open after 5000 ms");
    expect(ms >= fdwire::kConnectionDeadlineMs - 100 && ms <= fdwire::kConnectionDeadlineMs + 1500,
           "dropped after " + std::to_string(ms) + " ms, its deadline is " +
               std::to_string(fdwire::kConnectionDeadlineMs) + " ms");
    expect(err.empty(), "the real send: " + err);
    return "ok";
  });
  expectAllOk(procs.waitAll(30000));
}

// Rank 1 is played by the test. Before its real send a process presents rank 1's secret from
// another process: `otherUser` (root only) a process of uid 65534, else a child of the same
// user whose pid is not the one rank 1 published. Rank 0 must refuse it and keep the real one.
void runWrongProcess(bool otherUser, const char* kind) {
  ScopedEnv k("ANYR_IPC_SOCKET", kind);
  ScopedEnv d("ANYR_IPC_SOCKET_DIR", nullptr);
  const anyrUniqueId id = loopbackId();
  Processes procs;
  spawnRankZeroGettingTheRealDescriptor(procs, id);
  procs.spawn([id, otherUser]() -> std::string {
    auto bs = createTcpBootstrap(id, 1, 2, 10000);
    fdwire::Listing mine{};
    mine.hasFd = 1;
    if (!otherUser) {  // else no pid published: only the uid check can refuse the impostor
      mine.pid = static_cast<int32_t>(::getpid());
      mine.pidNs = fdwire::namespaceId("pid");
    }
    const std::vector<fdwire::Listing> all = bs->allGatherValue(mine);
    const bool abstract = all[0].listening == 1;
    const int impostor = memfdWith("impostor");
    const pid_t child = ::fork();
    expect(child >= 0, "fork");
    if (child == 0) {
      if (otherUser && (::setgroups(0, nullptr) != 0 || ::setresgid(65534, 65534, 65534) != 0 ||
                        ::setresuid(65534, 65534, 65534) != 0)) {
        ::_exit(3);
      }
      const std::string err = sendAs(1, all[0], impostor);
      // A path socket's directory keeps another user out before any connection; an abstract
      // name does not, and the receiver must refuse the connection: closed unread, before or
      // after the message went out.
      if (otherUser && !abstract) ::_exit(contains(err, "Permission denied") ? 0 : 2);
      if (otherUser) ::_exit(err.empty() || contains(err, "sendmsg: ") ? 0 : 1);
      ::_exit(err.empty() ? 0 : 1);
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    const std::string err = sendAs(1, all[0], memfdWith(textOfRank(1)));
    reportSentToRankZero(*bs, err);
    expect(WIFEXITED(status) && WEXITSTATUS(status) == 0,
           "the impostor's send, status " + std::to_string(status));
    expect(err.empty(), "the real send: " + err);
    return "ok";
  });
  expectAllOk(procs.waitAll(30000));
}

TEST(FdExchange, ConnectionOfAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a process as another user";
  runWrongProcess(true, "abstract");
  runWrongProcess(true, "path");
}

TEST(FdExchange, ConnectionOfAnotherProcessThanTheRanksIsRefused) {
  runWrongProcess(false, "path");
  runWrongProcess(false, "abstract");
}

// Ranks of two users: each names the other at once (no descriptor could pass), nobody waits.
TEST(FdExchange, RanksOfDifferentUsersAreNamedWithoutWaiting) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a rank as another user";
  ScopedEnv k("ANYR_IPC_SOCKET", nullptr);
  ScopedEnv d("ANYR_IPC_SOCKET_DIR", nullptr);
  const anyrUniqueId id = loopbackId();
  Processes procs;
  for (int r = 0; r < 2; ++r) {
    procs.spawn([id, r]() -> std::string {
      if (r == 1) {
        expect(::setgroups(0, nullptr) == 0 && ::setresgid(65534, 65534, 65534) == 0 &&
                   ::setresuid(65534, 65534, 65534) == 0,
               "becoming uid 65534");
      }
      auto bs = createTcpBootstrap(id, r, 2, 10000);
      FdExchange ex = exchangeFds(*bs, memfdWith(textOfRank(r)), "", 60000);
      const std::string& e = ex.errors[1 - r];
      expect(!ex.fds[1 - r].valid(), "no descriptor passes between users");
      expect(contains(e, "could not send its descriptor here") && contains(e, "uid 65534") &&
                 contains(e, "uid 0"),
             "got '" + e + "'");
      return "ok";
    });
  }
  const auto res = procs.waitAll(30000);
  expectAllOk(res);
  for (const ChildResult& r : res) EXPECT_LT(r.elapsedMs, 10000) << r.describe();
}

TEST(FdExchange, PeerCredentialsOfAnotherUserOrProcessAreRefused) {
  const uid_t me = ::geteuid();
  EXPECT_EQ(fdwire::checkPeerUid(ucred{1234, me, 0}, me), "");
  const std::string other = fdwire::checkPeerUid(ucred{1234, me + 1, 0}, me);
  EXPECT_TRUE(contains(other, "uid " + std::to_string(me + 1)) && contains(other, "pid 1234"))
      << other;

  fdwire::Listing rank{};
  rank.pid = 1234;
  rank.pidNs = 77;
  EXPECT_EQ(fdwire::checkSenderProcess(ucred{1234, me, 0}, rank, 77), "");
  const std::string wrong = fdwire::checkSenderProcess(ucred{1235, me, 0}, rank, 77);
  EXPECT_TRUE(contains(wrong, "1235") && contains(wrong, "1234")) << wrong;
  // Pids of different PID namespaces, or a pid not published, cannot be compared.
  EXPECT_EQ(fdwire::checkSenderProcess(ucred{1235, me, 0}, rank, 78), "");
  EXPECT_EQ(fdwire::checkSenderProcess(ucred{0, me, 0}, rank, 0), "");
  rank.pid = 0;
  EXPECT_EQ(fdwire::checkSenderProcess(ucred{1235, me, 0}, rank, 77), "");
}

TEST(FdExchange, MessageCheckRefusesAWrongSecretAndForeignMessages) {
  uint8_t token[fdwire::kTokenBytes];
  for (int i = 0; i < fdwire::kTokenBytes; ++i) token[i] = static_cast<uint8_t>(17 * i + 3);
  fdwire::FdMessage msg{fdwire::kMagic, 1, {}};
  std::memcpy(msg.token, token, sizeof(token));
  EXPECT_EQ(fdwire::checkMessage(msg, 3, 0, token), "");
  for (int i : {0, 7, fdwire::kTokenBytes - 1}) {  // a wrong first, middle or last byte
    fdwire::FdMessage bad = msg;
    bad.token[i] ^= 0x01;
    EXPECT_EQ(fdwire::checkMessage(bad, 3, 0, token), "wrong secret (claims rank 1)") << i;
  }
  fdwire::FdMessage foreign = msg;
  foreign.magic ^= 1;
  EXPECT_EQ(fdwire::checkMessage(foreign, 3, 0, token),
            "not a descriptor message of this communicator");
  for (int sender : {-1, 0, 3}) {  // out of range, or the receiver itself
    foreign = msg;
    foreign.sender = sender;
    EXPECT_EQ(fdwire::checkMessage(foreign, 3, 0, token),
              "not a descriptor message of this communicator")
        << sender;
  }
}

// --- Path sockets: owner-only, stale ones removed ---

TEST(FdExchange, PathSocketIsOwnerOnlyInAnOwnerOnlyDirectory) {
  char tmpl[] = "/tmp/anyr-fd-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string base = tmpl;
  ASSERT_EQ(::chmod(base.c_str(), 0777), 0);  // a base every user can write, like /tmp
  {
    ScopedEnv k("ANYR_IPC_SOCKET", nullptr);
    ScopedEnv d("ANYR_IPC_SOCKET_DIR", base.c_str());
    const anyrUniqueId id = loopbackId();
    Processes procs;
    procs.spawn([id]() -> std::string {
      auto bs = createTcpBootstrap(id, 0, 2, 10000);
      exchangeFds(*bs, memfdWith(textOfRank(0)), "", 8000);
      return "ok";
    });
    procs.spawn([id, base]() -> std::string {
      auto bs = createTcpBootstrap(id, 1, 2, 10000);
      fdwire::Listing mine{};  // no descriptor, not listening
      const std::vector<fdwire::Listing> all = bs->allGatherValue(mine);
      const std::string name = nameOf(all[0]);
      struct stat sock, dir;
      const bool statted =
          ::lstat(name.c_str(), &sock) == 0 && ::lstat(privateDir(base).c_str(), &dir) == 0;
      bs->allGatherValue(fdwire::SendRow{});
      expect(all[0].listening == 2, "rank 0 listens on a path socket");
      expect(name.rfind(privateDir(base) + "/", 0) == 0, "in " + privateDir(base) + ": " + name);
      expect(statted, "stat " + name);
      expect(S_ISSOCK(sock.st_mode) && (sock.st_mode & 0777) == 0600 && sock.st_uid == ::geteuid(),
             "the socket is 0600, mode " + std::to_string(sock.st_mode & 0777));
      expect(S_ISDIR(dir.st_mode) && (dir.st_mode & 0777) == 0700 && dir.st_uid == ::geteuid(),
             "the directory is 0700, mode " + std::to_string(dir.st_mode & 0777));
      return "ok";
    });
    expectAllOk(procs.waitAll(30000));
  }
  ::rmdir(privateDir(base).c_str());
  EXPECT_EQ(::rmdir(base.c_str()), 0) << base << ": " << std::strerror(errno);
}

TEST(FdExchange, SocketDirectoryIsCreatedTightenedOrRefused) {
  char tmpl[] = "/tmp/anyr-fd-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string base = tmpl;
  const uid_t me = ::geteuid();
  struct stat st;
  // Created 0700.
  const std::string fresh = base + "/fresh";
  EXPECT_EQ(fdwire::prepareSocketDir(fresh, me), "");
  ASSERT_EQ(::lstat(fresh.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  // An existing one of this user, too open: tightened.
  const std::string open = base + "/open";
  ASSERT_EQ(::mkdir(open.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(open.c_str(), 0777), 0);
  EXPECT_EQ(fdwire::prepareSocketDir(open, me), "");
  ASSERT_EQ(::lstat(open.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  // A symbolic link planted at the name: refused, not followed.
  const std::string link = base + "/link";
  ASSERT_EQ(::symlink(fresh.c_str(), link.c_str()), 0);
  const std::string whyLink = fdwire::prepareSocketDir(link, me);
  EXPECT_TRUE(contains(whyLink, "symbolic link") && contains(whyLink, link)) << whyLink;
  // Another user's directory: refused (as if it were another user's, when not root).
  const std::string whyOwner = fdwire::prepareSocketDir(fresh, me + 1);
  EXPECT_TRUE(contains(whyOwner, "belongs to uid " + std::to_string(me)) &&
              contains(whyOwner, fresh))
      << whyOwner;
  ::unlink(link.c_str());
  ::rmdir(open.c_str());
  ::rmdir(fresh.c_str());
  EXPECT_EQ(::rmdir(base.c_str()), 0) << base << ": " << std::strerror(errno);
}

TEST(FdExchange, SocketKindOtherThanPathOrAbstractIsRefusedNamingTheVariable) {
  ScopedEnv k("ANYR_IPC_SOCKET", "tcp");
  expectError([] { fdSocketDir(); }, anyrInvalidArgument, "ANYR_IPC_SOCKET='tcp'",
              "ANYR_IPC_SOCKET=tcp was accepted");
  ScopedEnv a("ANYR_IPC_SOCKET", "abstract");
  EXPECT_EQ(fdSocketDir(), "");
}

// A rank killed in the middle of an exchange leaves its path socket behind; the next exchange
// in that directory removes it and works.
TEST(FdExchange, StaleSocketOfAKilledRankIsRemovedAtTheNextStart) {
  char tmpl[] = "/tmp/anyr-fd-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string base = tmpl;
  ScopedEnv k("ANYR_IPC_SOCKET", nullptr);
  ScopedEnv d("ANYR_IPC_SOCKET_DIR", base.c_str());
  int pidPipe[2];
  ASSERT_EQ(::pipe(pidPipe), 0);
  std::string stale;
  {
    const anyrUniqueId id = loopbackId();
    Processes procs;
    procs.spawn([id, pidPipe]() -> std::string {  // the rank to be killed
      const int32_t pid = static_cast<int32_t>(::getpid());
      expect(::write(pidPipe[1], &pid, sizeof(pid)) == sizeof(pid), "write");
      auto bs = createTcpBootstrap(id, 0, 2, 10000);
      exchangeFds(*bs, memfdWith(textOfRank(0)), "", 20000);
      return "not killed";
    });
    procs.spawn([id, pidPipe]() -> std::string {  // its killer, played as rank 1
      auto bs = createTcpBootstrap(id, 1, 2, 10000);
      const std::vector<fdwire::Listing> all = bs->allGatherValue(fdwire::Listing{});
      int32_t pid = 0;
      expect(::read(pidPipe[0], &pid, sizeof(pid)) == sizeof(pid) && pid > 0, "read");
      expect(::kill(pid, SIGKILL) == 0, "kill");
      expect(all[0].listening == 2, "rank 0 listened on a path socket");
      return nameOf(all[0]);
    });
    const auto res = procs.waitAll(30000);
    ASSERT_TRUE(res[1].finished && res[1].code == 0) << res[1].describe();
    ASSERT_FALSE(res[0].finished) << res[0].describe();
    stale = res[1].message;
  }
  ::close(pidPipe[0]);
  ::close(pidPipe[1]);
  struct stat st;
  ASSERT_EQ(::lstat(stale.c_str(), &st), 0) << "the killed rank's socket " << stale;
  ASSERT_TRUE(S_ISSOCK(st.st_mode));
  {
    const anyrUniqueId id = loopbackId();
    expectAllOk(runTcpRanks(id, 2, 10000, 30000, [](Bootstrap& bs, int r) -> std::string {
      FdExchange ex = exchangeFds(bs, memfdWith(textOfRank(r)), "", 10000);
      return checkAllArrived(ex, r, 2);
    }));
  }
  EXPECT_NE(::lstat(stale.c_str(), &st), 0) << "the stale socket is still there: " << stale;
  const std::string sub = privateDir(base);
  EXPECT_EQ(::rmdir(sub.c_str()), 0) << "sockets left in " << sub << ": " << std::strerror(errno);
  EXPECT_EQ(::rmdir(base.c_str()), 0) << base << ": " << std::strerror(errno);
}

// A socket file bound at `path`; listening when `listen`, else refusing connections. Kept open
// (live) or closed (its file left behind) by the caller.
Socket boundAt(const std::string& path, bool listen) {
  Socket s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  expect(s.valid(), "socket");
  sockaddr_un a;
  const socklen_t len = addressOf(path, false, &a);
  expect(::bind(s.fd(), reinterpret_cast<const sockaddr*>(&a), len) == 0, "bind " + path);
  if (listen) expect(::listen(s.fd(), 4) == 0, "listen");
  return s;
}

void makeOld(const std::string& path) {
  timespec t[2];
  ::clock_gettime(CLOCK_REALTIME, &t[0]);
  t[0].tv_sec -= 2 * fdwire::kStaleProbeAgeSeconds;
  t[1] = t[0];
  expect(::utimensat(AT_FDCWD, path.c_str(), t, AT_SYMLINK_NOFOLLOW) == 0, "utimensat " + path);
}

TEST(FdExchange, StaleSocketsAreRemovedAndLiveOnesLeftAlone) {
  char tmpl[] = "/tmp/anyr-fd-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const uid_t uid = ::geteuid();
  const uint64_t ns = fdwire::namespaceId("pid");
  ASSERT_NE(ns, 0u) << "/proc/self/ns/pid";
  const pid_t dead = ::fork();
  ASSERT_GE(dead, 0);
  if (dead == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  const int alive = static_cast<int>(::getpid());
  auto at = [&](uint64_t pidNs, int pid, int rank, uint32_t nonce) {
    return dir + "/" + fdwire::socketFileName(pidNs, pid, rank, nonce);
  };
  std::vector<Socket> live;
  std::vector<std::string> kept;
  std::vector<std::string> gone;
  // Its process gone, nobody listening: removed.
  gone.push_back(at(ns, dead, 0, 1));
  boundAt(gone.back(), true);
  // Its process gone, but the socket still listens (a descriptor inherited): left alone.
  kept.push_back(at(ns, dead, 1, 2));
  live.push_back(boundAt(kept.back(), true));
  // A live process's, listening: left alone.
  kept.push_back(at(ns, alive, 0, 3));
  live.push_back(boundAt(kept.back(), true));
  // A live process's between bind and listen (refusing): left alone.
  kept.push_back(at(ns, alive, 1, 4));
  live.push_back(boundAt(kept.back(), false));
  // Another PID namespace's (its pid means nothing here), refusing and old: removed.
  gone.push_back(at(ns + 1, 4242, 0, 5));
  boundAt(gone.back(), true);
  makeOld(gone.back());
  // ... refusing but recent (it may be between bind and listen): left alone.
  kept.push_back(at(ns + 1, 4242, 1, 6));
  boundAt(kept.back(), true);
  // ... old but listening: left alone.
  kept.push_back(at(ns + 1, 4242, 2, 7));
  live.push_back(boundAt(kept.back(), true));
  makeOld(kept.back());
  // Not this module's names, or not sockets: left alone.
  kept.push_back(dir + "/other.sock");
  boundAt(kept.back(), true);
  kept.push_back(at(ns, dead, 2, 8));
  Socket plain(::open(kept.back().c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
  ASSERT_TRUE(plain.valid());
  if (uid == 0) {
    // Another user's stale socket: not ours to judge.
    kept.push_back(at(ns, dead, 3, 9));
    boundAt(kept.back(), true);
    ASSERT_EQ(::lchown(kept.back().c_str(), 65534, 65534), 0);
  }

  std::vector<std::string> removed = fdwire::removeStaleSockets(dir, uid, ns);
  std::sort(removed.begin(), removed.end());
  std::vector<std::string> expected;
  for (const std::string& g : gone) expected.push_back(g.substr(dir.size() + 1));
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(removed, expected);
  struct stat st;
  for (const std::string& g : gone) EXPECT_NE(::lstat(g.c_str(), &st), 0) << g;
  for (const std::string& k : kept) {
    EXPECT_EQ(::lstat(k.c_str(), &st), 0) << k;
    ::unlink(k.c_str());
  }
  EXPECT_EQ(::rmdir(dir.c_str()), 0) << dir << ": " << std::strerror(errno);
}

}  // namespace
}  // namespace anyr
