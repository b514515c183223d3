// The descriptor exchange of the virtual-memory transport (transport/fd_exchange.h), across real
// processes: every rank gives a memfd holding its own text and checks, through the descriptors
// it received, every peer's text. Then the failures: a rank without a descriptor, a peer that
// presents the wrong secret, a peer that says it sent and did not (a bounded wait that names
// it), path sockets in a directory (removed afterwards), and a directory too long for a socket.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "core/error.h"
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

TEST(FdExchange, EveryRankReceivesEveryPeersDescriptor) {
  for (int n : {2, 5, 8}) {
    ScopedEnv dir("ANYR_IPC_SOCKET_DIR", nullptr);
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

TEST(FdExchange, PathSocketsInADirectoryAreRemovedAfterwards) {
  char tmpl[] = "/tmp/anyr-fd-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  {
    ScopedEnv d("ANYR_IPC_SOCKET_DIR", (dir + "/").c_str());  // a trailing slash is dropped
    const anyrUniqueId id = loopbackId();
    Processes procs;
    const int n = 3;
    for (int r = 0; r < n; ++r) {
      procs.spawn([id, r]() -> std::string {
        auto bs = createTcpBootstrap(id, r, n, 10000);
        const int fd = memfdWith(textOfRank(r));
        FdExchange ex = exchangeFds(*bs, fd, "", 10000);
        return checkAllArrived(ex, r, n);
      });
    }
    expectAllOk(procs.waitAll(30000));
  }
  EXPECT_EQ(::rmdir(dir.c_str()), 0) << "sockets left in " << dir << ": " << std::strerror(errno);
}

TEST(FdExchange, DirectoryTooLongForASocketPathIsRefusedNamingTheVariable) {
  const std::string longDir = "/tmp/" + std::string(90, 'd');
  ScopedEnv d("ANYR_IPC_SOCKET_DIR", longDir.c_str());
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
  Processes procs;
  for (int r = 0; r < 2; ++r) {
    procs.spawn([id, r]() -> std::string {
      auto bs = createTcpBootstrap(id, r, 2, 10000);
      const int fd = memfdWith(textOfRank(r));
      FdExchange ex = exchangeFds(*bs, fd, "", 10000);
      const std::string& e = ex.errors[1 - r];
      expect(!ex.fds[1 - r].valid(), "no descriptor arrived");
      expect(contains(e, "could not listen") && contains(e, "ANYR_IPC_SOCKET_DIR"), e);
      return "ok";
    });
  }
  const auto res = procs.waitAll(20000);
  expectAllOk(res);
  for (const ChildResult& r : res) EXPECT_LT(r.elapsedMs, 5000) << r.describe();
}

TEST(FdExchange, RankWithoutADescriptorIsNamedAndNobodyWaitsForIt) {
  const int n = 3;
  const anyrUniqueId id = loopbackId();
  Processes procs;
  for (int r = 0; r < n; ++r) {
    procs.spawn([id, r]() -> std::string {
      auto bs = createTcpBootstrap(id, r, n, 10000);
      const int fd = r == 1 ? -1 : memfdWith(textOfRank(r));
      // A long deadline: the ranks must not wait for what cannot come.
      FdExchange ex = exchangeFds(*bs, fd, "cuMemExportToShareableHandle: test", 60000);
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
  }
  const auto res = procs.waitAll(30000);
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

}  // namespace
}  // namespace anyr
